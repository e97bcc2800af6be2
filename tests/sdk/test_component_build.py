"""``Component.build`` stamps what it builds: the spec's promises and the component's name."""

from __future__ import annotations

from torch import nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, Component, PoolSpec


class _Pool(nn.Module):
    lip_promises = ("class-level promise that the spec overrides",)

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels


def test_a_built_module_carries_the_specs_promises_and_its_component():
    spec = PoolSpec(name="halves", factory=_Pool, description="a pool", promises=(ONE_LIPSCHITZ,))
    module = Component(spec, {}, provider="my.plugin", distribution="my-dist").build(8)
    assert isinstance(module, _Pool) and module.channels == 8
    assert module.lip_promises == (ONE_LIPSCHITZ,)
    assert module.lip_component == {"kind": "pool", "name": "halves", "provider": "my.plugin",
                                    "distribution": "my-dist"}
    unpromised = Component(PoolSpec(name="plain", factory=_Pool, description="a pool")).build(2)
    assert unpromised.lip_promises == ()


def test_what_is_not_a_module_is_returned_untouched():
    class Thing:
        pass

    thing = Component(PoolSpec(name="thing", factory=lambda c: Thing(), description="x")).build(4)
    assert isinstance(thing, Thing)
    assert not hasattr(thing, "lip_promises") and not hasattr(thing, "lip_component")
