"""``lip export`` of a LiResNet (residual blocks, SOC stem/neck/dense layers, LLN head) in the
three formats: the residual block's stand-in equals the block, the written program runs in an
isolated interpreter where lipcli and the plugins cannot be imported, its logits equal
lipcli's to 1e-5 and, with ``--certify``, its radii are at most ``lip certify``'s (the same
guaranteed bound, rounded down)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import lipcli.testing as checks
from lipcli.testing import create_model, get_registry, guaranteed_upper_bound, load_model, run_lip, save_model
from lipcli_liresnet import plugin as liresnet_plugin
from lipcli_liresnet.residual import ResidualConv

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))


@pytest.fixture(scope="module")
def registered():
    with checks.registered(("test-liresnet-export", liresnet_plugin)):
        yield


def test_residual_stand_in():
    block = checks.randomise_parameters(ResidualConv(3, (5, 5)).double().eval(), seed=1)
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    checks.check_export_module(block, type(block.export_module()), x)
    checks.check_export_follows(block, lambda: block.weight.mul_(2.0), x)
    checks.check_aten_program(block.export_module().float(), x.float())


def test_authors_block_stand_in():
    """With γ, the depth factor and centring the stand-in is the evaluation map
    ``x + W_eff ∗ x + (b − running_mean)`` and follows changes of γ."""
    block = ResidualConv(3, (5, 5), gamma=True, scale=0.5, centering=True).double()
    block = checks.randomise_parameters(block, seed=2).eval()
    with torch.no_grad():
        block.running_mean.normal_()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    checks.check_export_module(block, type(block.export_module()), x)
    checks.check_export_follows(block, lambda: block.gamma.mul_(2.0), x)


def make_model(path: Path) -> Path:
    torch.manual_seed(0)
    model = create_model("liresnet", depth=2, width=4, dense=1, num_classes=10)
    with torch.no_grad():
        model.head.weight.mul_(4.0)
        model.eval()(torch.rand(2, 3, 32, 32))
    save_model(model, path, dataset=None)
    return path


@pytest.mark.parametrize("fmt", [
    "pt2", "torchscript",
    pytest.param("onnx", marks=pytest.mark.skipif(not HAS_ONNX, reason="needs the lipcli[onnx] extra")),
])
def test_round_trip_without_lipcli(registered, tmp_path, fmt):
    model_path = make_model(tmp_path / "m.safetensors")
    result = run_lip(["export", str(model_path), "--format", fmt, "--check", "8", "--certify", "--json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["check"]["max_rel_logit_diff"] <= 1e-5 and report["check"]["prediction_mismatches"] == 0
    assert report["record"]["config"]["arch"]["name"] == "liresnet"
    images = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    loaded, data = checks.run_exported_program(tmp_path, fmt, Path(report["output"]), images.numpy())
    assert loaded == []  # nothing of lipcli or the plugins was imported
    logits, radius = data["arr_0"], data["arr_1"]
    model, _ = load_model(model_path)
    certifier = get_registry().component("certificate", "lln").build()
    with torch.no_grad():
        y = model.features(images)
        ref_logits = model.head(y).numpy()
        certifier.prepare(model.head, None)
        cert = certifier.certify(model.head, y)
    bound = guaranteed_upper_bound(model)[0]
    # the export divides by the bound of the operator it runs (lipcli.lowering: dense
    # layers' float32 rounding included), at least the model's guaranteed bound and within 1e-6 of it
    recorded = report["record"]["lipschitz"]["upper_bound"]
    assert bound <= recorded <= bound * (1 + 1e-6)
    assert bound > 4.0  # 1/min std and the residual blocks' bounds (> 1), not just promises
    ref_radius = (cert.radius / bound).numpy()
    assert np.abs(logits - ref_logits).max() <= 1e-5 * np.abs(ref_logits).max()
    assert (ref_radius > 0).any() and (radius >= 0).all()
    # at most lip certify's radius, up to the float32 rounding of the features (which differ
    # between the exported program's kernels and lipcli's by ~1e-7 of their norm)
    assert (radius <= ref_radius + 1e-5 * ref_radius.max()).all()
    np.testing.assert_allclose(radius, ref_radius, rtol=0, atol=1e-5 * ref_radius.max())
