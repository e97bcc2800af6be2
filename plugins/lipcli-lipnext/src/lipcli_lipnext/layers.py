"""LipNeXt's layers on channel-last token grids ``(N, H, W, C)`` (maths and proofs: README).

* :func:`spatial_shift`: the circular shift of five channel groups (up, down, left, right by
  one token, and the rest unshifted): a permutation of the coordinates, norm exactly 1.
* :class:`BetaAbs`: ``|x_i|`` on the first ``⌊βC⌋`` channels, identity on the rest (1-Lipschitz,
  norm preserving).
* :class:`L2Pool`: ``y_c = sqrt(Σ_{h,w} x_{h,w,c}² + ε)`` (1-Lipschitz for every ``ε ≥ 0``).
* :class:`Block`: ``Z = M·Rᵀ·S(R·(X + p)) + b`` (σ is the next body child, :class:`BetaAbs`);
  ``R``, ``M`` declared orthogonal; its GUARANTEED bound ``‖R‖₂²·‖M‖₂`` from the float matrices
  as stored (``isometry_norm_upper_bound``: ``√(1 + ‖XXᵀ − I‖)`` with its rounding errors).
* :class:`Stem`: patchify (a permutation) and a semi-orthogonal (Stiefel) map ``C_in·p² → C``
  plus a bias; bound from the stored matrix the same way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.gram_bounds import isometry_norm_upper_bound
from lipcli.sdk.orthogonal import declare_orthogonal, random_orthogonal
from lipcli.sdk.specs import ONE_LIPSCHITZ

__all__ = ["BetaAbs", "Block", "L2Pool", "Stem", "shift_groups", "spatial_shift"]


def _mul_up(*values: float) -> float:
    out = 1.0
    for v in values:
        out = math.nextafter(out * v, math.inf)
    return out


def shift_groups(channels: int, ratio: float) -> int:
    """Channels per shifted direction: ``⌊ratio·C⌋`` (four directions; the rest stay)."""
    return int(math.floor(ratio * channels + 1e-9))


def spatial_shift(x: Tensor, g: int) -> Tensor:
    """Circular shift of ``(N, H, W, C)``: channels ``[0, g)`` one token up, ``[g, 2g)`` down,
    ``[2g, 3g)`` left, ``[3g, 4g)`` right, the rest unchanged (``torch.roll``: wrap-around)."""
    if g == 0:
        return x
    parts = [torch.roll(x[..., 0:g], -1, 1), torch.roll(x[..., g:2 * g], 1, 1),
             torch.roll(x[..., 2 * g:3 * g], -1, 2), torch.roll(x[..., 3 * g:4 * g], 1, 2), x[..., 4 * g:]]
    return torch.cat(parts, dim=-1)


class Stem(nn.Module):
    """``(N, C_in, H, W) → (N, H/p, W/p, C)``: ``pixel_unshuffle`` by ``p`` (a permutation),
    channel-last, then ``y = Vᵀx + b`` with a row-orthonormal ``V`` ``(d, C)`` when
    ``d = C_in·p² ≤ C`` (an isometry), else ``y = Wx + b`` with a row-orthonormal ``W``
    ``(C, d)`` (a co-isometry); the matrix is declared ``"stiefel"``."""

    lip_promises: tuple[str, ...] = ()

    def __init__(self, in_channels: int, width: int, patch: int) -> None:
        super().__init__()
        self.patch, d = patch, in_channels * patch * patch
        self.tall = d <= width
        shape = (d, width) if self.tall else (width, d)
        self.weight = nn.Parameter(random_orthogonal(*shape))
        self.bias = nn.Parameter(torch.zeros(width))
        declare_orthogonal(self, "weight", "stiefel")

    def forward(self, x: Tensor) -> Tensor:
        t = F.pixel_unshuffle(x, self.patch).permute(0, 2, 3, 1) if self.patch > 1 else x.permute(0, 2, 3, 1)
        W = self.weight.to(t.dtype)
        return (t @ W if self.tall else t @ W.mT) + self.bias.to(t.dtype)

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED: ``‖weight‖₂`` of the float matrix as stored (patchify and bias: 1, 0)."""
        return isometry_norm_upper_bound(self.weight)

    def export_module(self) -> nn.Module:
        from .export import export_stem

        return export_stem(self)


class Block(nn.Module):
    """``Z = M·Rᵀ·S(R·(X + p)) + b`` on ``(N, H, W, C)`` (σ follows as its own child)."""

    lip_promises: tuple[str, ...] = ()

    def __init__(self, width: int, grid: tuple[int, int], shift_ratio: float) -> None:
        super().__init__()
        self.g = shift_groups(width, shift_ratio)
        self.pos = nn.Parameter(torch.zeros(*grid))
        self.R = nn.Parameter(random_orthogonal(width, width))
        self.M = nn.Parameter(random_orthogonal(width, width))
        self.bias = nn.Parameter(torch.zeros(width))
        declare_orthogonal(self, "R")
        declare_orthogonal(self, "M")

    def forward(self, x: Tensor) -> Tensor:
        R, M = self.R.to(x.dtype), self.M.to(x.dtype)
        y = (x + self.pos.to(x.dtype).unsqueeze(-1)) @ R.mT  # R·(X + p) per token
        y = spatial_shift(y, self.g) @ R  # Rᵀ·S(…)
        return y @ M.mT + self.bias.to(x.dtype)

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED: ``‖R‖₂·‖Rᵀ‖₂·‖M‖₂`` of the float matrices as stored (the shift is a
        permutation, ``p`` and ``b`` translations)."""
        r = isometry_norm_upper_bound(self.R)
        return _mul_up(r, r, isometry_norm_upper_bound(self.M))

    def export_module(self) -> nn.Module:
        from .export import export_block

        return export_block(self)


class BetaAbs(nn.Module):
    """``|x_i|`` for the first ``⌊βC⌋`` channels (last dimension), ``x_i`` for the rest."""

    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self, width: int, beta: float) -> None:
        super().__init__()
        self.k = int(math.floor(beta * width + 1e-9))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x[..., :self.k].abs(), x[..., self.k:]], dim=-1)

    def export_module(self) -> nn.Module:
        return self


class L2Pool(nn.Module):
    """``(N, H, W, C) → (N, C)``: ``sqrt(Σ_{h,w} x² + ε)`` per channel (float32 at least)."""

    lip_promises = (ONE_LIPSCHITZ,)

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.eps == 0:  # the norm itself (torch's gradient at 0: 0, a subgradient)
            return torch.linalg.vector_norm(x, dim=(1, 2))
        return torch.sqrt(x.square().sum(dim=(1, 2)) + self.eps)

    def export_module(self) -> nn.Module:
        return self
