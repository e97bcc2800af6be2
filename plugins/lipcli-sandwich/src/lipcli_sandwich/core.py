"""The Sandwich layer's maths: the Cayley transform, the kernel's centred spectrum, and a
verified bound for the float matrices a layer uses.

Layer (Wang & Manchester, ICML 2023, eq. 10; the comparison study's ``SandwichConv`` /
``SandwichFc``, ``berndprach/1LipschitzLayersCompared`` ``models/layers/lipschitz/sandwich.py``,
adapted from ``acfr/LBDN``): ``h ↦ √2·AᵀΨ σ(√2·Ψ⁻¹B h + b)`` with ``Ψ = diag(e^ψ)``, ``σ = ReLU``
and ``[A B] = Cayley(α·P/‖P‖_F)ᵀ`` (``A``: ``q × q``, ``B``: ``q × p``) so that
``AAᵀ + BBᵀ = I``.  ``psi_in_bias`` (the study's ``numerical_stable``, Remark 3 of [LC]):
``√2·Aᵀ σ(√2·B h + Ψ b)``, the same function.  The convolution does this per frequency of the
``H × W`` torus (circular padding): ``P`` is the kernel ``q × (q+p) × k × k``, zero-padded and
``rfft2``-transformed, centred by the phase ``e^{−2πi c (f₁/H + f₂/W)}`` (``c = (k−1)/2``) and
conjugated; the Frobenius norm is over all half-plane bins together.

Why a bound is needed and which.  In exact arithmetic the layer is 1-Lipschitz (their Thm 3.2).
Directly: ``σ(a) − σ(a') = D(a − a')``, ``D`` diagonal in ``[0, I]``; ``Ψ`` is diagonal over
channels, ``D`` over channels and pixels, so they commute and the Jacobian is
``J = 2·Aᵀ D B`` (``Ψ`` cancels).  With ``E = AAᵀ + BBᵀ − I``:
``JᵀJ = 4BᵀD(I + E − BBᵀ)DB ⪯ 4M − 4M² + 4‖B‖²‖E‖ ⪯ I + 4‖B‖²‖E‖`` (``M = BᵀDB`` and
``BᵀD²B ⪯ M``; ``4M − 4M² = I − (I − 2M)² ⪯ I``), so ``‖J‖ ≤ √(1 + 4(1 + e)e)`` for any
``e ≥ ‖E‖`` (then ``‖B‖² ≤ 1 + e``).  The Cayley matrices are computed in floating point, so
``E ≠ 0``; :func:`sandwich_bound` takes ``e`` from the verified
:func:`lipcli.numerics.gram_bounds.isometry_norm_upper_bound` of ``[A B]`` per bin.  Two more
effects of the float numbers are covered: ``e^ψ`` and ``e^{−ψ}`` are rounded separately (their
products ``1 + η``: ``J = 2AᵀD'B`` with ``D' ≤ (1 + η)``, a factor ``1 + η``), and, for the
convolution, the blocks of the self-conjugate columns (``f₂ = 0`` and ``W/2``) at ``f₁`` and
``−f₁`` are computed separately and need not be exact conjugates; ``irfft2`` projects onto real
signals (norm 1), so the map used differs from a conjugate-consistent one by at most
``δ = max ‖Q(−f) − conj Q(f)‖_F`` in each of ``A`` and ``B``: ``+ 2δ(2√(1 + e) + δ)``; and the
convolution applies the computed products ``√2Ψ⁻¹B`` and ``√2AᴴΨ`` (:func:`product_error`).
Rounding inside a forward pass (the FFTs, products) is not part of any lipcli bound.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lipcli.numerics.gram_bounds import isometry_norm_upper_bound
from lipcli.numerics.rounding import round_up

__all__ = ["SQRT2", "cayley", "centred_spectrum", "sandwich_bound", "conjugate_defect", "product_error"]

#: the constant the authors' code multiplies by (``2 ** 0.5``)
SQRT2 = 2**0.5


def cayley(W: Tensor) -> Tensor:
    """The (batched, real or complex) Cayley transform of the study's / LBDN's code: for ``W``
    of shape ``(..., m, n)``; ``n > m`` is done on the transpose (not the conjugate transpose).
    ``U, V = W[:, :n], W[:, n:]`` (``m ≥ n``), ``Z = U − Uᴴ + VᴴV``, result
    ``[(I+Z)⁻¹(I−Z); −2V(I+Z)⁻¹]`` with orthonormal columns."""
    if W.dim() == 2:
        return cayley(W[None])[0]
    _, cout, cin = W.shape
    if cin > cout:
        return cayley(W.transpose(1, 2)).transpose(1, 2)
    U, V = W[:, :cin], W[:, cin:]
    eye = torch.eye(cin, dtype=W.dtype, device=W.device)[None]
    Z = U - U.conj().transpose(1, 2) + V.conj().transpose(1, 2) @ V
    inv = torch.inverse(eye + Z)
    return torch.cat((inv @ (eye - Z), -2 * V @ inv), dim=1)


def shift_phases(size: tuple[int, int], k: int, device: torch.device) -> Tensor:
    """``e^{−2πi c (f₁/H + f₂/W)}`` on the half-plane bins, shape ``(H·(W//2+1), 1, 1)``, from
    exact integer phases (the authors' ``fft_shift_matrix`` for ``H = W``)."""
    H, W = size
    c = (k - 1) // 2
    f1 = torch.arange(H, dtype=torch.float64).view(H, 1)
    f2 = torch.arange(W // 2 + 1, dtype=torch.float64).view(1, -1)
    angle = -2 * math.pi * c * (f1 / H + f2 / W)
    return torch.polar(torch.ones_like(angle), angle).reshape(-1, 1, 1).to(device)


def centred_spectrum(weight: Tensor, size: tuple[int, int]) -> Tensor:
    """``(H·(W//2+1), q, q+p)``: the conjugated, centred ``rfft2`` of the kernel on the torus."""
    cout, chn, k, _ = weight.shape
    H, W = size
    spectrum = torch.fft.rfft2(weight, s=(H, W)).reshape(cout, chn, -1).permute(2, 0, 1).conj()
    return shift_phases(size, k, weight.device).to(spectrum.dtype) * spectrum


def conjugate_defect(Q: Tensor, size: tuple[int, int]) -> float:
    """``δ ≥ max ‖Q(−f) − conj Q(f)‖_F`` over the self-conjugate columns ``f₂ ∈ {0, W/2}`` of
    the half-plane blocks ``Q`` ``(H·(W//2+1), q, q+p)``."""
    H, W = size
    bins = W // 2 + 1
    blocks = Q.detach().reshape(H, bins, *Q.shape[1:]).to(torch.complex128)
    cols = [0] + ([W // 2] if W % 2 == 0 and W > 1 else [])
    flip = (-torch.arange(H)) % H
    worst = 0.0
    for col in cols:
        diff = blocks[flip, col] - blocks[:, col].conj()
        worst = max(worst, float(torch.linalg.vector_norm(diff.flatten(1), dim=1).max()))
    return round_up(worst * (1.0 + 1e-6) + 1e-300) if worst else 0.0


def product_error(op1: Tensor, op2: Tensor) -> float:
    """``‖a D b − a₀ D b₀‖`` bound for the computed products ``a = op2``, ``b = op1`` of the
    convolution (each entry one or two roundings of an exact product ``a₀``, ``b₀``: relative
    ``ρ = 2.01u`` in their dtype), per bin and maximised: ``2ρ‖a‖_F‖b‖_F + ρ²‖a‖_F‖b‖_F``."""
    finfo = torch.finfo(op1.real.dtype if op1.is_complex() else op1.dtype)
    rho = 2.01 * finfo.eps / 2
    fa = torch.linalg.vector_norm(op2.detach().to(torch.complex128).flatten(1), dim=1)
    fb = torch.linalg.vector_norm(op1.detach().to(torch.complex128).flatten(1), dim=1)
    worst = float((fa * fb).max()) * (1.0 + 1e-6)
    return round_up((2.0 * rho + rho * rho) * worst)


def sandwich_bound(Q: Tensor, psi: Tensor, *, delta: float = 0.0, stable: bool = False,
                   extra: float = 0.0) -> float:
    """Verified Lipschitz bound of the sandwich map with blocks ``Q = [A B]`` (``(..., q, q+p)``,
    as used) and ``ψ`` (module docstring); ``extra``: :func:`product_error`."""
    iso = isometry_norm_upper_bound(Q)  # ≥ √(1 + max ‖QQᴴ − I‖_F)
    e = round_up(max(0.0, iso * iso - 1.0))
    eta = 0.0
    if not stable:
        p = psi.detach()
        prod = torch.exp(p).double() * torch.exp(-p).double()
        eta = round_up(float((prod - 1.0).abs().max()) * (1.0 + 1e-6) + 4 * 2.0**-53) if p.numel() else 0.0
    core = math.sqrt(round_up(1.0 + round_up(4.0 * (1.0 + e) * e)))
    conj = 2.0 * delta * (2.0 * math.sqrt(1.0 + e) + delta)
    sqrt2_sq = 1.0 + 2.0**-51  # fl(√2)² ≤ 2(1 + 2⁻⁵²): the two √2 factors
    return round_up(round_up(round_up(core + conj) * (1.0 + eta)) * sqrt2_sq + extra)
