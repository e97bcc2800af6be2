"""Conformance checks for plugin authors: run them in your plugin's test suite.

Every check raises :class:`AssertionError` with a message saying what is wrong (so they read
naturally inside pytest) and returns a small report of what it measured.

* :func:`check_component_spec` -- any spec: valid name, one-line description, parameters
  whose defaults validate, promises, and a factory that accepts the kind's call signature
  with the declared parameters (see :mod:`lipcli.sdk.specs` for the signatures).
* :func:`check_one_lipschitz` -- any map ``f``: empirical l2 Lipschitz checks in float64,
  on random pairs (dense and single-coordinate perturbations at many scales), on pairs
  pushed towards a larger ratio by gradient ascent, and the spectral norm of the full
  Jacobian at random points.  Passing is evidence, not proof: the *proof* is your
  docstring's argument.  A map that is not 1-Lipschitz almost always fails.
* :func:`check_pool_spec` -- a :class:`~lipcli.sdk.specs.PoolSpec`: the factory builds an
  ``nn.Module`` mapping ``(N, C, H, W)`` to ``(N, C/2, H, W)`` (also at ``H = W = 1``, as in
  LipConvnet's last block) with finite outputs and gradients, deterministic in eval mode,
  working in float32 and float64, 1-Lipschitz if it promises ``"1-lipschitz"`` -- as built
  and again with every parameter perturbed (random, large, negative values, a few optimiser
  steps on a random loss: a promise must hold for every value training can reach) --, its
  ``no_weight_decay`` names existing parameters, and its state dict surviving a safetensors round trip into a freshly built module (identical
  outputs: all state is in the state dict).
* :func:`check_activation_spec`, :func:`check_gradient_norm_preserving`,
  :func:`check_head_lipschitz` -- activations and heads (module
  :mod:`lipcli.testing.components`); :func:`check_channel_module` holds the module checks
  pools and activations share.
* :func:`check_model_roundtrip` -- builds a tiny LipConvnet with your component through
  :func:`lipcli.host.models.create_model` (``width=4``), saves it as a lipcli model file, loads it
  back through the plugin registry and checks identical logits.

Example (a plugin's ``tests/test_conformance.py``)::

    from lipcli.testing import check_model_roundtrip, check_pool_spec
    from my_plugin.plugin import lip_pools

    def test_pool_conforms():
        for spec in lip_pools():
            check_pool_spec(spec, channels=8)

    def test_model_file_roundtrip():
        check_model_roundtrip(pool="my-pool")   # plugin installed (entry point)
"""

from __future__ import annotations

import copy
import inspect
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lipcli.sdk.specs import (
    ONE_LIPSCHITZ,
    SPEC_KINDS,
    ComponentSpec,
    DatasetSpec,
    HeadSpec,
    Param,
    PoolSpec,
)

__all__ = [
    "LipschitzReport",
    "PoolCheckReport",
    "RoundtripReport",
    "check_component_spec",
    "check_model_roundtrip",
    "check_one_lipschitz",
    "check_pool_spec",
]

#: characters a component name must not contain (``name:key=value,key=value`` syntax)
_RESERVED_NAME_CHARS = frozenset(":,= \t\n")

#: placeholder positional / keyword arguments per kind, to test factory signatures
_FACTORY_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "conv": ((8, 8, 3, 1), {}),
    "activation": ((8,), {}),
    "pool": ((8,), {}),
    "head": ((8, 10), {}),
    "certificate": ((), {}),
    "arch": ((), dict.fromkeys(
        ("conv", "activation", "pool", "head", "num_classes", "in_channels", "mean", "std")
    )),
    "dataset": (("root", "train"), {"download": False, "augment": False}),
    "loss": ((None,), {}),
}


def _fail(message: str) -> None:
    raise AssertionError(message)


