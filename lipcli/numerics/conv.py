"""Convolution filters as matrices: the four reshapes and the guaranteed operator-norm bound
built on them (SPEC §1.2, §5).

For a filter ``K`` of shape ``(out, in, kh, kw)`` the operator norm of the zero-padded "same"
convolution obeys ``‖conv_K‖₂ ≤ √(kh·kw) · min_r ‖R_r(K)‖₂`` over the four reshapes ``R_r``
(:func:`conv_reshape`), Singla & Feizi, *Fantastic Four* (NeurIPS 2021).  Each ``‖R_r‖₂`` is
bounded from above by :func:`lipcli.numerics.spectral.spectral_norm_upper_bound` (verified,
rounding included); ``√(kh·kw)`` is rounded up by ``1 + 2u`` and the product by ``1 + 1e-12``
(:mod:`lipcli.numerics.rounding`).

Tightness is purpose driven: :func:`conv_spectral_norm_upper_bound` certifies the cheapest
reshape among those whose estimated norm is within ``select_rtol`` of the smallest, and another
only if it could still improve the bound by more than that.  (The tradeoff: a looser ``b``
costs nothing for 1×1 SOC layers, where ``b ≈ 1`` makes the series tail ``b¹⁵/15!``
negligible, and only a few times ``1e-5`` in the Lipschitz bound of a 3×3 layer with
``b ≈ 3``.)  Estimates (power iteration) only order and seed the certified bounds.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from lipcli.numerics.rounding import SCALAR_MARGIN, UNIT_ROUNDOFF
from lipcli.numerics.spectral import spectral_norm_upper_bound

__all__ = [
    "CONV_RESHAPES",
    "conv_reshape",
    "conv_reshape_matvec",
    "conv_reshape_rmatvec",
    "conv_reshape_shape",
    "conv_spectral_norm_upper_bound",
]

#: Number of reshapes of a convolution filter used by SOC (SPEC §1.2).
CONV_RESHAPES = 4

# Einsum subscripts for M v and M^T u of the four reshapes of a filter K[o, i, a, b]:
#   0: rows (o, a) x cols (i, b)     1: rows (o, b) x cols (i, a)
#   2: rows o x cols (i, a, b)       3: rows (o, a, b) x cols i
_MATVEC = ("oiab,ib->oa", "oiab,ia->ob", "oiab,iab->o", "oiab,i->oab")
_RMATVEC = ("oiab,oa->ib", "oiab,ob->ia", "oiab,o->iab", "oiab,oab->i")


def conv_reshape_shape(kernel_shape: Sequence[int], which: int) -> tuple[int, int]:
    """``(rows, cols)`` of reshape ``which`` ∈ {0, 1, 2, 3} of a filter ``(out, in, kh, kw)``.

    0: ``(out·kh) × (in·kw)``, 1: ``(out·kw) × (in·kh)``, 2: ``out × (in·kh·kw)``,
    3: ``(out·kh·kw) × in`` (SPEC §1.2).
    """
    o, i, kh, kw = (int(s) for s in kernel_shape)
    return ((o * kh, i * kw), (o * kw, i * kh), (o, i * kh * kw), (o * kh * kw, i))[which]


def conv_reshape(kernel: Tensor, which: int) -> Tensor:
    """The reshape ``which`` of ``kernel`` as a contiguous matrix (rows/cols as in
    :func:`conv_reshape_shape`, the channel index always the major one)."""
    o, i, kh, kw = kernel.shape
    if which == 0:
        return kernel.permute(0, 2, 1, 3).reshape(o * kh, i * kw)
    if which == 1:
        return kernel.permute(0, 3, 1, 2).reshape(o * kw, i * kh)
    if which == 2:
        return kernel.reshape(o, i * kh * kw)
    if which == 3:
        return kernel.permute(0, 2, 3, 1).reshape(o * kh * kw, i)
    raise ValueError(f"reshape index must be 0..3, got {which}")


def conv_reshape_matvec(kernel: Tensor, which: int, v: Tensor) -> Tensor:
    """``R_which(kernel) @ v`` (flat vectors) without materialising the reshape."""
    o, i, kh, kw = kernel.shape
    col_shape = ((i, kw), (i, kh), (i, kh, kw), (i,))[which]
    return torch.einsum(_MATVEC[which], kernel, v.view(col_shape)).reshape(-1)


def conv_reshape_rmatvec(kernel: Tensor, which: int, u: Tensor) -> Tensor:
    """``R_which(kernel)ᵀ @ u`` (flat vectors) without materialising the reshape."""
    o, i, kh, kw = kernel.shape
    row_shape = ((o, kh), (o, kw), (o,), (o, kh, kw))[which]
    return torch.einsum(_RMATVEC[which], kernel, u.view(row_shape)).reshape(-1)


def _power_estimate(
    M: Tensor, start: Tensor | None, iters: int, gen: torch.Generator
) -> tuple[float, Tensor, Tensor]:
    """Power-iteration estimate ``(‖M v‖, u, v)`` of ``‖M‖₂`` and its singular vectors (a
    lower estimate up to rounding; used only to order and seed the certified bounds)."""
    rows, cols = M.shape
    if start is not None and start.numel() == cols and bool(torch.isfinite(start).all()):
        v = start.detach().to(device=M.device, dtype=M.dtype).reshape(-1).clone()
    else:
        v = torch.randn(cols, generator=gen, dtype=torch.float64).to(M)
    v = v / torch.linalg.vector_norm(v).clamp_min(1e-30)
    u = torch.mv(M, v)
    for _ in range(iters):
        u = u / torch.linalg.vector_norm(u).clamp_min(1e-30)
        v = torch.mv(M.T, u)
        v = v / torch.linalg.vector_norm(v).clamp_min(1e-30)
        u = torch.mv(M, v)
    est = float(torch.linalg.vector_norm(u))
    return est, u / max(est, 1e-30), v


def conv_spectral_norm_upper_bound(
    kernel: Tensor,
    *,
    rtol: float = 1e-3,
    select_rtol: float | None = None,
    skew: bool = False,
    start_vectors: Sequence[Tensor | None] | None = None,
    estimate_iters: int | None = None,
) -> float:
    """Guaranteed upper bound on the l2 operator norm of the zero-padded "same" convolution
    with ``kernel`` (shape ``(out, in, kh, kw)``), via
    ``√(kh·kw) · min_r ‖R_r(kernel)‖₂`` (SPEC §5) with each ``‖R_r‖₂`` bounded from above by
    :func:`spectral_norm_upper_bound` (tightness ``rtol``).

    Which reshapes get certified is decided by power-iteration estimates (in the kernel's
    own dtype, on materialised reshapes): among the reshapes whose estimate is within
    ``select_rtol`` (default ``rtol``) of the smallest, the cheapest (smallest Gram matrix)
    is certified first; any other reshape only if its estimate shows it could still lower
    the bound by more than ``rtol``.  A larger ``select_rtol`` trades tightness for speed
    (e.g. 0.15 when the bound only feeds the tail ``b^T/T!`` of SPEC §5).

    ``skew=True`` declares ``T(K) = −K`` (checked exactly; ``ValueError`` otherwise).  Then
    ``R_1 = −F R_0ᵀ F`` and ``R_3 = −F₂ R_2ᵀ`` (``F``, ``F₂`` flip the tap indices) have
    the same singular values as ``R_0`` and ``R_2``, so only reshapes 0 and 2 are
    considered.  For 1×1 filters all four reshapes coincide and only one is bounded.

    ``start_vectors`` (one per reshape: right singular vector estimates such as SOC's
    power-iteration buffers) make 2 power steps enough; otherwise ``estimate_iters``
    (default 8) are used.  Estimates affect only speed and tightness, never soundness.
    """
    if kernel.dim() != 4:
        raise ValueError(f"expected a 4-D filter, got shape {tuple(kernel.shape)}")
    K = kernel.detach()
    if not K.is_floating_point():
        K = K.to(torch.float64)
    o, i, kh, kw = K.shape
    if K.numel() == 0:
        return 0.0
    if skew:
        if o != i or kh != kw or not torch.equal(K.transpose(0, 1).flip(2, 3), -K):
            raise ValueError("skew=True but the filter does not satisfy T(K) = -K exactly")
    if kh == 1 and kw == 1:
        which = [0]
    elif skew:
        which = [0, 2]
    else:
        which = [0, 1, 2, 3]
    select = rtol if select_rtol is None else max(select_rtol, rtol)
    iters = estimate_iters if estimate_iters is not None else (2 if start_vectors is not None else 8)
    gen = torch.Generator(device="cpu").manual_seed(0)
    mats = {r: conv_reshape(K, r).contiguous() for r in which}
    estimates = {
        r: _power_estimate(mats[r], start_vectors[r] if start_vectors is not None else None, iters, gen)
        for r in which
    }

    def cost(r: int) -> float:  # flops of the Gram product of reshape r
        rows, cols = conv_reshape_shape(K.shape, r)
        return float(min(rows, cols)) ** 2 * max(rows, cols)

    smallest = min(est for est, _, _ in estimates.values())
    near = sorted((r for r in which if estimates[r][0] <= smallest * (1.0 + select)), key=cost)
    rest = sorted((r for r in which if r not in near), key=lambda r: estimates[r][0])
    best = math.inf
    for r in near[:1] + rest:
        est, u, v = estimates[r]
        if est * (1.0 + select) >= best:
            continue  # certifying r cannot lower the bound by more than select_rtol
        rows, cols = mats[r].shape
        start = u if rows <= cols else v
        bound = spectral_norm_upper_bound(mats[r], rtol=rtol, start=start.to(torch.float64))
        best = min(best, bound)
    root = math.sqrt(kh * kw) * (1.0 + 2.0 * UNIT_ROUNDOFF)
    return root * best * (1.0 + SCALAR_MARGIN)
