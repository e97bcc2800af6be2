"""The plugin side: spec, hook, lipcli conformance checks, registry, model files, entry point."""

from __future__ import annotations

import pytest
import torch

import lipcli_householder.plugin as plugin
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec
from lipcli.testing import (
    check_activation_spec,
    check_component_spec,
    check_model_roundtrip,
    create_model,
    guaranteed_upper_bound,
    installed_plugin_modules,
    plugin_registry,
)
from lipcli_householder import HouseHolder

DIST = "lipcli-householder"


def _registry():
    return plugin_registry(("householder", plugin))


def test_hook_returns_the_spec():
    (spec,) = plugin.lip_activations()
    assert isinstance(spec, ActivationSpec) and spec.name == "householder"
    assert spec.promises == (ONE_LIPSCHITZ,)
    assert spec.resolve_params() == {"order": 1}
    check_component_spec(spec)


@pytest.mark.parametrize("order", [1, 2])
def test_conformance(order):
    report = check_activation_spec(
        plugin.householder_spec(), channels=8, params={"order": order},
        gradient_norm_preserving=True,
    )
    assert report.lipschitz is not None and report.lipschitz.max_jacobian_norm > 0.999
    assert report.singular_values is not None
    assert report.num_parameters == (4 if order == 1 else 12)


def test_conformance_catches_a_scaled_activation():
    """The conformance check can fail: the same spec with a factory that scales by 1.01."""

    class Scaled(HouseHolder):
        def forward(self, z):
            return 1.01 * super().forward(z)

    spec = ActivationSpec(
        name="householder-scaled", factory=lambda channels, order=1: Scaled(channels, order),
        description="wrong", promises=(ONE_LIPSCHITZ,),
    )
    with pytest.raises(AssertionError, match="not 1-Lipschitz"):
        check_activation_spec(spec, channels=8)


def test_registry_resolves_cli_parameters():
    reg = _registry()
    comp = reg.component("activation", "householder:order=2")
    assert comp.params == {"order": 2}
    assert comp.build(6).order == 2
    for bad in ("householder:order=3", "householder:degree=1"):
        with pytest.raises(LipUsageError):
            reg.component("activation", bad)


@pytest.mark.parametrize("choice", ["householder", "householder:order=2"])
def test_model_file_roundtrip_and_network_bound(tmp_path, choice):
    reg = _registry()
    report = check_model_roundtrip(activation=choice, registry=reg, directory=tmp_path)
    assert report.config["activation"]["name"] == "householder"
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", activation=choice, width=4, registry=reg)
    model.refresh_power_iteration(30)
    rows = {r.name: r for r in guaranteed_upper_bound(model)[1]}
    assert rows["stem_act"].source == "promise" and rows["stem_act"].upper_bound == 1.0


def test_entry_point_when_installed():
    modules = installed_plugin_modules(DIST)
    if modules is None:
        pytest.skip(f"{DIST} is not installed (run the tests against an installed copy)")
    assert list(modules) == ["householder"]
    assert modules["householder"].lip_activations()[0].name == "householder"
