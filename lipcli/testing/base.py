"""What the :mod:`lipcli.testing` checks share: how they fail, exact comparisons, and dense
Jacobians at random points of several scales."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

#: scales of the random points the Jacobian checks use, in turn
POINT_SCALES = (0.1, 1.0, 3.0, 30.0)


def fail(message: str) -> None:
    """Raise :class:`AssertionError` with ``message`` (the checks read naturally in pytest)."""
    raise AssertionError(message)


def require_equal(expected: torch.Tensor, actual: torch.Tensor, what: str, hint: str = "") -> None:
    """Fail with ``what (max difference d)hint`` unless the two tensors are equal."""
    if not torch.equal(expected, actual):
        fail(f"{what} (max difference {float((expected - actual).abs().max()):.3g}){hint}")


def random_jacobians(
    fn: Callable[[torch.Tensor], torch.Tensor], shape: Sequence[int], points: int,
    gen: torch.Generator,
) -> Iterator[tuple[float, torch.Tensor]]:
    """``(scale, J)`` at ``points`` random float64 points ``randn(1, *shape) * scale`` (the
    scales :data:`POINT_SCALES` in turn): ``J`` is the dense Jacobian of ``fn`` there, as an
    ``(outputs, inputs)`` matrix."""
    for i in range(points):
        scale = POINT_SCALES[i % len(POINT_SCALES)]
        point = torch.randn(1, *shape, generator=gen, dtype=torch.float64) * scale
        yield scale, torch.autograd.functional.jacobian(fn, point).reshape(-1, point.numel())
