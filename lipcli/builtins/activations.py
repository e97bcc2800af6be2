"""Built-in activation: MaxMin (SPEC §2), a gradient-norm-preserving 1-Lipschitz activation.

For an input ``z`` of shape ``(N, C, ...)`` with ``C`` even, split the channels into halves
``a = z[:, :C/2]`` and ``b = z[:, C/2:]`` and return ``cat(max(a, b), min(a, b))``.

On each pair ``(a_k, b_k)`` the map is either the identity or the swap, hence an isometry of
that pair; where ``a_k = b_k`` both choices give the same value, so it is continuous and
piecewise a permutation: ``||f(u) - f(v)||_2 <= ||u - v||_2`` (in fact every pair's output is
the sorted pair, and sorting is 1-Lipschitz in l2).
"""

from __future__ import annotations

import torch
from torch import nn

from lipcli.hookspecs import hookimpl
from lipcli.specs import ONE_LIPSCHITZ, ActivationSpec


class _PairSort(torch.autograd.Function):
    """``(max(a, b), min(a, b))`` with one comparison; backward routes the gradients by the
    saved boolean mask (two ``where``s) instead of the generic ``maximum``/``minimum``
    backward (which recomputes comparisons and masks for each output). The backward is
    written with differentiable ops, so double backward works too."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        take_a = a >= b
        ctx.save_for_backward(take_a)
        return torch.where(take_a, a, b), torch.where(take_a, b, a)

    @staticmethod
    def backward(ctx, g_max: torch.Tensor, g_min: torch.Tensor):
        (take_a,) = ctx.saved_tensors
        return torch.where(take_a, g_max, g_min), torch.where(take_a, g_min, g_max)


def pair_max_min(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise ``(max(a, b), min(a, b))`` (ties: ``a`` counts as the max)."""
    return _PairSort.apply(a, b)


class MaxMin(nn.Module):
    """``cat(max(a, b), min(a, b))`` over the two channel halves ``a, b`` (SPEC §2)."""

    def __init__(self, channels: int | None = None) -> None:
        super().__init__()
        if channels is not None and channels % 2:
            raise ValueError(f"MaxMin needs an even number of channels, got {channels}")
        self.channels = channels

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z.shape[1]
        if c % 2:
            raise ValueError(f"MaxMin needs an even number of channels, got {c}")
        a, b = z[:, : c // 2], z[:, c // 2 :]
        return torch.cat(pair_max_min(a, b), dim=1)

    def extra_repr(self) -> str:
        return "" if self.channels is None else f"channels={self.channels}"


def _maxmin_factory(channels: int) -> MaxMin:
    return MaxMin(channels)


@hookimpl
def lip_activations() -> list[ActivationSpec]:
    return [
        ActivationSpec(
            name="maxmin",
            factory=_maxmin_factory,
            description="MaxMin: cat(max(a, b), min(a, b)) of the two channel halves",
            promises=(ONE_LIPSCHITZ,),
        )
    ]
