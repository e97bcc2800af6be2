"""Model-file round trip with a component (re-exported by :mod:`lipcli.testing`):
:func:`check_model_roundtrip`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lipcli.testing.base import fail, require_equal
from lipcli.host.defaults import DEFAULT_COMPONENTS
from lipcli.host.plugins import Registry, get_registry
from lipcli.host.models import create_model, load_model, save_model

__all__ = ["RoundtripReport", "check_model_roundtrip"]


@dataclass(frozen=True)
class RoundtripReport:
    """What :func:`check_model_roundtrip` built and compared."""

    config: dict[str, Any]
    num_parameters: int
    logits_shape: tuple[int, ...]


def check_model_roundtrip(
    pool: str = DEFAULT_COMPONENTS["pool"],
    *,
    arch: str = DEFAULT_COMPONENTS["arch"],
    conv: str = DEFAULT_COMPONENTS["conv"],
    activation: str = DEFAULT_COMPONENTS["activation"],
    head: str = DEFAULT_COMPONENTS["head"],
    width: int = 4,
    num_classes: int = 10,
    batch: int = 2,
    seed: int = 0,
    refresh_steps: int = 3,
    registry: Registry | None = None,
    directory: str | Path | None = None,
) -> RoundtripReport:
    """Build a tiny model with the given components, save, load, compare logits exactly.

    Component names accept inline parameters (``pool="polygon:vertices=8"``).  ``registry``
    defaults to the process-wide one (built-ins plus installed plugins); pass
    ``lipcli.host.plugins.create_host(extra=[("name", plugin_module)]).registry()`` to test a
    plugin that is not installed.  Missing components raise
    :class:`lipcli.sdk.errors.UnknownComponentError` (not an AssertionError: the test setup,
    not the component, is at fault).  Also checks that the model really contains a module
    of the type each non-architecture component's factory builds, that the saved config
    names the component, its parameters and its distribution, and that the logits are
    finite.  ``refresh_steps`` power-iteration steps run before the model is used, as every
    freshly built model needs before evaluation (SPEC §1.2: random unit vectors can give
    a useless spectral-norm estimate).
    """

    reg = registry if registry is not None else get_registry()
    torch.manual_seed(seed)
    model = create_model(
        arch, conv=conv, activation=activation, pool=pool, head=head,
        num_classes=num_classes, registry=reg, width=width,
    )
    config = model.lipcli_config
    choices = {"conv": conv, "activation": activation, "pool": pool, "head": head}
    for kind, choice in choices.items():
        comp = reg.component(kind, choice)
        entry = config.get(kind) or {}
        if entry.get("name") != comp.name or entry.get("params") != comp.params:
            fail(f"model config records {kind} {entry!r}, expected {comp.name!r} with {comp.params!r}")
        if not entry.get("distribution"):
            fail(f"model config does not record the distribution providing {kind} {comp.name!r}")
    pool_comp = reg.component("pool", pool)
    pool_type = type(pool_comp.build(8 * width))
    if not any(type(m) is pool_type for m in model.modules()):
        fail(f"the {arch} model contains no {pool_type.__name__} although pool "
             f"{pool_comp.name!r} was chosen")

    refresh = getattr(model, "refresh_power_iteration", None)
    if refresh_steps > 0 and callable(refresh):
        refresh(refresh_steps)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    in_channels = int(config.get("in_channels", 3))
    height, width_px = config.get("image_size", [32, 32])
    x = torch.rand(batch, in_channels, int(height), int(width_px), generator=gen)
    with torch.no_grad():
        logits = model(x)
    if tuple(logits.shape) != (batch, num_classes):
        fail(f"logits have shape {tuple(logits.shape)}, expected {(batch, num_classes)}")
    if not torch.isfinite(logits).all():
        fail("the model produced non-finite logits")

    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "roundtrip.safetensors"
        save_model(model, path)
        loaded, _ = load_model(path, registry=reg)
    if type(loaded) is not type(model):
        fail(f"load_model rebuilt a {type(loaded).__name__}, expected {type(model).__name__}")
    with torch.no_grad():
        again = loaded(x)
    require_equal(logits, again, "logits differ after save_model -> load_model",
                  "; some state is not saved or the forward pass is not deterministic")
    return RoundtripReport(
        config=config, num_parameters=sum(p.numel() for p in model.parameters()),
        logits_shape=tuple(logits.shape),
    )