# ---------------------------------------------------------------------------------------------
# specs
# ---------------------------------------------------------------------------------------------
def check_component_spec(spec: ComponentSpec) -> None:
    """Check a spec of any kind (see the module docstring); raise AssertionError if bad."""
    if not isinstance(spec, ComponentSpec):
        _fail(f"expected a lipcli spec object, got {type(spec).__name__}")
    label = f"{spec.kind} {spec.name!r}"
    if SPEC_KINDS.get(spec.kind) is not type(spec):
        _fail(f"{label}: spec class {type(spec).__name__} is not the registered class for "
              f"kind {spec.kind!r}; subclassing spec classes is not supported")
    if not isinstance(spec.name, str) or not spec.name or set(spec.name) & _RESERVED_NAME_CHARS:
        _fail(f"{label}: the name must be a non-empty string without spaces, ':', ',' or '='")
    if not isinstance(spec.description, str) or not spec.description.strip():
        _fail(f"{label}: the description must be a non-empty string")
    if "\n" in spec.description.strip():
        _fail(f"{label}: the description must be one line (it is shown in `lip plugins`)")
    if not isinstance(spec.promises, tuple) or not all(
        isinstance(p, str) and p.strip() for p in spec.promises
    ):
        _fail(f"{label}: promises must be a tuple of non-empty strings, got {spec.promises!r}")
    if not isinstance(spec.params, tuple):
        _fail(f"{label}: params must be a tuple of Param, got {type(spec.params).__name__}")
    for param in spec.params:
        if not isinstance(param, Param):
            _fail(f"{label}: params must be Param objects, got {type(param).__name__}")
        try:
            checked = param.check(param.default)
        except ValueError as exc:
            _fail(f"{label}: the default of parameter {param.name!r} does not validate: {exc}")
        try:
            parsed = param.parse(_as_cli_text(checked))
        except ValueError as exc:
            _fail(f"{label}: parameter {param.name!r}: its default written on the command "
                  f"line does not parse back: {exc}")
        if parsed != checked:
            _fail(f"{label}: parameter {param.name!r}: default {checked!r} parses back as "
                  f"{parsed!r}")
    try:
        defaults = spec.resolve_params()
    except (KeyError, ValueError) as exc:
        _fail(f"{label}: resolve_params() failed: {exc}")
    if isinstance(spec, HeadSpec) and (not isinstance(spec.certificate, str) or not spec.certificate):
        _fail(f"{label}: a head must name its certificate method")
    if isinstance(spec, DatasetSpec):
        _check_dataset_fields(spec, label)
    _check_factory_signature(spec, label, defaults)


def _as_cli_text(value: Any) -> str:
    """How a user would write ``value`` on the command line (``key=value``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _check_dataset_fields(spec: DatasetSpec, label: str) -> None:
    if spec.num_classes is not None and (not isinstance(spec.num_classes, int) or spec.num_classes < 2):
        _fail(f"{label}: num_classes must be None or an integer >= 2")
    if len(spec.image_shape) != 3 or not all(isinstance(s, int) and s > 0 for s in spec.image_shape):
        _fail(f"{label}: image_shape must be (C, H, W) positive integers")
    channels = spec.image_shape[0]
    if len(spec.mean) != channels or len(spec.std) != channels:
        _fail(f"{label}: mean and std need one entry per image channel ({channels})")
    if min(spec.std) <= 0:
        _fail(f"{label}: std must be positive")


def _check_factory_signature(spec: ComponentSpec, label: str, defaults: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(spec.factory)
    except (TypeError, ValueError):  # builtins / C callables: nothing to check
        return
    args, kwargs = _FACTORY_CALLS.get(spec.kind, ((), {}))
    try:
        signature.bind(*args, **kwargs, **defaults)
    except TypeError as exc:
        expected = ", ".join([*(repr(a) for a in args), *(f"{k}=..." for k in (*kwargs, *defaults))])
        _fail(f"{label}: the factory cannot be called as factory({expected}): {exc}")


# ---------------------------------------------------------------------------------------------
# Lipschitz
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LipschitzReport:
    """Largest ratios seen: random pairs, gradient-ascent pairs, Jacobian spectral norms."""

    max_pair_ratio: float
    max_attack_ratio: float
    max_jacobian_norm: float


def _pair_ratios(fn: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    num = (fn(a) - fn(b)).flatten(1).norm(dim=1)
    den = (a - b).flatten(1).norm(dim=1)
    return num / den


def _random_pairs(shape: Sequence[int], count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs at scales 0.1-30 with dense or single-coordinate differences of size 1e-4-10."""
    scales = torch.tensor([0.1, 1.0, 3.0, 30.0], dtype=torch.float64)
    gaps = torch.tensor([1e-4, 1e-2, 0.3, 1.0, 10.0], dtype=torch.float64)
    view = (count, *([1] * len(shape)))
    scale = scales[torch.randint(len(scales), (count,), generator=gen)].view(view)
    gap = gaps[torch.randint(len(gaps), (count,), generator=gen)].view(view)
    a = torch.randn(count, *shape, generator=gen, dtype=torch.float64) * scale
    direction = torch.randn(count, *shape, generator=gen, dtype=torch.float64)
    # half the pairs differ in a single coordinate (local violations are not diluted)
    sparse = torch.zeros(count, math.prod(shape), dtype=torch.float64)
    sparse[torch.arange(count), torch.randint(math.prod(shape), (count,), generator=gen)] = 1.0
    sparse = sparse.view(count, *shape) * torch.randn(count, *view[1:], generator=gen, dtype=torch.float64).sign()
    use_sparse = (torch.arange(count) % 2 == 1).view(view)
    direction = torch.where(use_sparse, sparse, direction)
    direction = direction / direction.flatten(1).norm(dim=1).view(view)
    return a, a + gap * direction


