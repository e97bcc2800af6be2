"""Checks of the ``nn.Module`` a component factory builds, shared by the pool, activation and
convolution checks (re-exported by :mod:`lipcli.testing`): :func:`check_channel_spec`,
:func:`check_channel_module` and :func:`check_state_roundtrip`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, ComponentSpec
from lipcli.testing.base import fail, require_equal
from lipcli.testing.lipschitz import LipschitzReport, check_one_lipschitz
from lipcli.testing.specs import check_component_spec
from lipcli.lipschitz.promises import perturbed_copies

__all__ = [
    "ChannelCheckReport", "ChannelModuleCheck", "check_channel_module", "check_channel_spec",
    "check_state_roundtrip",
]


def _state_roundtrip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Serialise a state dict with safetensors (as lipcli model files do) and read it back."""
    from safetensors.torch import load, save

    clean = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    try:
        blob = save(clean)
    except Exception as exc:  # noqa: BLE001 - safetensors raises various types
        fail(f"the state dict cannot be stored with safetensors: {exc}")
    return load(blob)


def check_state_roundtrip(module: nn.Module, build: Any, x: torch.Tensor, label: str, *,
                          seed: int) -> None:
    """``module``'s state dict, saved and loaded through safetensors into ``build()`` (a fresh
    module made under another RNG state), must give bit-identical outputs on ``x``."""
    with torch.no_grad():
        reference = module(x)
    loaded = _state_roundtrip(module.state_dict())
    torch.manual_seed(seed)
    fresh = build()
    try:
        fresh.load_state_dict(loaded, strict=True)
    except RuntimeError as exc:
        fail(f"{label}: a freshly built module does not accept the saved state dict: {exc}")
    fresh.eval()
    with torch.no_grad():
        again = fresh(x)
    require_equal(reference, again, f"{label}: after a safetensors state-dict round trip into "
                  "a freshly built module the output differs",
                  "; keep all state in parameters or persistent buffers")


