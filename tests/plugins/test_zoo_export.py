"""``lip export`` with the plugin zoo: a tiny LipConvnet-5 per installed convolution
(tests/plugin_tables.py, derived from the entry points) is exported through the CLI with its
certificate, the written program is run in a subprocess where lipcli and every plugin are
unimportable (``pt2`` in the fast suite: one conv's program so, the others' checked to call
aten operations only and run in-process), and its logits and radii are compared with
lipcli's own; the example householder activation, polygon pool and ortho head (with the
``margin`` certificate) in one model likewise."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from lipcli.certify import input_radii
from lipcli.testing import (
    create_model,
    get_registry,
    guaranteed_upper_bound,
    installed_components,
    load_model,
    registered,
    run_exported_program,
    run_lip,
    save_model,
)
from plugin_tables import CONVS

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="needs the lipcli[onnx] extra")


@pytest.fixture(scope="module")
def zoo():
    """Every installed plugin in the process-wide registry (``lip export`` runs in-process)."""
    plugins = {(c.plugin, c.module) for kind in ("conv", "activation", "pool", "head")
               for c in installed_components(kind).values()}
    with registered(*sorted(plugins, key=lambda p: p[0])):
        yield


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
    loaded, data = run_exported_program(tmp_path, fmt, exported, images)
    assert loaded == []  # nothing of lipcli loaded
    return [data[f"arr_{i}"] for i in range(len(data.files))]


#: the conv whose ``pt2`` program the fast suite runs in an isolated interpreter; the other
#: convs' programs are checked to call aten operations only (what lets a program run
#: without lipcli and the plugins: that one interpreter shows it) and run in this process
ISOLATED = min(CONVS) if CONVS else None


def run_in_process(exported: Path, images: torch.Tensor) -> list[np.ndarray]:
    program = torch.export.load(str(exported))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    other = [t for t in targets if not (t.startswith("aten.") or "getitem" in t)]
    assert targets and not other, f"the exported graph calls non-aten operations: {other}"
    with torch.no_grad():
        return [t.numpy() for t in program.module()(images)]


def export(model_path: Path, fmt: str, *extra: str) -> dict:
    result = run_lip(["export", str(model_path), "--format", fmt, "--check", "8", "--json", "-q", *extra])
    assert result.exit_code == 0, result.output
    report = result.json()
    assert report["check"]["max_rel_logit_diff"] <= 1e-5
    assert report["check"]["prediction_mismatches"] == 0
    return report


def conv_formats() -> list:
    """Every installed conv in each format: ``pt2`` in the fast suite, ``onnx`` and
    ``torchscript`` in the slow one."""
    params = []
    for conv in sorted(CONVS):
        params.append(pytest.param(conv, "pt2", id=f"{conv}-pt2"))
        params.append(pytest.param(conv, "onnx", id=f"{conv}-onnx", marks=[pytest.mark.slow, needs_onnx]))
        params.append(pytest.param(conv, "torchscript", id=f"{conv}-torchscript", marks=pytest.mark.slow))
    return params


@pytest.mark.parametrize("conv,fmt", conv_formats())
def test_conv_certified_round_trip_without_lipcli(zoo, tmp_path, conv, fmt):
    """A LipConvnet-5 with the conv and the LLN head, exported with its certificate: the
    program's logits equal lipcli's to 1e-5 and its radii are never above ``lip certify``'s
    (input radii from the guaranteed network bound), which they equal up to rounding."""
    model_path = make_model(tmp_path / "m.safetensors", conv=conv)
    report = export(model_path, fmt, "--certify")
    assert report["record"]["config"]["conv"]["name"] == conv
    assert report["check"]["max_rel_radius_diff"] <= 1e-5
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    if fmt == "pt2" and conv != ISOLATED:
        logits, radius = run_in_process(Path(report["output"]), images)
    else:
        logits, radius = run_isolated(tmp_path, fmt, Path(report["output"]), images.numpy())
    model, _ = load_model(model_path)
    certifier = get_registry().component("certificate", report["certificate"]).build()
    with torch.no_grad():
        y = model.features(images)
        ref_logits = model.head(y).numpy()
        certifier.prepare(model.head, None)
        result = certifier.certify(model.head, y)
    ref_radius = input_radii(result.radius, guaranteed_upper_bound(model)[0]).numpy()
    assert np.abs(logits - ref_logits).max() <= 1e-5 * np.abs(ref_logits).max()
    assert (logits.argmax(1) == ref_logits.argmax(1)).all()
    assert radius.dtype == np.float64 and (ref_radius > 0).any()
    assert (radius <= ref_radius + 1e-5 * ref_radius.max()).all()
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
