"""The SLL residual map, its normalisation ``T`` and a verified bound for float parameters.

SLL (Araujo, Havens, Delattre, Allauzen & Hu, *A Unified Algebraic Perspective on Lipschitz
Neural Networks*, ICLR 2023, Theorem 3; convolutional form as in their experiments) is the
residual map

    ``h(x) = x − 2 W T⁻¹ σ(Wᵀx + b)``

with ``σ = ReLU`` (any slope in ``[0, 1]``) and the diagonal

    ``T_ii = Σ_j |WᵀW|_ij q_j / q_i``  (``q > 0``; here ``q = exp(log_q)``).

In this code ``Wᵀ`` is the map ``C`` from the features to the ``hidden`` units: a matrix
``K`` (``hidden × features``, ``C x = K x``) or a convolution with filter ``K``
(``hidden × channels × k × k``, zero "same" padding; ``W = Cᵀ`` is the transposed
convolution), so ``WᵀW = C Cᵀ`` acts on the hidden units.  For the convolution its
channel-and-offset entries are the *kernel of kernels*
``G[i, j, δ] = Σ_{c,a} K[i, c, a] K[j, c, a + δ]`` (``F.conv2d(K, K, padding=k − 1)``), and
``T_ii = Σ_{j,δ} |G[i, j, δ]| q_j / q_i`` (the sum over offsets is the paper's
convolutional ``T``: zero padding only removes terms of ``C Cᵀ``, see below).

Why ``h`` is 1-Lipschitz.  For two inputs, ``σ(a) − σ(a') = D (a − a')`` with ``D`` diagonal,
``0 ≤ D ≤ I`` (slopes of ReLU), so ``h(x) − h(y) = J (x − y)`` with
``J = I − 2 M Mᵀ``, ``M = W (S D)^{1/2}`` and ``S = T⁻¹``.  ``J`` is symmetric with
eigenvalues ``1 − 2λ``, ``λ ∈ [0, ‖M‖²]`` and ``‖M‖² ≤ ρ := λ_max(S^{1/2} WᵀW S^{1/2})``.
Hence ``‖J‖ ≤ max(1, 2ρ − 1)``, which is 1 as soon as ``ρ ≤ 1`` (i.e. ``WᵀW ⪯ T``).  The
weighted Schur test with weights ``p_j = q_j / √s_j`` gives
``ρ ≤ max_i s_i Σ_j |WᵀW|_ij q_j / q_i`` (``s = diag S``), which is exactly 1 for
``s = 1/T`` in exact arithmetic.  For zero padding ``C = Π C_∘ E`` (``E`` a zero embedding,
``Π`` a crop, ``C_∘`` a circular convolution on a large torus), so ``C Cᵀ ⪯ Π C_∘ C_∘ᵀ Πᵀ``,
whose rows are sub-sums of the rows of ``G``; the same ``T`` works.

Floating point (what :func:`sll_bound` certifies).  The layer applies the float filter
``K̂`` and the float scales ``ŝ`` (``1/T`` as computed, cached in eval mode); the exact map
with *those* numbers has Lipschitz constant ``≤ max(1, 2ρ − 1)`` with
``ρ ≤ max_i ŝ_i Σ_j A_ij q_j / q_i`` for any positive ``q`` and any entrywise upper bounds
``A_ij ≥ Σ_δ |G[i, j, δ]|`` of the exact Gram sums of ``K̂``.  ``A`` is computed in float64
with the rounding model of :mod:`lipcli.numerics.gram_bounds` (one dot product of length
``channels·k²`` per entry: error ``≤ γ_N c_i c_j`` with the row norms ``c``), and the final
sums are rounded up (:mod:`lipcli.numerics.rounding`).  Since ``T̂`` was computed in float32
from the same ``K̂``, ``ρ`` is ``1 + O(1e-6)`` and the bound ``1 + O(1e-6)``; it is exactly 1
only when the verified ``ρ`` is ``≤ 1``.  Rounding inside a forward pass (the two
convolutions) is not part of the bound, as for every lipcli layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lipcli.numerics.gram_bounds import conv_gram_filter
from lipcli.numerics.rounding import UNIT_ROUNDOFF, gamma, round_up

__all__ = ["sll_gram", "sll_t", "sll_scale", "sll_residual", "verified_gram_sums", "sll_bound",
           "Q_INITS", "initial_log_q"]

#: how ``log_q`` starts: ``"ones"``: ``q = 1`` (``log_q = 0``, AOL's rescaling); ``"normal"``:
#: ``log_q ~ N(0, 1)``, the SLL authors' (``araujoalexandre/Lipschitz-SLL-Networks``,
#: ``core/models/layers.py``: ``self.q = nn.Parameter(torch.randn(inner_dim))``, used as
#: ``exp(self.q)``)
Q_INITS = ("ones", "normal")


def initial_log_q(hidden: int, q_init: str) -> Tensor:
    """The initial ``log_q`` (``hidden`` entries) for ``q_init`` in :data:`Q_INITS`; only
    ``"normal"`` draws from torch's random generator.  Any positive ``q`` is valid: ``T`` is
    computed from it, so the bound holds whatever it starts at."""
    if q_init == "ones":
        return torch.zeros(hidden)
    if q_init == "normal":
        return torch.randn(hidden)
    raise ValueError(f"SLL q_init must be one of {', '.join(Q_INITS)}, got {q_init!r}")

#: smallest ``T_ii`` used: a larger ``T`` only shrinks the update (still sound); a hidden unit
#: with an all-zero filter contributes nothing whatever its scale
MIN_T = 1e-12


def sll_gram(kernel: Tensor) -> Tensor:
    """The kernel of kernels ``G[i, j, δ] = Σ_{c,a} K[i, c, a] K[j, c, a + δ]`` of a filter
    ``K`` (``hidden × channels × k × k``), shape ``(hidden, hidden, 2k−1, 2k−1)``
    (differentiable); for ``k = 1`` the matrix ``K Kᵀ`` as ``(hidden, hidden, 1, 1)``."""
    h, c, kh, kw = kernel.shape
    if kh == 1 and kw == 1:
        m = kernel.reshape(h, c)
        return (m @ m.T).view(h, h, 1, 1)
    return F.conv2d(kernel, kernel, padding=(kh - 1, kw - 1))


def sll_t(kernel: Tensor, log_q: Tensor) -> Tensor:
    """``T_ii = Σ_{j,δ} |G[i, j, δ]| q_j / q_i`` with ``q = exp(log_q)`` (differentiable)."""
    q = torch.exp(log_q)
    rows = (sll_gram(kernel).abs().sum(dim=(2, 3)) * q[None, :]).sum(dim=1)
    return rows / q


def sll_scale(kernel: Tensor, log_q: Tensor) -> Tensor:
    """``s = 1/T`` (``T`` clamped below by :data:`MIN_T`), one per hidden unit."""
    return sll_t(kernel, log_q).clamp_min(MIN_T).reciprocal()


def sll_residual(x: Tensor, kernel: Tensor, bias: Tensor, scale: Tensor) -> Tensor:
    """``x − 2 Cᵀ diag(scale) ReLU(C x + b)`` for ``x`` of shape ``(N, channels, H, W)``."""
    pad = kernel.shape[-1] // 2
    z = F.relu(F.conv2d(x, kernel, bias, padding=pad))
    return x - F.conv_transpose2d(z * (2.0 * scale).view(1, -1, 1, 1), kernel, padding=pad)


def verified_gram_sums(kernel: Tensor) -> Tensor:
    """Float64 ``A`` with ``A_ij ≥ Σ_δ |G[i, j, δ]|`` for the exact Gram of the float filter
    ``K`` (rounding model of :mod:`lipcli.numerics.gram_bounds`, module docstring)."""
    K = kernel.detach().to(torch.float64)
    if not bool(torch.isfinite(K).all()):
        raise ValueError("SLL filter has non-finite entries")
    h, c, kh, kw = K.shape
    G = conv_gram_filter(K.transpose(0, 1))  # hidden-side Gram: C Cᵀ
    n_dot = c * kh * kw
    gam = gamma(n_dot)
    rows = torch.linalg.vector_norm(K.reshape(h, -1), dim=1) * (1.0 + 2.0 * gamma(n_dot + 1))
    err = (gam / (1.0 - gam)) * (rows[:, None] * rows[None, :]) * (1.0 + 4.0 * UNIT_ROUNDOFF)
    offsets = (2 * kh - 1) * (2 * kw - 1)
    A = (G.abs() + err[:, :, None, None]).sum(dim=(2, 3))
    return A * (1.0 + 2.0 * gamma(offsets + 1))


def sll_rho_bound(kernel: Tensor, scale: Tensor, log_q: Tensor) -> float:
    """Guaranteed ``ρ ≥ λ_max(S^{1/2} C Cᵀ S^{1/2})`` for the float ``kernel`` and ``scale``
    actually used (``q = exp(log_q)`` are only Schur weights: any positive values are valid)."""
    A = verified_gram_sums(kernel)
    s = scale.detach().to(torch.float64).reshape(-1)
    if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
        raise ValueError("SLL scales must be finite and non-negative")
    q = torch.exp(log_q.detach().to(torch.float64).reshape(-1))
    if not bool(torch.isfinite(q).all()) or not bool((q > 0).all()):
        q = torch.ones_like(s)  # any positive weights give a valid bound
    p = A.shape[0]
    worst = float((s * (A @ q) / q).max())
    # (A q)_i: a sum of p non-negative products; then one division and one product
    return round_up(worst * (1.0 + 2.0 * gamma(p + 4)))


def sll_bound(kernel: Tensor, scale: Tensor, log_q: Tensor) -> float:
    """GUARANTEED Lipschitz bound ``max(1, 2ρ − 1)`` of ``x ↦ x − 2 Cᵀ diag(s) ReLU(Cx + b)``
    for the float ``kernel`` and ``scale`` (module docstring)."""
    rho = sll_rho_bound(kernel, scale, log_q)
    if not math.isfinite(rho):
        raise ValueError("SLL bound is not finite")
    return 1.0 if rho <= 1.0 else round_up(2.0 * rho - 1.0)
