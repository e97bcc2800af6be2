"""A guaranteed bound on the l2 operator norm of a zero-padded convolution from its Fourier
symbol (used for LiResNet's residual block ``x ↦ x + W ∗ x``, whose operator is the convolution
with the filter ``W + I·δ₀``, and for free-filter stems, e.g. LiResNet's).

Maths.  Let ``K`` be a filter ``(o, i, kh, kw)`` (odd kernel) and ``P`` the stride-1 "same"
convolution with zero padding ``p = (kh − 1)/2`` on ``n × m`` images.  Embed the image with
zeros into the torus ``Z_N × Z_M`` with ``N ≥ n + kh − 1``, ``M ≥ m + kw − 1``; the circular
convolution ``C`` with ``K`` on that torus reads, at every output pixel of the ``n × m``
window, only input pixels of the window or zeros (no wrap-around reaches a non-zero pixel),
so ``P = Π C E`` with ``E`` the isometric zero embedding and ``Π`` a coordinate projection:
``‖P‖₂ ≤ ‖C‖₂``.  The 2-D DFT block-diagonalises ``C``: ``‖C‖₂ = max_f ‖K̂(f)‖₂`` over the
``N·M`` grid frequencies, ``K̂(f) = Σ_δ K_δ ω^{⟨f, δ⟩}`` (``o × i`` complex; the sign of the
exponent only relabels ``f``).  Since ``K̂(−f) = conj K̂(f)`` has the same singular values,
half the grid is enough (``f₂ ∈ [0, M/2]``).  This is exact for ``C``: no sampling of a
continuous symbol, no estimate.

Verification (rounding model: :mod:`lipcli.numerics.rounding`, ``u = 2⁻⁵³``):

1. ``K̂(f)`` is formed in float64 from the angle ``2π·m₁/N + 2π·m₂/M`` with the integers
   ``m₁ = f₁·δ_y mod N``, ``m₂ = f₂·δ_x mod M`` reduced exactly; the angle (at most ``4π``) is
   off by at most ``16πu ≈ 50u`` and a 1-ulp ``cos``/``sin`` adds ``2u``, so each computed
   ``cos``/``sin`` is within ``256u`` of the exact value (a factor of about 5 of safety), and
   each entry is a length-``T = kh·kw`` sum, so its real and imaginary parts are off by at most
   ``(γ_T + 256u)·A`` with ``A_oi = Σ_δ |K_{δ,oi}|``.  Hence ``‖K̂ − K̂_computed‖₂ ≤
   ‖error‖_F ≤ δ₁ = 2(γ_T + 256u)(1 + γ_T)·‖A‖_F`` (enlarged for its own rounding).
2. The Gram ``H = K̂ᴴK̂`` (the smaller side) in complex128: each entry a complex dot product of
   length ``q``, error ``≤ 16γ_{q+2}·Σ|a||b|`` (as in :mod:`lipcli.numerics.gram_bounds`), so
   ``‖ΔH‖₂ ≤ 16γ_{q+2}‖K̂‖_F²``; the Hermitian part ``H_s = ½(Ĥ + Ĥᴴ)`` is within
   ``2‖ΔH‖₂ + 2u‖Ĥ‖_F = 32γ_{q+2}‖K̂‖_F² + 2u‖Ĥ‖_F`` of the exact Gram (which is Hermitian,
   so ``‖½(Ĥ − Ĥᴴ)‖₂ ≤ ‖ΔH‖₂``; the sum rounds by ``u`` per entry)
   (and its real/imaginary parts are exactly symmetric/antisymmetric, so the real matrix
   ``R = [[Re H_s, −Im H_s], [Im H_s, Re H_s]]`` is exactly the real form of ``H_s``, with the
   same eigenvalues, each twice).
3. ``λ_max(R)`` is certified by Rump's shifted Cholesky, the test (and constants) of
   :func:`lipcli.numerics.eigen.certify_lambda_max`, run batched over the frequencies
   (:func:`_certified_lambda_max`) at one candidate from a batched power iteration (exact
   ``eigvalsh`` on the top frequencies); a frequency that fails is retried with a gap four
   times larger, and gets ``‖Ĥ‖_F ≥ ‖H_s‖_F ≥ λ_max(H_s)`` when nothing certifies.  Then
   ``‖K̂(f)‖₂ ≤ √(λ̄ + errors of 2) + δ₁``.

Cost: ``N·(M/2 + 1)`` Gram products and Cholesky factorisations of order ``2·min(o, i)``
(180 frequencies of order 256 for width 128 on LiResNet's 16 × 16 images, 612 on 32 × 32:
about 10 s for the latter on two CPU cores shared with other jobs); the result is cached by
the caller.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lipcli.numerics.rounding import ETA
from lipcli.numerics.rounding import UNIT_ROUNDOFF as U
from lipcli.numerics.rounding import gamma, round_up

__all__ = ["circular_symbols", "zero_padded_conv_norm_upper_bound"]

#: frequencies whose candidate comes from an exact ``eigvalsh`` instead of power iteration
_EXACT_TOP = 8
_POWER_STEPS = 20
_RTOL = 1e-6
#: candidate values tried per frequency before the Frobenius fallback
_ATTEMPTS = 14
#: frequencies per batched power iteration / Cholesky (bounds the memory of the real forms)
_CHUNK = 32


def circular_symbols(kernel: Tensor, torus: tuple[int, int]) -> Tensor:
    """``K̂(f)`` for ``f = (f₁, f₂)``, ``f₁ ∈ [0, N)``, ``f₂ ∈ [0, M/2]``: complex128
    ``(F, o, i)`` (the other half of the grid are complex conjugates)."""
    K = kernel.detach().to(torch.float64)
    o, i, kh, kw = K.shape
    N, M = torus
    f1 = torch.arange(N).view(N, 1, 1, 1)
    f2 = torch.arange(M // 2 + 1).view(1, -1, 1, 1)
    dy = torch.arange(kh).view(1, 1, kh, 1) - (kh - 1) // 2
    dx = torch.arange(kw).view(1, 1, 1, kw) - (kw - 1) // 2
    # exact integer phases m/N and m'/M (reduced before any rounding), combined as one angle
    ang = 2.0 * math.pi * ((f1 * dy) % N).double() / N + 2.0 * math.pi * ((f2 * dx) % M).double() / M
    ang = ang.reshape(-1, kh * kw)  # (F, T)
    taps = K.reshape(o * i, kh * kw).T  # (T, o·i)
    real = (torch.cos(ang) @ taps).view(-1, o, i)
    imag = (torch.sin(ang) @ taps).view(-1, o, i)
    return torch.complex(real, imag)


def _power_lambda(H: Tensor, steps: int) -> Tensor:
    """Per matrix of the Hermitian PSD batch ``H`` ``(F, q, q)``: a power-iteration Rayleigh
    quotient (a lower estimate of ``λ_max``)."""
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(H.shape[0], H.shape[1], 1, generator=gen, dtype=torch.float64).to(H.dtype)
    for _ in range(steps):
        v = H @ v
        v = v / torch.linalg.vector_norm(v, dim=1, keepdim=True).clamp_min(1e-300)
    return (v.conj().transpose(1, 2) @ H @ v).real.view(-1)


def zero_padded_conv_norm_upper_bound(kernel: Tensor, image_size: tuple[int, int]) -> float:
    """Guaranteed upper bound on ``‖P‖₂`` for the zero-padded "same" convolution with
    ``kernel`` ``(o, i, kh, kw)`` on images of ``image_size`` (or smaller); module docstring."""
    if kernel.dim() != 4 or kernel.shape[2] % 2 == 0 or kernel.shape[3] % 2 == 0:
        raise ValueError(f"expected an odd 4-D filter, got shape {tuple(kernel.shape)}")
    if not bool(torch.isfinite(kernel).all()):
        raise ValueError("filter has non-finite entries")
    o, i, kh, kw = kernel.shape
    torus = (int(image_size[0]) + kh - 1, int(image_size[1]) + kw - 1)
    with torch.no_grad():
        Khat = circular_symbols(kernel, torus)  # (F, o, i)
        if o < i:
            Khat = Khat.transpose(1, 2).conj()  # same singular values, smaller Gram
        q, side = Khat.shape[1], Khat.shape[2]  # dot length, Gram order
        T = kh * kw
        A = kernel.detach().to(torch.float64).abs().sum(dim=(2, 3))
        delta1 = round_up(2.0 * (gamma(T) + 256.0 * U) * (1.0 + gamma(T)) * float(torch.linalg.vector_norm(A))
                          * (1.0 + 2.0 * gamma(A.numel() + 1)))
        H = Khat.conj().transpose(1, 2) @ Khat  # (F, side, side)
        Hs = 0.5 * (H + H.conj().transpose(1, 2))
        fro_k = torch.linalg.vector_norm(Khat.flatten(1), dim=1) * (1.0 + 2.0 * gamma(q * side + 2))
        fro_h = torch.linalg.vector_norm(H.flatten(1), dim=1) * (1.0 + 2.0 * gamma(side * side + 2))
        # (F,): ‖H_exact − H_s‖₂ ≤ ‖H_exact − Ĥ‖ + ‖(Ĥ − Ĥᴴ)/2‖ + rounding ≤ 2·16γ‖K̂‖_F² + 2u‖Ĥ‖_F
        gram_err = 32.0 * gamma(q + 2) * fro_k**2 + 2.0 * U * fro_h
        est = torch.cat([_power_lambda(h, _POWER_STEPS) for h in Hs.split(_CHUNK)])
        top = torch.topk(est, min(_EXACT_TOP, est.numel())).indices
        est[top] = torch.linalg.eigvalsh(Hs[top]).amax(dim=1)
        lam = torch.cat([_certified_lambda_max(h, float(est.max()), fh)
                         for h, fh in zip(Hs.split(_CHUNK), fro_h.split(_CHUNK))])
        sigma = torch.sqrt((lam + gram_err) * (1.0 + 4.0 * U)) * (1.0 + 4.0 * U)
    return round_up(float(sigma.max()) + delta1)


def _certified_lambda_max(Hs: Tensor, estimate: float, fro_h: Tensor) -> Tensor:
    """Per frequency, a certified upper bound on ``λ_max(H_s)`` (float64 ``(F,)``): Rump's
    shifted Cholesky (the test of :func:`lipcli.numerics.eigen.certify_lambda_max`, module
    docstring there: ``X̂ = fl(λ̄I − R)``, shift ``c = 2γ_{p+1}/(1 − γ_{p+1})·tr(X̂)·(1 +
    γ_{p+1}) + 4p(2(p+1) + max X̂_ii)·η``; success proves ``λ_max(R) ≤ λ̄ + u·max|X̂_ii|(1 + 2u)``)
    run on the whole batch of real forms at once, with one candidate ``λ̄`` for all
    frequencies; those that fail retry with a gap four times larger, and after
    :data:`_ATTEMPTS` tries fall back to ``‖H‖_F`` (always valid)."""
    R = torch.cat([torch.cat([Hs.real, -Hs.imag], 2), torch.cat([Hs.imag, Hs.real], 2)], 1)
    F_, p = R.shape[0], R.shape[1]
    g = gamma(p + 1)
    rump = 2.0 * g / (1.0 - g)
    gap = max(_RTOL * abs(estimate), 1e-12 * float(fro_h.max()))
    result = fro_h * (1.0 + 4.0 * U)  # the fallback
    pending = torch.arange(F_)
    eye = torch.eye(p, dtype=torch.float64)
    for attempt in range(_ATTEMPTS):
        if pending.numel() == 0:
            break
        lam_bar = estimate + gap * 4.0**attempt
        X = lam_bar * eye - R[pending]  # X̂ = fl(λ̄I − R): only the diagonal rounds
        diag = torch.diagonal(X, dim1=1, dim2=2)
        max_abs_diag = diag.abs().amax(dim=1)
        positive = diag.amin(dim=1) > 0.0
        trace = diag.sum(dim=1) * (1.0 + g)
        shift = rump * trace + 4.0 * p * (2.0 * (p + 1) + max_abs_diag) * ETA
        X = X - shift.view(-1, 1, 1) * eye
        _, info = torch.linalg.cholesky_ex(X, upper=False)
        ok = positive & (info == 0)
        bound = (lam_bar + U * max_abs_diag * (1.0 + 2.0 * U)) * (1.0 + 1e-12)
        done = pending[ok]
        result[done] = torch.minimum(result[done], bound[ok])
        pending = pending[~ok]
    return result