def check_one_lipschitz(
    fn: Callable[[torch.Tensor], torch.Tensor],
    input_shape: Sequence[int],
    *,
    pairs: int = 512,
    attack_steps: int = 25,
    jacobian_points: int = 6,
    jacobian_shape: Sequence[int] | None = None,
    rtol: float = 1e-6,
    seed: int = 0,
    name: str = "the map",
) -> LipschitzReport:
    """Empirically check ``||fn(a) - fn(b)||_2 <= ||a - b||_2`` (per sample, float64).

    ``fn`` maps ``(B, *input_shape)`` float64 tensors to ``(B, ...)``.  Three checks, each
    must stay below ``1 + rtol``:

    1. ``pairs`` random pairs (inputs at scales 0.1-30; differences of size 1e-4-10, half
       dense, half in a single coordinate);
    2. ``attack_steps`` of normalised gradient ascent on the ratio from the 64 worst pairs
       (each point moves by 10 % of the pair's distance per step);
    3. the spectral norm of the full Jacobian at ``jacobian_points`` random points of shape
       ``jacobian_shape`` (default ``input_shape``) -- the gradient-norm test.
    """
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(int(s) for s in input_shape)
    bound = 1.0 + rtol

    with torch.no_grad():
        a, b = _random_pairs(shape, pairs, gen)
        ratios = _pair_ratios(fn, a, b)
    if not torch.isfinite(ratios).all():
        _fail(f"{name}: non-finite output on random inputs")
    worst = int(ratios.argmax())
    max_pair = float(ratios[worst])
    if max_pair > bound:
        _fail(
            f"{name} is not 1-Lipschitz: ||f(a) - f(b)|| / ||a - b|| = {max_pair:.6g} > 1 on a "
            f"random pair (||a|| = {float(a[worst].norm()):.3g}, ||a - b|| = "
            f"{float((a[worst] - b[worst]).norm()):.3g})"
        )

    max_attack = 0.0
    if attack_steps > 0:
        top = ratios.argsort(descending=True)[: min(64, pairs)]
        xa, xb = a[top].clone(), b[top].clone()
        view = (len(top), *([1] * len(shape)))
        for _ in range(attack_steps):
            xa.requires_grad_(True)
            xb.requires_grad_(True)
            r = _pair_ratios(fn, xa, xb)
            if not r.requires_grad:  # output does not depend on the input
                break
            ga, gb = torch.autograd.grad(r.sum(), (xa, xb), allow_unused=True)
            ga = torch.zeros_like(xa) if ga is None else ga
            gb = torch.zeros_like(xb) if gb is None else gb
            with torch.no_grad():
                max_attack = max(max_attack, float(r.max()))
                dist = (xa - xb).flatten(1).norm(dim=1).view(view)
                gnorm = torch.cat((ga.flatten(1), gb.flatten(1)), 1).norm(dim=1).view(view)
                gnorm = torch.where(gnorm > 0, gnorm, torch.ones_like(gnorm))
                xa = (xa + 0.1 * dist * ga / gnorm).detach()
                xb = (xb + 0.1 * dist * gb / gnorm).detach()
        with torch.no_grad():
            max_attack = max(max_attack, float(_pair_ratios(fn, xa, xb).max()))
        if not math.isfinite(max_attack):
            _fail(f"{name}: non-finite output or gradient during the ratio ascent")
        if max_attack > bound:
            _fail(f"{name} is not 1-Lipschitz: gradient ascent on ||f(a) - f(b)|| / ||a - b|| "
                  f"reached {max_attack:.6g} > 1")

    max_jac = 0.0
    jshape = tuple(int(s) for s in (jacobian_shape or shape))
    for i in range(jacobian_points):
        scale = (0.1, 1.0, 3.0, 30.0)[i % 4]
        point = torch.randn(1, *jshape, generator=gen, dtype=torch.float64) * scale
        jac = torch.autograd.functional.jacobian(fn, point)
        jac = jac.reshape(-1, point.numel())
        if not torch.isfinite(jac).all():
            _fail(f"{name}: the Jacobian has non-finite entries at a random point")
        norm = float(torch.linalg.matrix_norm(jac, ord=2))
        max_jac = max(max_jac, norm)
        if norm > bound:
            _fail(f"{name} is not 1-Lipschitz: the Jacobian's spectral norm (largest gradient "
                  f"norm) is {norm:.6g} > 1 at a random point of scale {scale}")
    return LipschitzReport(max_pair, max_attack, max_jac)


