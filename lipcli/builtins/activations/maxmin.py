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



class _MaxMinFunction(torch.autograd.Function):
    """``cat(max(a, b), min(a, b))`` of the channel halves ``a, b`` of ``z``.

    Forward: ``maximum``/``minimum`` written straight into the two halves of one output
    (no ``cat``), plus the boolean mask ``a ≥ b`` for the backward.  Backward routes the
    gradient by the mask into one gradient tensor: ``∂a = lerp(g_min, g_max, m)``,
    ``∂b = lerp(g_max, g_min, m)`` with ``m ∈ {0, 1}`` — an exact selection for finite
    gradients (``torch.where`` is several times slower on CPU; a non-finite gradient becomes
    NaN, which training reports).  Outputs keep ``z``'s memory format.  Under
    ``create_graph`` the backward is built from differentiable ops, so double backward
    works too."""

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        h = z.shape[1] // 2
        a, b = z[:, :h], z[:, h:]
        if torch.compiler.is_compiling():  # no out= views inside torch.compile (same values)
            ctx.save_for_backward(a >= b)
            return torch.cat((torch.maximum(a, b), torch.minimum(a, b)), dim=1)
        out = torch.empty_like(z)
        torch.maximum(a, b, out=out[:, :h])
        torch.minimum(a, b, out=out[:, h:])
        ctx.save_for_backward(a >= b)
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (take_a,) = ctx.saved_tensors
        h = take_a.shape[1]
        g_max, g_min = g[:, :h], g[:, h:]
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # create_graph / compiled
            return torch.cat(
                (torch.where(take_a, g_max, g_min), torch.where(take_a, g_min, g_max)), dim=1
            )
        m = take_a.to(g.dtype)
        grad = torch.empty_like(g)
        torch.lerp(g_min, g_max, m, out=grad[:, :h])
        torch.lerp(g_max, g_min, m, out=grad[:, h:])
        return grad


def max_min(z: torch.Tensor) -> torch.Tensor:
    """``cat(max(a, b), min(a, b))`` over the channel halves of ``z`` (ties: ``a`` is the
    max)."""
    return _MaxMinFunction.apply(z)


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
        return max_min(z)

    def extra_repr(self) -> str:
        return "" if self.channels is None else f"channels={self.channels}"

    def export_module(self) -> nn.Module:
        """Plain-torch stand-in for ``lip export`` (:mod:`lipcli.sdk.export`)."""
        return PlainMaxMin()


class PlainMaxMin(nn.Module):
    """MaxMin in plain torch operations (``maximum``, ``minimum``, ``cat``): what ``lip
    export`` writes into the exported program (same values as :class:`MaxMin`)."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        a, b = torch.chunk(z, 2, dim=1)
        return torch.cat((torch.maximum(a, b), torch.minimum(a, b)), dim=1)
