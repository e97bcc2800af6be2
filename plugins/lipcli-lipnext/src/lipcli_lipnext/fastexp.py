"""The maths of the manifold update (LipNeXt §3 as LIPNEXT.md reads it; all in float64).

* :func:`lie_gradient`: the Riemannian gradient of a loss at a row-orthonormal ``X`` (square:
  orthogonal) in the Lie algebra ``so(m)`` under the right action ``X·exp(Ω)``:
  ``A = ½(XᵀG − GᵀX)``.  For every skew ``Ω``, ``d/dt f(X·exp(tΩ))|₀ = ⟨G, XΩ⟩ = ⟨XᵀG, Ω⟩ =
  ⟨A, Ω⟩`` (the symmetric part of ``XᵀG`` is orthogonal to every skew ``Ω``).  Computed as
  ``B − Bᵀ`` of one product, so it is exactly skew in floating point.
* :func:`fast_exp`: the paper's adaptive truncated Taylor series, with the order chosen by
  ``‖U‖_F`` (the largest over a stack): order 2 below 0.05, 3 below 0.25, 4 below 1, the
  exact ``torch.linalg.matrix_exp`` from 1 on.  The truncation error of order ``k`` is at
  most ``‖U‖^{k+1}/(k+1)! · e^{‖U‖}`` (the tail of the series).
* :func:`polar`: the nearest row-orthonormal matrix ``(XXᵀ)^{-1/2} X`` (eigh in float64).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["THRESHOLDS", "fast_exp", "fast_exp_order", "lie_gradient", "polar", "taylor_exp"]

#: (upper end of ‖U‖_F, Taylor order): the paper's thresholds; from the last end on: exact
THRESHOLDS: tuple[tuple[float, int], ...] = ((0.05, 2), (0.25, 3), (1.0, 4))
#: the order label of the exact exponential
EXACT = 0


def lie_gradient(X: Tensor, G: Tensor) -> Tensor:
    """``½(XᵀG − GᵀX)`` for ``X``, ``G`` of shape ``(…, n, m)`` (exactly skew)."""
    B = X.mT @ G
    return 0.5 * (B - B.mT)


def fast_exp_order(U: Tensor) -> int:
    """The Taylor order FastExp uses for ``U`` (``0``: the exact exponential)."""
    norm = float(torch.linalg.matrix_norm(U.detach()).max()) if U.numel() else 0.0
    for edge, order in THRESHOLDS:
        if norm < edge:
            return order
    return EXACT


def taylor_exp(U: Tensor, order: int) -> Tensor:
    """``Σ_{k≤order} U^k/k!`` by Horner's rule (``order`` products)."""
    eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device).expand_as(U)
    E = eye + U / order
    for k in range(order - 1, 0, -1):
        E = eye + (U @ E) / k
    return E


def fast_exp(U: Tensor) -> tuple[Tensor, int]:
    """FastExp(``U``) in ``U``'s dtype (float64 for the update) and the order it used."""
    order = fast_exp_order(U)
    if order == EXACT:
        return torch.linalg.matrix_exp(U), order
    return taylor_exp(U, order), order


def polar(X: Tensor) -> Tensor:
    """``(XXᵀ)^{-1/2} X`` in float64 for a full-rank row-orthonormal-ish ``(…, n, m)`` ``X``
    (eigenvalues clamped at 1e-10, as the first author's code)."""
    X64 = X.detach().to(torch.float64)
    w, V = torch.linalg.eigh(X64 @ X64.mT)
    inv_sqrt = (V * w.clamp_min(1e-10).rsqrt().unsqueeze(-2)) @ V.mT
    return inv_sqrt @ X64
