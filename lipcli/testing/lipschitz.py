"""Empirical l2 Lipschitz check of any map (re-exported by :mod:`lipcli.testing`):
:func:`check_one_lipschitz`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lipcli.testing.base import fail, random_jacobians

__all__ = ["LipschitzReport", "check_one_lipschitz"]


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


def _ratio_ascent(
    fn: Callable[[torch.Tensor], torch.Tensor],
    a: torch.Tensor,
    b: torch.Tensor,
    ratios: torch.Tensor,
    attack_steps: int,
    bound: float,
    name: str,
) -> float:
    """Check 2 of :func:`check_one_lipschitz`: gradient ascent on the ratio from the 64 worst
    of the random pairs ``(a, b)``; returns the largest ratio reached."""
    pairs, shape = a.shape[0], tuple(a.shape[1:])
    max_attack = 0.0
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
        fail(f"{name}: non-finite output or gradient during the ratio ascent")
    if max_attack > bound:
        fail(f"{name} is not 1-Lipschitz: gradient ascent on ||f(a) - f(b)|| / ||a - b|| "
             f"reached {max_attack:.6g} > 1")
    return max_attack


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
        fail(f"{name}: non-finite output on random inputs")
    worst = int(ratios.argmax())
    max_pair = float(ratios[worst])
    if max_pair > bound:
        fail(
            f"{name} is not 1-Lipschitz: ||f(a) - f(b)|| / ||a - b|| = {max_pair:.6g} > 1 on a "
            f"random pair (||a|| = {float(a[worst].norm()):.3g}, ||a - b|| = "
            f"{float((a[worst] - b[worst]).norm()):.3g})"
        )

    max_attack = 0.0
    if attack_steps > 0:
        max_attack = _ratio_ascent(fn, a, b, ratios, attack_steps, bound, name)

    max_jac = 0.0
    jshape = tuple(int(s) for s in (jacobian_shape or shape))
    for scale, jac in random_jacobians(fn, jshape, jacobian_points, gen):
        if not torch.isfinite(jac).all():
            fail(f"{name}: the Jacobian has non-finite entries at a random point")
        norm = float(torch.linalg.matrix_norm(jac, ord=2))
        max_jac = max(max_jac, norm)
        if norm > bound:
            fail(f"{name} is not 1-Lipschitz: the Jacobian's spectral norm (largest gradient "
                 f"norm) is {norm:.6g} > 1 at a random point of scale {scale}")
    return LipschitzReport(max_pair, max_attack, max_jac)