def check_channel_spec(
    spec: ComponentSpec, spec_type: type, channels: int, out_channels: int, *, rule: str,
    pairs: int = 512, attack_steps: int = 25, seed: int = 0, rtol: float = 1e-6,
    **module_options: Any,
) -> tuple["ChannelModuleCheck", LipschitzReport | None]:
    """:func:`check_component_spec`, the spec's type, :func:`check_channel_module` and, if the
    spec promises ``"1-lipschitz"``, :func:`check_one_lipschitz` on the float64 module with
    inputs ``(B, channels, 2, 2)``: the checks pools and activations share.

    ``module_options`` (``params``: overrides of the spec's defaults, validated through the
    spec; ``spatial`` and ``batch``: the shape of the inputs) go to
    :func:`check_channel_module`; ``pairs``, ``attack_steps`` and ``rtol`` are those of
    :func:`check_one_lipschitz`, which runs on the module as built and again on copies with
    every parameter perturbed (a promise must hold for every value training can reach).  The
    keyword options of :func:`lipcli.testing.check_pool_spec` and
    :func:`lipcli.testing.check_activation_spec` are these (defaults written once, here and
    in :func:`check_channel_module`)."""
    check_component_spec(spec)
    if not isinstance(spec, spec_type):
        fail(f"expected a {spec_type.__name__}, got {type(spec).__name__}")
    if channels < 2 or channels % 2:
        raise ValueError("channels must be a positive even number")
    checked = check_channel_module(spec, channels, out_channels, seed=seed, rule=rule, **module_options)
    lip = None
    if ONE_LIPSCHITZ in spec.promises:
        lip = check_one_lipschitz(
            checked.module64, (channels, 2, 2), pairs=pairs, attack_steps=attack_steps,
            rtol=rtol, seed=seed, name=checked.label,
        )
        # the promise must hold for every parameter value training can reach, not only at
        # initialisation (lipcli.lipschitz.promises.perturbed_copies)

        for how, moved in perturbed_copies(checked.module64, (channels, 2, 2), seed=seed):
            check_one_lipschitz(moved, (channels, 2, 2), pairs=max(64, pairs // 4),
                                attack_steps=min(attack_steps, 10), jacobian_points=2,
                                rtol=rtol, seed=seed, name=f"{checked.label} with {how}")
    return checked, lip


@dataclass(frozen=True)
class ChannelCheckReport:
    """What the checks of a pool or an activation spec measured (the Lipschitz report only
    when the spec promises ``"1-lipschitz"``)."""

    name: str
    params: dict[str, Any]
    num_parameters: int
    lipschitz: LipschitzReport | None


@dataclass(frozen=True)
class ChannelModuleCheck:
    """What :func:`check_channel_module` built: the float64 eval-mode copy to test further."""

    label: str
    params: dict[str, Any]
    num_parameters: int
    module64: nn.Module


def _check_shapes(module: nn.Module, label: str, channels: int, out_channels: int,
                  spatial: tuple[int, int], batch: int, gen: torch.Generator, rule: str) -> None:
    """Shapes, dtypes, finiteness (float32, as in training), also at 1 x 1 spatial size."""
    for h, w in (spatial, (1, 1)):
        z = torch.randn(batch, channels, h, w, generator=gen)
        with torch.no_grad():
            out = module(z)
        if not isinstance(out, torch.Tensor):
            fail(f"{label}: forward must return a tensor, got {type(out).__name__}")
        expected = (batch, out_channels, h, w)
        if tuple(out.shape) != expected:
            fail(f"{label}: maps {tuple(z.shape)} to {tuple(out.shape)}, expected {expected}"
                 + (f"; {rule}" if rule else ""))
        if out.dtype != z.dtype:
            fail(f"{label}: output dtype {out.dtype} differs from the input dtype {z.dtype}")
        if not torch.isfinite(out).all():
            fail(f"{label}: non-finite output on standard normal input")


def _check_gradients(module: nn.Module, label: str, channels: int, spatial: tuple[int, int],
                     batch: int, gen: torch.Generator) -> None:
    """Gradients (train mode): finite for the input and every trainable parameter."""
    module.train()
    z_grad = (3.0 * torch.randn(batch, channels, *spatial, generator=gen)).requires_grad_(True)
    module.zero_grad(set_to_none=True)
    module(z_grad).square().sum().backward()
    if z_grad.grad is None or not torch.isfinite(z_grad.grad).all():
        fail(f"{label}: the input gradient is missing or non-finite")
    for pname, p in module.named_parameters():
        if p.requires_grad and p.grad is not None and not torch.isfinite(p.grad).all():
            fail(f"{label}: the gradient of parameter {pname!r} is non-finite")
    module.zero_grad(set_to_none=True)
    module.eval()


def _check_no_weight_decay(module: nn.Module, label: str) -> None:
    """``no_weight_decay`` names must exist."""
    param_names = dict(module.named_parameters())
    for local in getattr(module, "no_weight_decay", ()):
        if local not in param_names:
            fail(f"{label}: no_weight_decay names {local!r}, which is not a parameter "
                 f"(parameters: {', '.join(param_names) or 'none'})")


def _run_float64(module: nn.Module, z: torch.Tensor, label: str) -> nn.Module:
    """A float64 copy of ``module`` (eval mode), checked to run and to give float64 output."""
    try:
        module64 = copy.deepcopy(module).double().eval()
        with torch.no_grad():
            out64 = module64(z.double())
    except Exception as exc:  # noqa: BLE001
        fail(f"{label}: the module does not run in float64 (.double()): {type(exc).__name__}: {exc}")
    if out64.dtype != torch.float64:
        fail(f"{label}: float64 input gave {out64.dtype} output")
    return module64


def check_channel_module(
    spec: ComponentSpec,
    channels: int,
    out_channels: int,
    *,
    params: dict[str, Any] | None = None,
    spatial: tuple[int, int] = (3, 3),
    batch: int = 4,
    seed: int = 0,
    rule: str = "",
) -> ChannelModuleCheck:
    """The checks shared by pools and activations: ``spec.factory(channels, **params)`` is an
    ``nn.Module`` mapping ``(N, channels, H, W)`` to ``(N, out_channels, H, W)`` (also at
    ``1 x 1``) with finite float32 outputs and gradients, deterministic in eval mode, its
    ``no_weight_decay`` names existing parameters, its state dict surviving a safetensors
    round trip into a freshly built module, and running in float64."""
    label = f"{spec.kind} {spec.name!r}"
    try:
        resolved = spec.resolve_params(params)
    except (KeyError, ValueError) as exc:
        fail(f"{label}: parameters {params!r} do not validate: {exc}")

    torch.manual_seed(seed)
    module = spec.factory(channels, **resolved)
    if not isinstance(module, nn.Module):
        fail(f"{label}: the factory must return an nn.Module, got {type(module).__name__}")
    module.eval()
    gen = torch.Generator().manual_seed(seed)

    _check_shapes(module, label, channels, out_channels, spatial, batch, gen, rule)

    # determinism in eval mode
    z = torch.randn(batch, channels, *spatial, generator=gen)
    with torch.no_grad():
        first, second = module(z), module(z)
    require_equal(first, second, f"{label}: two eval-mode forward passes on the same input differ",
                  "; it must be deterministic")

    _check_gradients(module, label, channels, spatial, batch, gen)

    _check_no_weight_decay(module, label)

    # state dict round trip through safetensors into a fresh module (different RNG state)
    check_state_roundtrip(module, lambda: spec.factory(channels, **resolved), z, label,
                          seed=seed + 12345)

    module64 = _run_float64(module, z, label)
    return ChannelModuleCheck(
        label=label, params=resolved,
        num_parameters=sum(p.numel() for p in module.parameters()), module64=module64,
    )
