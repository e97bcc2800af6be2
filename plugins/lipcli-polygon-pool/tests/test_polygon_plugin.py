"""The plugin side: spec, hook, lipcli conformance checks, registry and entry point."""

from __future__ import annotations

import importlib.metadata as md

import pytest
import torch

import lipcli_polygon_pool.plugin as plugin
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.specs import ONE_LIPSCHITZ, PoolSpec
from lipcli.testing import check_component_spec, check_model_roundtrip, check_pool_spec, plugin_registry
import lipcli_polygon_pool
from lipcli_polygon_pool import PolygonPool

DIST = "lipcli-polygon-pool"


def test_hook_returns_the_polygon_spec():
    specs = plugin.lip_pools()
    assert [s.name for s in specs] == ["polygon"]
    spec = specs[0]
    assert isinstance(spec, PoolSpec) and spec.promises == (ONE_LIPSCHITZ,)
    assert spec.resolve_params() == {"vertices": 6, "radius": 1.0, "learn_center": True}
    check_component_spec(spec)


@pytest.mark.parametrize(
    "params", [{}, {"vertices": 3}, {"vertices": 16, "radius": 0.5}, {"learn_center": False}]
)
def test_conformance(params):
    report = check_pool_spec(plugin.polygon_spec(), channels=8, params=params)
    assert report.lipschitz is not None and report.lipschitz.max_jacobian_norm > 0.999


def test_factory_builds_the_module():
    module = plugin.factory(12, vertices=8)
    assert isinstance(module, PolygonPool)
    assert module(torch.randn(2, 12, 4, 4)).shape == (2, 6, 4, 4)
    assert set(module.no_weight_decay) == {"rho", "center"}
    assert not plugin.factory(4, learn_center=False).center.requires_grad


def _registry():
    return plugin_registry(("polygon", plugin))


def test_registry_resolves_cli_parameters():
    reg = _registry()
    comp = reg.component("pool", "polygon:vertices=8,radius=1.5,learn_center=false")
    assert comp.params == {"vertices": 8, "radius": 1.5, "learn_center": False}
    module = comp.build(8)
    assert module.vertices == 8 and not module.center.requires_grad
    for bad in ("polygon:vertices=2", "polygon:vertices=17", "polygon:corners=5"):
        with pytest.raises(LipUsageError):
            reg.component("pool", bad)


def test_model_file_roundtrip(tmp_path):
    reg = _registry()
    needed = {"arch": "lipconvnet-5", "conv": "soc-fast", "activation": "maxmin", "head": "lln"}
    missing = [n for k, n in needed.items() if n not in reg.names(k)]
    assert not missing, f"lipcli built-ins missing: {', '.join(missing)}"
    report = check_model_roundtrip(pool="polygon:vertices=5", registry=reg, directory=tmp_path)
    assert report.config["pool"]["params"]["vertices"] == 5


def test_entry_point_when_installed():
    try:
        dist = md.distribution(DIST)
    except md.PackageNotFoundError:
        pytest.skip(f"{DIST} is not installed (run the tests against an installed copy)")
    eps = [ep for ep in dist.entry_points if ep.group == "lipcli"]
    assert [(ep.name, ep.value) for ep in eps] == [("polygon", "lipcli_polygon_pool.plugin")]
    assert eps[0].load().lip_pools()[0].name == "polygon"
    assert dist.version == lipcli_polygon_pool.__version__  # defined once, in the package