# ---------------------------------------------------------------------------------------------
# pools
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolCheckReport:
    """What :func:`check_pool_spec` measured."""

    name: str
    params: dict[str, Any]
    num_parameters: int
    lipschitz: LipschitzReport | None


def _state_roundtrip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Serialise a state dict with safetensors (as lipcli model files do) and read it back."""
    from safetensors.torch import load, save

    clean = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    try:
        blob = save(clean)
    except Exception as exc:  # noqa: BLE001 - safetensors raises various types
        _fail(f"the state dict cannot be stored with safetensors: {exc}")
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
        _fail(f"{label}: a freshly built module does not accept the saved state dict: {exc}")
    fresh.eval()
    with torch.no_grad():
        again = fresh(x)
    if not torch.equal(reference, again):
        _fail(f"{label}: after a safetensors state-dict round trip into a freshly built module "
              f"the output differs (max difference {float((reference - again).abs().max()):.3g}); "
              "keep all state in parameters or persistent buffers")

def check_pool_spec(
    spec: PoolSpec,
    channels: int = 8,
    *,
    params: dict[str, Any] | None = None,
    spatial: tuple[int, int] = (3, 3),
    batch: int = 4,
    pairs: int = 512,
    attack_steps: int = 25,
    seed: int = 0,
    rtol: float = 1e-6,
) -> PoolCheckReport:
    """Check a pool spec and the module its factory builds (see the module docstring).

    ``params`` overrides the spec's defaults (validated through the spec).  The Lipschitz
    checks (only if the spec promises ``"1-lipschitz"``) run on a float64 copy of the module
    in eval mode with inputs ``(B, channels, 2, 2)``.
    """
    checked, lip = check_channel_spec(
        spec, PoolSpec, channels, channels // 2, params=params, spatial=spatial, batch=batch,
        pairs=pairs, attack_steps=attack_steps, seed=seed, rtol=rtol,
        rule="a pool must map (N, C, H, W) to (N, C/2, H, W)",
    )
    return PoolCheckReport(
        name=spec.name, params=checked.params, num_parameters=checked.num_parameters,
        lipschitz=lip,
    )


def check_channel_spec(
    spec: ComponentSpec,
    spec_type: type,
    channels: int,
    out_channels: int,
    *,
    params: dict[str, Any] | None,
    spatial: tuple[int, int],
    batch: int,
    pairs: int,
    attack_steps: int,
    seed: int,
    rtol: float,
    rule: str,
) -> tuple["ChannelModuleCheck", LipschitzReport | None]:
    """:func:`check_component_spec`, the spec's type, :func:`check_channel_module` and, if the
    spec promises ``"1-lipschitz"``, :func:`check_one_lipschitz` on the float64 module with
    inputs ``(B, channels, 2, 2)``: the checks pools and activations share."""
    check_component_spec(spec)
    if not isinstance(spec, spec_type):
        _fail(f"expected a {spec_type.__name__}, got {type(spec).__name__}")
    if channels < 2 or channels % 2:
        raise ValueError("channels must be a positive even number")
    checked = check_channel_module(
        spec, channels, out_channels, params=params, spatial=spatial, batch=batch, seed=seed,
        rule=rule,
    )
    lip = None
    if ONE_LIPSCHITZ in spec.promises:
        lip = check_one_lipschitz(
            checked.module64, (channels, 2, 2), pairs=pairs, attack_steps=attack_steps,
            rtol=rtol, seed=seed, name=checked.label,
        )
        # the promise must hold for every parameter value training can reach, not only at
        # initialisation (lipcli.host.promises.perturbed_copies)
        from lipcli.host.promises import perturbed_copies

        for how, moved in perturbed_copies(checked.module64, (channels, 2, 2), seed=seed):
            check_one_lipschitz(moved, (channels, 2, 2), pairs=max(64, pairs // 4),
                                attack_steps=min(attack_steps, 10), jacobian_points=2,
                                rtol=rtol, seed=seed, name=f"{checked.label} with {how}")
    return checked, lip


@dataclass(frozen=True)
class ChannelModuleCheck:
    """What :func:`check_channel_module` built: the float64 eval-mode copy to test further."""

    label: str
    params: dict[str, Any]
    num_parameters: int
    module64: nn.Module


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
        _fail(f"{label}: parameters {params!r} do not validate: {exc}")

    torch.manual_seed(seed)
    module = spec.factory(channels, **resolved)
    if not isinstance(module, nn.Module):
        _fail(f"{label}: the factory must return an nn.Module, got {type(module).__name__}")
    module.eval()
    gen = torch.Generator().manual_seed(seed)

    # shapes, dtypes, finiteness (float32, as in training), also at 1 x 1 spatial size
    for h, w in (spatial, (1, 1)):
        z = torch.randn(batch, channels, h, w, generator=gen)
        with torch.no_grad():
            out = module(z)
        if not isinstance(out, torch.Tensor):
            _fail(f"{label}: forward must return a tensor, got {type(out).__name__}")
        expected = (batch, out_channels, h, w)
        if tuple(out.shape) != expected:
            _fail(f"{label}: maps {tuple(z.shape)} to {tuple(out.shape)}, expected {expected}"
                  + (f"; {rule}" if rule else ""))
        if out.dtype != z.dtype:
            _fail(f"{label}: output dtype {out.dtype} differs from the input dtype {z.dtype}")
        if not torch.isfinite(out).all():
            _fail(f"{label}: non-finite output on standard normal input")

    # determinism in eval mode
    z = torch.randn(batch, channels, *spatial, generator=gen)
    with torch.no_grad():
        first, second = module(z), module(z)
    if not torch.equal(first, second):
        _fail(f"{label}: two eval-mode forward passes on the same input differ "
              f"(max difference {float((first - second).abs().max()):.3g}); it must be deterministic")

    # gradients (train mode): finite for the input and every trainable parameter
    module.train()
    z_grad = (3.0 * torch.randn(batch, channels, *spatial, generator=gen)).requires_grad_(True)
    module.zero_grad(set_to_none=True)
    module(z_grad).square().sum().backward()
    if z_grad.grad is None or not torch.isfinite(z_grad.grad).all():
        _fail(f"{label}: the input gradient is missing or non-finite")
    for pname, p in module.named_parameters():
        if p.requires_grad and p.grad is not None and not torch.isfinite(p.grad).all():
            _fail(f"{label}: the gradient of parameter {pname!r} is non-finite")
    module.zero_grad(set_to_none=True)
    module.eval()

    # no_weight_decay names must exist
    param_names = dict(module.named_parameters())
    for local in getattr(module, "no_weight_decay", ()):
        if local not in param_names:
            _fail(f"{label}: no_weight_decay names {local!r}, which is not a parameter "
                  f"(parameters: {', '.join(param_names) or 'none'})")

    # state dict round trip through safetensors into a fresh module (different RNG state)
    check_state_roundtrip(module, lambda: spec.factory(channels, **resolved), z, label,
                          seed=seed + 12345)

    # float64
    try:
        module64 = copy.deepcopy(module).double().eval()
        with torch.no_grad():
            out64 = module64(z.double())
    except Exception as exc:  # noqa: BLE001
        _fail(f"{label}: the module does not run in float64 (.double()): {type(exc).__name__}: {exc}")
    if out64.dtype != torch.float64:
        _fail(f"{label}: float64 input gave {out64.dtype} output")
    return ChannelModuleCheck(
        label=label, params=resolved,
        num_parameters=sum(p.numel() for p in module.parameters()), module64=module64,
    )


# ---------------------------------------------------------------------------------------------
# model files
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundtripReport:
    """What :func:`check_model_roundtrip` built and compared."""

    config: dict[str, Any]
    num_parameters: int
    logits_shape: tuple[int, ...]


def check_model_roundtrip(
    pool: str = "max",
    *,
    arch: str = "lipconvnet-5",
    conv: str = "soc-fast",
    activation: str = "maxmin",
    head: str = "lln",
    width: int = 4,
    num_classes: int = 10,
    batch: int = 2,
    seed: int = 0,
    refresh_steps: int = 3,
    registry: Any = None,
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
    from lipcli.host.models import create_model, load_model, save_model
    from lipcli.host.plugins import get_registry

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
            _fail(f"model config records {kind} {entry!r}, expected {comp.name!r} with {comp.params!r}")
        if not entry.get("distribution"):
            _fail(f"model config does not record the distribution providing {kind} {comp.name!r}")
    pool_comp = reg.component("pool", pool)
    pool_type = type(pool_comp.build(8 * width))
    if not any(type(m) is pool_type for m in model.modules()):
        _fail(f"the {arch} model contains no {pool_type.__name__} although pool "
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
        _fail(f"logits have shape {tuple(logits.shape)}, expected {(batch, num_classes)}")
    if not torch.isfinite(logits).all():
        _fail("the model produced non-finite logits")

    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "roundtrip.safetensors"
        save_model(model, path)
        loaded, _ = load_model(path, registry=reg)
    if type(loaded) is not type(model):
        _fail(f"load_model rebuilt a {type(loaded).__name__}, expected {type(model).__name__}")
    with torch.no_grad():
        again = loaded(x)
    if not torch.equal(logits, again):
        _fail(f"logits differ after save_model -> load_model (max difference "
              f"{float((logits - again).abs().max()):.3g}); some state is not saved or the "
              "forward pass is not deterministic")
    return RoundtripReport(
        config=config, num_parameters=sum(p.numel() for p in model.parameters()),
        logits_shape=tuple(logits.shape),
    )


# convolution components (their own module: lipcli.testing.conv)
from lipcli.testing.conv import (  # noqa: E402
    ConvCaseReport,
    affine_matrix,
    check_conv_network_bound,
    check_conv_spec,
)

__all__ += ["ConvCaseReport", "affine_matrix", "check_conv_network_bound", "check_conv_spec"]


# activation and head components (their own module: lipcli.testing.components)
from lipcli.testing.components import (  # noqa: E402
    ActivationCheckReport,
    HeadCheckReport,
    check_activation_spec,
    check_gradient_norm_preserving,
    check_head_lipschitz,
    declared_lipschitz_bound,
    installed_plugin_modules,
)

__all__ += [
    "ActivationCheckReport",
    "ChannelModuleCheck",
    "HeadCheckReport",
    "check_activation_spec",
    "check_channel_module",
    "check_channel_spec",
    "check_gradient_norm_preserving",
    "check_head_lipschitz",
    "declared_lipschitz_bound",
    "installed_plugin_modules",
]
