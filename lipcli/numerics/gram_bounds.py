"""Guaranteed operator-norm bounds from Gram matrices, for (almost) orthogonal layers.

:mod:`lipcli.numerics.spectral` certifies the norm of *one* matrix (with the verified
``λ_max`` engine :mod:`lipcli.numerics.eigen`: Lanczos, then a verified Cholesky
factorisation); this module adds two cheaper verified bounds for the cases where a layer is
orthogonal up to rounding, so that its Gram matrix is the identity up to a tiny defect.  They
use the same rounding model and constants (``u = 2⁻⁵³``, Higham's ``γ_n``,
:mod:`lipcli.numerics.rounding`): the returned number is *provably* at least the quantity it
bounds, for the exact real (or complex) operator whose entries are the given
floating-point numbers, including every rounding committed while computing the bound.

:func:`conv_gram_norm_upper_bound` (convolutions, any padding)
    For a filter ``K`` of shape ``(o, i, kh, kw)`` let ``P`` be the convolution with zero
    "same" padding, the full convolution, or the *circular* convolution on a torus of any
    size.  Each of them is ``Π C E`` with ``E`` an isometric zero embedding, ``Π`` a
    coordinate projection and ``C`` a circular convolution on a large enough torus (for the
    circular case ``Π = E = I``), so ``‖P‖² ≤ ‖CᵀC‖``.  ``CᵀC`` is the circular convolution
    with the Gram filter ``G[i, j, δ] = Σ_{o,a} K[o, i, a]·K[o, j, a + δ]``
    (``δ ∈ [1−kh, kh−1] × [1−kw, kw−1]``; on a small torus offsets alias, i.e. some terms
    are merged, which the triangle inequality below absorbs).  Three bounds, all valid:

    * ``β₁ = max_i Σ_j A_ij w_j / w_i`` for any ``w > 0``, ``A_ij = Σ_δ |G[i, j, δ]|``
      (weighted Schur test on the symmetric ``CᵀC``: its norm is at most the Perron root
      of ``A``; with ``w = 1`` this is the largest row sum; the rescaling of Prach &
      Lampert, ECCV 2022, makes the Perron root exactly 1, with ``w = d^{1/2}``);
    * ``1 + β₂``, ``β₂ = max_i Σ_{j,δ} |E[i, j, δ]|`` with ``E = G − I·[δ = 0]`` (the
      same test on ``CᵀC − I``);
    * ``1 + β₃``, ``β₃ = Σ_δ ‖E_δ‖_F``: in the Fourier basis ``CᵀC − I`` is block diagonal
      with blocks ``Σ_δ E_δ ω^{⟨f, δ⟩}``, each of spectral norm ``≤ Σ_δ ‖E_δ‖_F``.

    ``‖P‖ ≤ √min(β₁, 1 + β₂, 1 + β₃)``.  When ``o < i`` the same is done on the output side
    (``P Pᵀ``, filter ``Kᵀ``), which is the identity for filters with orthonormal rows.

    Rounding: ``K`` is cast to float64 exactly.  Every entry of ``Ĝ`` is one dot product of
    length ``N = o·kh·kw`` (missing terms are exact zeros), so
    ``|Ĝ − G| ≤ γ_N Σ|K||K| ≤ γ_N c_i c_j`` with the column norms ``c_i = ‖K[:, i]‖₂``
    (Cauchy–Schwarz); these are added entrywise (to ``|Ê|`` with a relative ``u`` for the
    subtraction of ``I``), and every sum of ``M`` non-negative terms is enlarged by
    ``1 + 2γ_M``.

:func:`isometry_norm_upper_bound` (batches of matrices, real or complex)
    For ``Q`` of shape ``(..., m, n)``: ``max_b ‖Q_b‖₂ ≤ √(1 + max_b ‖B_b − I‖_F)`` with
    ``B = QᴴQ`` (``n ≤ m``) or ``QQᴴ`` (``n > m``), since ``‖Q‖² = ‖B‖ ≤ 1 + ‖B − I‖₂``.
    Each entry of ``B̂`` is one (complex) dot product of length ``q = max(m, n)``; its error
    is at most ``√2·γ_{q+2}·Σ|a||b|`` (Higham, *Accuracy and Stability*, §3.6); we use
    ``16·γ_{q+2}`` (any BLAS blocking or 3M-type complex product is covered), and
    ``Σ_{entries} Σ|a||b| ≤ ‖Q‖_F²`` bounds the Frobenius norm of the error.

Both cost one Gram product (no iteration) and are tight to about the defect itself: for
weights that are orthogonal up to float32 rounding they return ``1 + O(1e-6)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U
from lipcli.numerics.rounding import gamma as _gamma
from lipcli.numerics.rounding import round_up as _round_up

__all__ = ["conv_gram_norm_upper_bound", "isometry_norm_upper_bound", "conv_gram_filter"]


def _up_sum(value: float, terms: int) -> float:
    """``value`` (a float64 sum of ``terms`` non-negative numbers) enlarged to an upper bound
    of the exact sum."""
    return _round_up(value * (1.0 + 2.0 * _gamma(max(terms, 1) + 1)))


def conv_gram_filter(kernel: Tensor) -> Tensor:
    """The Gram filter ``G[i, j, dy, dx] = Σ_{o,a,b} K[o,i,a,b]·K[o,j,a+δy,b+δx]`` (float64,
    shape ``(i, i, 2kh−1, 2kw−1)``, ``δ = (dy − kh + 1, dx − kw + 1)``) from ONE matrix
    product ``MᵀM`` (``M = K`` viewed as ``o × (i·kh·kw)``) whose entries are added per
    offset: each entry of ``G`` is then a sum of ``o·(overlapping taps)`` products, i.e. one
    dot product of length at most ``o·kh·kw`` in some order."""
    K = kernel.detach().to(torch.float64)
    o, i, kh, kw = K.shape
    M = K.reshape(o, i * kh * kw)
    gram = (M.T @ M).view(i, kh, kw, i, kh, kw)
    G = torch.zeros(i, i, 2 * kh - 1, 2 * kw - 1, dtype=torch.float64, device=K.device)
    for a in range(kh):
        for b in range(kw):
            # taps (a, b) of channel i against (a2, b2) of channel j: offset (a2 − a, b2 − b)
            G[:, :, kh - 1 - a : 2 * kh - 1 - a, kw - 1 - b : 2 * kw - 1 - b] += gram[:, a, b]
    return G


def conv_gram_norm_upper_bound(
    kernel: Tensor, *, schur_weights: Tensor | None = None, power_steps: int = 30
) -> float:
    """Guaranteed upper bound on the l2 operator norm of the convolution with ``kernel``
    (``(out, in, kh, kw)``), valid for zero "same" padding, the full convolution and the
    circular convolution on any torus (module docstring: ``√min(β₁, 1 + β₂, 1 + β₃)``).

    ``β₁`` is the weighted Schur test ``max_i (A w)_i / w_i`` with the non-negative channel
    matrix ``A_ij = Σ_δ |G[i, j, δ]|`` (upper bounds of the exact entries) and any positive
    ``w``: the best of ``power_steps`` power-iteration iterates on ``A``, started from
    ``schur_weights`` (input side, e.g. AOL's ``d^{1/2}``, which makes it tight) or ones.
    Without ``schur_weights`` the smaller side of the filter is used."""
    if kernel.dim() != 4:
        raise ValueError(f"expected a 4-D filter, got shape {tuple(kernel.shape)}")
    K = kernel.detach()
    if not bool(torch.isfinite(K).all()):
        raise ValueError("filter has non-finite entries")
    if schur_weights is None and K.shape[0] < K.shape[1]:
        K = K.transpose(0, 1)  # output side: P Pᵀ is the convolution with Kᵀ's Gram filter
    o, i, kh, kw = K.shape
    if K.numel() == 0:
        return 0.0
    G = conv_gram_filter(K)
    n_dot = o * kh * kw
    gam = _gamma(n_dot)
    cols = torch.linalg.vector_norm(K.to(torch.float64).transpose(0, 1).reshape(i, -1), dim=1)
    cols = cols * (1.0 + 2.0 * _gamma(n_dot + 1))  # ≥ the exact column norms
    err = (gam / (1.0 - gam)) * (cols[:, None] * cols[None, :]) * (1.0 + 4.0 * _U)  # (i, j)
    offsets = (2 * kh - 1) * (2 * kw - 1)
    # β₁: weighted Schur test on G itself, A = Σ_δ |G| (entrywise upper bounds)
    A = (G.abs() + err[:, :, None, None]).sum(dim=(2, 3))
    A = A * (1.0 + 2.0 * _gamma(offsets + 1))
    beta1 = _weighted_schur(A, schur_weights, power_steps)
    # E = G − I at δ = 0 (the subtraction rounds by at most u·|result|)
    E = G.clone()
    E[:, :, kh - 1, kw - 1] -= torch.eye(i, dtype=torch.float64, device=G.device)
    absE = E.abs() * (1.0 + _U) + err[:, :, None, None]
    beta2 = _up_sum(float(absE.sum(dim=(1, 2, 3)).max()), i * offsets)
    fro = torch.linalg.vector_norm(absE.flatten(0, 1), dim=0)  # ‖E_δ‖_F per offset (upper)
    fro = fro * (1.0 + 2.0 * _gamma(i * i + 1))
    beta3 = _up_sum(float(fro.sum()), offsets)
    best = min(beta1, _round_up(1.0 + beta2), _round_up(1.0 + beta3))
    return _round_up(math.sqrt(best))


def _weighted_schur(A: Tensor, start: Tensor | None, steps: int) -> float:
    """``min_w max_i (A w)_i / w_i`` over power-iteration iterates ``w > 0`` (each value is
    an upper bound on ``‖A‖₂ ≥ ‖CᵀC‖₂`` for the non-negative symmetric ``A``; Schur test),
    rounded up (``(A w)_i`` is a sum of ``p`` non-negative products)."""
    p = A.shape[0]
    if start is not None and start.numel() == p and bool((start > 0).all()):
        w = start.detach().to(device=A.device, dtype=torch.float64).reshape(-1).clone()
    else:
        w = torch.ones(p, dtype=torch.float64, device=A.device)
    best = math.inf
    for _ in range(max(1, steps)):
        Aw = A @ w
        if not bool((w > 0).all()):
            break
        best = min(best, float((Aw / w).max()))
        w = Aw / Aw.max()
        if not bool((w > 0).all()):
            break
    return _round_up(best * (1.0 + 2.0 * _gamma(p + 2)))


def isometry_norm_upper_bound(Q: Tensor) -> float:
    """Guaranteed upper bound on ``max_b ‖Q_b‖₂`` over a batch ``Q`` of shape ``(..., m, n)``
    (real or complex) that is close to an isometry or co-isometry (module docstring)."""
    if Q.dim() < 2:
        raise ValueError(f"expected a (batch of) matrices, got shape {tuple(Q.shape)}")
    M = Q.detach().resolve_conj()
    M = M.to(torch.complex128) if M.is_complex() else M.to(torch.float64)
    if not bool(torch.isfinite(M).all()):
        raise ValueError("matrix has non-finite entries")
    m, n = M.shape[-2:]
    if M.numel() == 0:
        return 0.0
    M = M.reshape(-1, m, n)
    B = M.mH @ M if n <= m else M @ M.mH
    p, q = min(m, n), max(m, n)
    B.diagonal(dim1=-2, dim2=-1).sub_(1.0)
    defect = torch.linalg.vector_norm(B.flatten(1), dim=1) * (1.0 + _U)  # ‖B̂ − I‖_F, + subtraction
    defect = defect * (1.0 + 2.0 * _gamma(2 * p * p + 1))
    fro2 = torch.linalg.vector_norm(M.flatten(1), dim=1) ** 2 * (1.0 + 2.0 * _gamma(2 * m * n + 2))
    err = 16.0 * _gamma(q + 2) * fro2
    worst = float((defect + err).max())
    return _round_up(math.sqrt(_round_up(1.0 + _round_up(worst))))
