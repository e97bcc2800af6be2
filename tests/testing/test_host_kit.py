"""lipcli.testing.host: ``plugin_registry`` is hermetic, ``registered`` adds a plugin to the
process-wide registry for a block only when it is not there already, ``installed_components``
lists what installed distributions provide (never a built-in), and ``certify_model_file``
runs ``lip certify``'s driver."""

from __future__ import annotations

import types

import pytest
from torch import nn

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ONE_LIPSCHITZ, PoolSpec
from lipcli.testing import (
    certify_model_file,
    create_model,
    get_registry,
    installed_components,
    plugin_registry,
    registered,
    save_model,
)


class Half(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()

    def forward(self, z):
        c = z.shape[1] // 2
        return z[:, :c].maximum(z[:, c:])


def pool_plugin(name: str) -> types.ModuleType:
    module = types.ModuleType(f"{name}_plugin")
    module.lip_pools = hookimpl(lambda: [PoolSpec(name=name, factory=Half, description="max of halves",
                                                  promises=(ONE_LIPSCHITZ,))])
    module.lip_pools.__name__ = "lip_pools"
    return module


def test_plugin_registry_has_the_builtins_and_the_given_plugins_only():
    plugin = pool_plugin("kit-half")
    registry = plugin_registry(("kit-half", plugin))
    assert "kit-half" in registry.names("pool") and "max" in registry.names("pool")
    assert registry.provided("pool", "kit-half").plugin.distribution == "(in-process)"
    assert not [n for n in registry.names("conv") if not registry.provided("conv", n).plugin.builtin]
    assert "kit-half" not in get_registry().names("pool")


def test_registered_adds_for_the_block_and_keeps_what_is_there():
    plugin = pool_plugin("kit-half")
    with registered(("kit-half", plugin)) as registry:
        assert "kit-half" in registry.names("pool") and "kit-half" in get_registry().names("pool")
        with registered(("another-name", plugin)):  # already registered: left as it is
            assert get_registry().provided("pool", "kit-half").plugin.name == "kit-half"
        assert "kit-half" in get_registry().names("pool")
    assert "kit-half" not in get_registry().names("pool")


def test_installed_components_never_lists_a_builtin():
    plugin = pool_plugin("kit-half")
    found = installed_components("pool", plugin_registry(("kit-half", plugin)))
    assert list(found) == ["kit-half"]  # not max, projection, ... (built-ins)
    assert found["kit-half"].module is plugin and found["kit-half"].plugin == "kit-half"


@pytest.mark.parametrize("kind", ["conv", "pool", "activation", "head", "arch", "loss", "certificate"])
def test_installed_components_are_the_entry_points(kind):
    import importlib.metadata as md

    for name, component in installed_components(kind).items():
        assert component.kind == kind and component.spec.name == name
        eps = {ep.name: ep for ep in md.distribution(component.distribution).entry_points if ep.group == "lipcli"}
        assert eps[component.plugin].load() is component.module


def test_certify_model_file_runs_the_driver(tmp_path):
    model = create_model("lipconvnet-5", width=4, num_classes=10)
    path = save_model(model, tmp_path / "m.safetensors", dataset={"name": "digits", "params": {}, "num_classes": 10})
    outcome = certify_model_file(path, radii=[0.0], radius_unit=1.0, limit=4, write=False)
    assert outcome.summary.total == 4 and outcome.summary.sound is True
