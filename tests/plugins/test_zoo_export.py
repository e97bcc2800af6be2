"""``lip export`` with the plugin zoo (plugins/lipcli-aol, -bcop, -cayley, -sll, -bro, -lot,
-householder, -polygon-pool, -ortho-head): a tiny LipConvnet-5 per convolution is exported through the CLI,
the written program is run in a subprocess where lipcli and every plugin are unimportable,
and its logits (and, with ``--certify``, the ``margin`` certificate's radii) are compared with
lipcli's own.  The plugins are registered in-process (their source trees are on the test
path), as in test_conv_plugins.py."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from plugin_export import ISOLATED_RUNNER, run_exported_program  # tests/ helper shared with tests/export
from lipcli.cli import app
from lipcli.lipschitz.bound import guaranteed_upper_bound
from lipcli.host.models import create_model, load_model, save_model
from lipcli.host.plugins import get_registry, register_plugin, unregister_plugin

#: plugin (entry point) name -> (component kind, plugin module)
ZOO = {
    "aol": ("conv", "lipcli_aol.plugin"),
    "bcop": ("conv", "lipcli_bcop.plugin"),
    "cayley": ("conv", "lipcli_cayley.plugin"),
    "sll": ("conv", "lipcli_sll.plugin"),
    "bro": ("conv", "lipcli_bro.plugin"),
    "lot": ("conv", "lipcli_lot.plugin"),
    "householder": ("activation", "lipcli_householder.plugin"),
    "polygon": ("pool", "lipcli_polygon_pool.plugin"),
    "ortho": ("head", "lipcli_ortho_head.plugin"),
}
HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="needs the lipcli[onnx] extra")
runner = CliRunner()


@pytest.fixture(scope="module")
def zoo():
    """Every zoo plugin registered with the process-wide host (unless installed)."""
    added = []
    for name, (kind, module) in ZOO.items():
        if name in get_registry().names(kind):  # the distribution is installed
            continue
        register_plugin(pytest.importorskip(module), f"test-export-{name}")
        added.append(f"test-export-{name}")
    yield
    for name in added:
        unregister_plugin(name)


def make_model(path: Path, *, conv: str, activation: str = "maxmin", pool: str = "max",
               head: str = "lln") -> Path:
    """An untrained LipConvnet-5 of width 4 that has seen one batch (Cayley records its
    image size), head scaled up so that radii are not all 0, saved with lipcli."""
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", conv=conv, activation=activation, pool=pool, head=head,
                         width=4, num_classes=10)
    with torch.no_grad():
        for p in model.head.parameters():
            p.mul_(4.0)
        model.eval()(torch.rand(2, 3, 32, 32))
    save_model(model, path, dataset=None)
    return path


def run_isolated(tmp_path: Path, fmt: str, exported: Path, images: np.ndarray) -> list[np.ndarray]:
    loaded, data = run_exported_program(tmp_path, ISOLATED_RUNNER, fmt, exported, images)
    assert loaded == []  # nothing of lipcli loaded
    return [data[f"arr_{i}"] for i in range(len(data.files))]


def export(model_path: Path, fmt: str, *extra: str) -> dict:
    result = runner.invoke(app, ["export", str(model_path), "--format", fmt, "--check", "8",
                                 "--json", "-q", *extra])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["check"]["max_rel_logit_diff"] <= 1e-5
    assert report["check"]["prediction_mismatches"] == 0
    return report


@pytest.mark.parametrize("conv,fmt", [
    pytest.param("aol", "pt2", id="aol-pt2"),
    pytest.param("bcop", "torchscript", id="bcop-torchscript"),
    pytest.param("cayley", "onnx", id="cayley-onnx", marks=needs_onnx),
    pytest.param("cayley", "pt2", id="cayley-pt2", marks=pytest.mark.slow),
    pytest.param("aol", "onnx", id="aol-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("bcop", "onnx", id="bcop-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("cayley", "torchscript", id="cayley-torchscript", marks=pytest.mark.slow),
    pytest.param("sll", "pt2", id="sll-pt2"),
    pytest.param("sll", "onnx", id="sll-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("sll", "torchscript", id="sll-torchscript", marks=pytest.mark.slow),
])
def test_conv_round_trip_without_lipcli(zoo, tmp_path, conv, fmt):
    model_path = make_model(tmp_path / "m.safetensors", conv=conv)
    report = export(model_path, fmt)
    assert report["record"]["config"]["conv"]["name"] == conv
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    (logits,) = run_isolated(tmp_path, fmt, Path(report["output"]), images.numpy())
    model, _ = load_model(model_path)
    with torch.no_grad():
        ref = model(images).numpy()
    assert np.abs(logits - ref).max() <= 1e-5 * np.abs(ref).max()
    assert (logits.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("conv,fmt", [
    pytest.param("bro", "pt2", id="bro-pt2"),
    pytest.param("lot", "onnx", id="lot-onnx", marks=needs_onnx),
    pytest.param("bro", "onnx", id="bro-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("lot", "pt2", id="lot-pt2", marks=pytest.mark.slow),
    pytest.param("bro", "torchscript", id="bro-torchscript", marks=pytest.mark.slow),
    pytest.param("lot", "torchscript", id="lot-torchscript", marks=pytest.mark.slow),
])
def test_fourier_conv_certified_round_trip(zoo, tmp_path, conv, fmt):
    """BRO and LOT exported with the head's certificate: logits equal lipcli's to 1e-5 and the
    exported radii never exceed lipcli's own (head certificate divided by the guaranteed
    network bound), which they equal to 1e-5."""
    model_path = make_model(tmp_path / "m.safetensors", conv=conv)
    report = export(model_path, fmt, "--certify")
    assert report["record"]["config"]["conv"]["name"] == conv
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    logits, radius = run_isolated(tmp_path, fmt, Path(report["output"]), images.numpy())
    model, _ = load_model(model_path)
    certifier = get_registry().component("certificate", report["certificate"]).build()
    with torch.no_grad():
        y = model.features(images)
        ref_logits = model.head(y).numpy()
        certifier.prepare(model.head, None)
        result = certifier.certify(model.head, y)
    ref_radius = (result.radius / guaranteed_upper_bound(model)[0]).numpy()
    assert np.abs(logits - ref_logits).max() <= 1e-5 * np.abs(ref_logits).max()
    assert (ref_radius > 0).any()
    assert (radius <= ref_radius * (1 + 1e-6) + 1e-12).all()
    np.testing.assert_allclose(radius, ref_radius, rtol=0, atol=1e-5 * ref_radius.max())


@pytest.mark.parametrize("pool,fmt", [
    pytest.param("max", "pt2", id="max-pt2"),
    pytest.param("polygon", "pt2", id="polygon-pt2", marks=pytest.mark.slow),
    pytest.param("polygon", "onnx", id="polygon-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("polygon", "torchscript", id="polygon-torchscript", marks=pytest.mark.slow),
])
def test_householder_polygon_ortho_margin_round_trip(zoo, tmp_path, pool, fmt):
    """The other zoo components in one model, exported with the ``margin`` certificate:
    exported radii equal lipcli's (same float64 arithmetic, same bounds).  The polygon pool
    (about 130 graph nodes per pool, a slow ``torch.export``) only in the slow suite."""
    model_path = make_model(tmp_path / "m.safetensors", conv="aol", activation="householder:order=2",
                            pool=pool, head="ortho")
    report = export(model_path, fmt, "--certify")
    assert report["certificate"] == "margin"
    assert report["record"]["certificate"]["head_lipschitz_source"] == "lipschitz_upper_bound()"
    assert report["check"]["max_rel_radius_diff"] <= 1e-5
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    logits, radius = run_isolated(tmp_path, fmt, Path(report["output"]), images.numpy())

    model, _ = load_model(model_path)
    reg = get_registry()
    certifier = reg.component("certificate", "margin").build()
    with torch.no_grad():
        y = model.features(images)
        ref_logits = model.head(y).numpy()
        certifier.prepare(model.head, None)
        result = certifier.certify(model.head, y)
    ref_radius = (result.radius / guaranteed_upper_bound(model)[0]).numpy()
    assert np.abs(logits - ref_logits).max() <= 1e-5 * np.abs(ref_logits).max()
    assert radius.dtype == np.float64 and (radius >= 0).all() and (ref_radius > 0).any()
    np.testing.assert_allclose(radius, ref_radius, rtol=0, atol=1e-5 * ref_radius.max())


@pytest.mark.parametrize("fmt", [
    pytest.param("pt2", id="sll-lln-pt2"),
    pytest.param("onnx", id="sll-lln-onnx", marks=[pytest.mark.slow, needs_onnx]),
])
def test_sll_lln_certified_round_trip(zoo, tmp_path, fmt):
    """The non-affine SLL convolution with the LLN certificate: exported logits equal lipcli's
    to 1e-5 and exported radii are never above ``lip certify``'s (equal up to rounding)."""
    from lipcli.certify import input_radii

    model_path = make_model(tmp_path / "m.safetensors", conv="sll")
    report = export(model_path, fmt, "--certify")
    assert report["check"]["max_rel_radius_diff"] <= 1e-5
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    logits, radius = run_isolated(tmp_path, fmt, Path(report["output"]), images.numpy())
    model, _ = load_model(model_path)
    certifier = get_registry().component("certificate", "lln").build()
    with torch.no_grad():
        y = model.features(images)
        ref_logits = model.head(y).numpy()
        certifier.prepare(model.head, None)
        result = certifier.certify(model.head, y)
    ref_radius = input_radii(result.radius, guaranteed_upper_bound(model)[0]).numpy()
    assert np.abs(logits - ref_logits).max() <= 1e-5 * np.abs(ref_logits).max()
    assert radius.dtype == np.float64 and (ref_radius > 0).any()
    assert (radius <= ref_radius + 1e-5 * ref_radius.max()).all()
    np.testing.assert_allclose(radius, ref_radius, rtol=0, atol=1e-5 * ref_radius.max())
