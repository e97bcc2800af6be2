"""``ortho`` + ``margin`` through lipcli: registry, model-file round trip, ``lip certify``'s
driver with PGD (0 violations; a wrong head bound is caught), and the entry point."""

from __future__ import annotations

import pytest
import torch

import lipcli_ortho_head.plugin as plugin
from lipcli.testing import (
    certify_model_file,
    check_model_roundtrip,
    create_model,
    installed_plugin_modules,
    load_model,
    plugin_registry,
    save_model,
)

DIGITS = {"name": "digits", "params": {}, "num_classes": 10}
DIST = "lipcli-ortho-head"


@pytest.fixture(scope="module")
def registry():
    return plugin_registry(("ortho", plugin))


@pytest.fixture(scope="module")
def model_file(registry, tmp_path_factory):
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", head="ortho", width=4, registry=registry)
    model.refresh_power_iteration(30)
    with torch.no_grad():  # spread the logits a little so that some radii are useful
        model.head.bias.copy_(torch.linspace(-0.02, 0.02, 10))
    path = tmp_path_factory.mktemp("ortho") / "ortho.safetensors"
    save_model(model, path, dataset=DIGITS)
    return path


def test_model_file_roundtrip(registry, tmp_path):
    report = check_model_roundtrip(head="ortho", registry=registry, directory=tmp_path)
    assert report.config["head"]["name"] == "ortho"


def _certify(model_file, registry, radii, limit=16, **kw):
    return certify_model_file(model_file, registry=registry, radii=radii, radius_unit=1.0, limit=limit,
                              write=False, **kw)


def test_certify_with_attack_finds_no_violation(model_file, registry):
    base = _certify(model_file, registry, [0.0])
    s = base.summary
    assert s.certificate.name == "margin" and s.sound is True
    positive = sorted(float(r) for r in base.radius if r > 0)
    assert positive, "the tiny model certifies nothing; the test would be vacuous"
    eps = [positive[len(positive) // 2], positive[(3 * len(positive)) // 4]]
    out = _certify(model_file, registry, eps, attack=True, attack_steps=10, attack_restarts=1)
    assert out.summary.violations == 0
    for row in out.summary.radii:
        assert row.attacked > 0 and row.violations == 0


def test_a_wrong_head_bound_is_caught_by_the_attack(model_file, registry, monkeypatch):
    """The PGD check can fail: a head claiming L = 1e-3 inflates every radius 1000x."""
    from lipcli_ortho_head.ortho import OrthoHead

    monkeypatch.setattr(OrthoHead, "lipschitz_upper_bound", lambda self: 1e-3)
    out = _certify(model_file, registry, [0.05], limit=6, attack=True, attack_steps=10,
                   attack_restarts=1)
    assert out.summary.violations > 0


def test_margin_equals_lln_on_the_ortho_model(model_file, registry):
    """Where both apply (a linear head with orthonormal rows) the two certificates agree."""
    model, _ = load_model(model_file, registry=registry)
    y = model.features(torch.rand(8, 3, 32, 32))
    margin = plugin.certificate_factory()
    margin.prepare(model.head)
    a = margin.certify(model.head, y)
    b = registry.component("certificate", "lln").build().certify(model.head, y)
    assert torch.equal(a.predictions, b.predictions)
    torch.testing.assert_close(a.radius, b.radius, rtol=1e-6, atol=1e-9)


def test_entry_point_when_installed():
    modules = installed_plugin_modules(DIST)
    if modules is None:
        pytest.skip(f"{DIST} is not installed (run the tests against an installed copy)")
    assert list(modules) == ["ortho"]
    module = modules["ortho"]
    assert module.lip_heads()[0].name == "ortho" and module.lip_certificates()[0].name == "margin"
