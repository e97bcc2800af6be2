"""Conformance checks for pool, activation and head components (re-exported by
:mod:`lipcli.testing`).

* :func:`check_pool_spec` -- a :class:`~lipcli.sdk.specs.PoolSpec`: the factory builds an
  ``nn.Module`` mapping ``(N, C, H, W)`` to ``(N, C/2, H, W)`` (also at ``H = W = 1``, as in
  LipConvnet's last block) with the checks shared with activations
  (:func:`lipcli.testing.check_channel_module`), 1-Lipschitz if it promises
  ``"1-lipschitz"`` -- as built and again with every parameter perturbed
  (:func:`lipcli.testing.check_channel_spec`).
* :func:`check_activation_spec` -- an :class:`~lipcli.sdk.specs.ActivationSpec`: the factory
  builds an ``nn.Module`` keeping the shape ``(N, C, H, W)`` (also at ``1 x 1``) with the
  checks shared with pools (:func:`lipcli.testing.check_channel_module`: finite outputs and
  gradients, deterministic eval passes, ``no_weight_decay``, safetensors round trip, float64),
  1-Lipschitz (:func:`lipcli.testing.check_one_lipschitz`) if it promises ``"1-lipschitz"``
  and, with ``gradient_norm_preserving=True``, an orthogonal Jacobian
  (:func:`check_gradient_norm_preserving`).
* :func:`check_gradient_norm_preserving` -- any map: every singular value of its dense
  Jacobian at random points is 1 within ``tol`` (``||J^T g|| = ||g||`` for every ``g``).
* :func:`check_head_lipschitz` -- a :class:`~lipcli.sdk.specs.HeadSpec` whose module declares a
  Lipschitz bound (``lipschitz_upper_bound()``, or 1 for the promise ``"1-lipschitz"``):
  the dense Jacobian of the float64 head at random features never exceeds it, and pairs of
  features never give a larger output/input distance ratio.  This is what the generic
  ``margin`` certificate relies on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec, HeadSpec, PoolSpec
from lipcli.testing.base import fail, random_jacobians
from lipcli.testing.modules import ChannelCheckReport, check_channel_spec
from lipcli.testing.specs import check_component_spec

__all__ = [
    "ActivationCheckReport",
    "HeadCheckReport",
    "PoolCheckReport",
    "check_activation_spec",
    "check_gradient_norm_preserving",
    "check_head_lipschitz",
    "check_pool_spec",
    "declared_lipschitz_bound",
    "installed_plugin_modules",
]


# ---------------------------------------------------------------------------------------------
# pools and activations
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolCheckReport(ChannelCheckReport):
    """What :func:`check_pool_spec` measured."""


def check_pool_spec(spec: PoolSpec, channels: int = 8, **options: Any) -> PoolCheckReport:
    """Check a pool spec and the module its factory builds (see the module docstring).

    ``options``: ``params`` (overrides of the spec's defaults), ``spatial``, ``batch``,
    ``pairs``, ``attack_steps``, ``seed``, ``rtol``, as :func:`check_channel_spec` takes them.
    The Lipschitz checks (only if the spec promises ``"1-lipschitz"``) run on a float64 copy
    of the module in eval mode with inputs ``(B, channels, 2, 2)``.
    """
    checked, lip = check_channel_spec(
        spec, PoolSpec, channels, channels // 2,
        rule="a pool must map (N, C, H, W) to (N, C/2, H, W)", **options,
    )
    return PoolCheckReport(
        name=spec.name, params=checked.params, num_parameters=checked.num_parameters,
        lipschitz=lip,
    )


@dataclass(frozen=True)
class ActivationCheckReport(ChannelCheckReport):
    """What :func:`check_activation_spec` measured."""

    singular_values: tuple[float, float] | None  # (min, max) over the Jacobians checked


def check_gradient_norm_preserving(
    fn: Callable[[torch.Tensor], torch.Tensor],
    input_shape: Sequence[int],
    *,
    points: int = 6,
    tol: float = 1e-9,
    seed: int = 0,
    name: str = "the map",
) -> tuple[float, float]:
    """Every singular value of the dense Jacobian of ``fn`` (float64) at ``points`` random
    points of shape ``input_shape`` (scales 0.1-30) lies in ``[1 - tol, 1 + tol]``.

    Returns ``(min, max)`` of the singular values seen; raises AssertionError otherwise.
    Random points avoid a piecewise map's boundaries with probability 1.
    """
    gen = torch.Generator().manual_seed(seed)
    lo, hi = float("inf"), 0.0
    for scale, jac in random_jacobians(fn, input_shape, points, gen):
        if jac.shape[0] != jac.shape[1]:
            fail(f"{name}: the Jacobian is {tuple(jac.shape)}, not square: a map that changes "
                 "the dimension cannot preserve gradient norms")
        sv = torch.linalg.svdvals(jac)
        lo, hi = min(lo, float(sv.min())), max(hi, float(sv.max()))
        if float((sv - 1).abs().max()) > tol:
            fail(f"{name} is not gradient-norm preserving: Jacobian singular values in "
                 f"[{float(sv.min()):.9g}, {float(sv.max()):.9g}] at a random point of scale "
                 f"{scale} (tolerance {tol:g})")
    return lo, hi


def check_activation_spec(
    spec: ActivationSpec,
    channels: int = 8,
    *,
    gradient_norm_preserving: bool = False,
    gnp_tol: float = 1e-9,
    seed: int = 0,
    **options: Any,
) -> ActivationCheckReport:
    """Check an activation spec and its module (see the module docstring).

    ``options``: ``params``, ``spatial``, ``batch``, ``pairs``, ``attack_steps``, ``rtol``, as
    :func:`check_channel_spec` takes them.  The Lipschitz checks (if the spec promises
    ``"1-lipschitz"``) and the gradient-norm check run on a float64 copy in eval mode with
    inputs ``(B, channels, 2, 2)``.
    """
    checked, lip = check_channel_spec(
        spec, ActivationSpec, channels, channels,
        rule="an activation must keep the shape (N, C, H, W)", seed=seed, **options,
    )
    singular = None
    if gradient_norm_preserving:
        singular = check_gradient_norm_preserving(
            checked.module64, (channels, 2, 2), tol=gnp_tol, seed=seed, name=checked.label
        )
    return ActivationCheckReport(
        name=spec.name, params=checked.params, num_parameters=checked.num_parameters,
        lipschitz=lip, singular_values=singular,
    )


# ---------------------------------------------------------------------------------------------
# heads
# ---------------------------------------------------------------------------------------------
def declared_lipschitz_bound(head: nn.Module, promises: Sequence[str] = ()) -> float | None:
    """The l2 Lipschitz bound a head declares for ``features -> logits``:
    ``head.lipschitz_upper_bound()`` when it has one, else 1 when it (or ``promises``)
    promises ``"1-lipschitz"``, else ``None`` (no guaranteed bound)."""
    bound = getattr(head, "lipschitz_upper_bound", None)
    if callable(bound):
        return float(bound())
    if ONE_LIPSCHITZ in (*getattr(head, "lip_promises", ()), *promises):
        return 1.0
    return None


@dataclass(frozen=True)
class HeadCheckReport:
    """What :func:`check_head_lipschitz` measured (``bound``: the larger of the two declared
    bounds, before and after training)."""

    name: str
    bound: float
    max_jacobian_norm: float
    max_pair_ratio: float


def check_head_lipschitz(
    spec: HeadSpec,
    in_features: int = 16,
    num_classes: int = 5,
    *,
    params: dict[str, Any] | None = None,
    points: int = 6,
    pairs: int = 256,
    train_steps: int = 20,
    seed: int = 0,
    rtol: float = 1e-9,
) -> HeadCheckReport:
    """The head's declared bound (:func:`declared_lipschitz_bound`) is at least the spectral
    norm of its float64 Jacobian at random features and every pair ratio
    ``||h(a) - h(b)|| / ||a - b||``.  Checked on the freshly built head and again after
    ``train_steps`` SGD steps on random data (a bound must follow the weights).
    """
    check_component_spec(spec)
    if not isinstance(spec, HeadSpec):
        fail(f"expected a HeadSpec, got {type(spec).__name__}")
    label = f"head {spec.name!r}"
    resolved = spec.resolve_params(params)
    torch.manual_seed(seed)
    head = spec.factory(in_features, num_classes, **resolved)
    if not isinstance(head, nn.Module):
        fail(f"{label}: the factory must return an nn.Module, got {type(head).__name__}")
    gen = torch.Generator().manual_seed(seed)
    max_jac = max_pair = 0.0
    bound = 0.0
    for stage in ("initial", "trained"):
        if stage == "trained" and train_steps > 0:
            _train_randomly(head, in_features, num_classes, train_steps, gen)
        head.eval()
        declared = declared_lipschitz_bound(head, spec.promises)
        if declared is None:
            fail(f"{label} declares no Lipschitz bound: give it lipschitz_upper_bound() or "
                 "promise '1-lipschitz'")
        bound = max(bound, declared)
        head64 = copy.deepcopy(head).double().eval()
        for _scale, jac in random_jacobians(head64, (in_features,), points, gen):
            norm = float(torch.linalg.matrix_norm(jac, ord=2))
            max_jac = max(max_jac, norm)
            if norm > declared * (1 + rtol):
                fail(f"{label} ({stage}): Jacobian spectral norm {norm:.9g} exceeds its "
                     f"declared Lipschitz bound {declared:.9g}")
        with torch.no_grad():
            a = torch.randn(pairs, in_features, generator=gen, dtype=torch.float64) * 3
            b = a + torch.randn(pairs, in_features, generator=gen, dtype=torch.float64)
            ratio = (head64(a) - head64(b)).norm(dim=1) / (a - b).norm(dim=1)
        max_pair = max(max_pair, float(ratio.max()))
        if float(ratio.max()) > declared * (1 + rtol):
            fail(f"{label} ({stage}): ||h(a) - h(b)|| / ||a - b|| = {float(ratio.max()):.9g} "
                 f"exceeds its declared Lipschitz bound {declared:.9g}")
    return HeadCheckReport(spec.name, bound, max_jac, max_pair)


def _train_randomly(
    head: nn.Module, in_features: int, num_classes: int, steps: int, gen: torch.Generator
) -> None:
    head.train()
    opt = torch.optim.SGD([p for p in head.parameters() if p.requires_grad], lr=0.5)
    for _ in range(steps):
        y = torch.randn(32, in_features, generator=gen)
        labels = torch.randint(0, num_classes, (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(y), labels).backward()
        opt.step()


# ---------------------------------------------------------------------------------------------
# distributions
# ---------------------------------------------------------------------------------------------
def installed_plugin_modules(distribution: str) -> dict[str, Any] | None:
    """``{entry-point name: loaded module}`` of an installed distribution's ``lipcli`` entry
    points, or ``None`` when the distribution is not installed (a test then skips)."""
    import importlib.metadata as md

    try:
        dist = md.distribution(distribution)
    except md.PackageNotFoundError:
        return None
    return {ep.name: ep.load() for ep in dist.entry_points if ep.group == "lipcli"}
