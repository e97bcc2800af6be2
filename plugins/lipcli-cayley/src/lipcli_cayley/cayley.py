"""Cayley convolution: orthogonal convolutions in the Fourier domain (Trockman & Kolter,
*Orthogonalizing Convolutional Layers with the Cayley Transform*, ICLR 2021).

Maths:

* A *circular* convolution on an ``H × W`` torus is block diagonal in the Fourier basis: at
  every frequency ``f`` it multiplies the input's spectrum ``x̂(f) ∈ ℂ^{in}`` by the matrix
  ``Ŵ(f) = Σ_{a,b} W[:, :, a, b] e^{2πi (f_y (a−c)/H + f_x (b−c)/W)}`` (``c = k//2``; the
  sum aliases taps when ``k > H``).  Replacing ``Ŵ(f)`` by a unitary ``Q(f)`` with
  ``Q(−f) = conj Q(f)`` gives a real orthogonal map; ``Q(f)`` is the Cayley transform of
  ``A(f) = α Ŵ(f)/‖W‖_F`` (``α`` a learned scale, initialised to ``‖W‖_F``).
* Cayley transform, ``A`` of shape ``m × n`` with ``m ≥ n`` (rows = outputs):
  ``U = A[:n]``, ``V = A[n:]``, ``M = U − Uᴴ + VᴴV`` and
  ``Q = [I − M; −2V] (I + M)⁻¹``.  Then ``QᴴQ = I`` (semi-orthogonal): with
  ``M + Mᴴ = 2VᴴV``, ``(I − M)ᴴ(I − M) + 4VᴴV = (I + M)ᴴ(I + M)``.  ``I + M`` is invertible
  because ``M + Mᴴ ⪰ 0``.  For ``m < n`` the transform of ``Aᴴ`` is transposed (``QQᴴ = I``).
  ``Cayley(conj A) = conj Cayley(A)``, so the map is real.  For ``m = n`` this is the usual
  ``(I + S)⁻¹(I − S)`` with ``S = U − Uᴴ``.
* The layer computes ``y = irfft2(Q · rfft2(x))`` (bins of the half plane ``f_x ≤ W/2``).
  For ``1 × 1`` images only the real DC bin exists: ``y = Q x`` with a real ``Q``.
* Stride 2 (as lipcli's SOC): ``pixel_unshuffle`` (a permutation), then the Cayley
  convolution with ``4·in`` input channels, semi-orthogonal from ``4·in`` to ``out``.

What is proven, and what is bounded: the layer is orthogonal (``in = out``) or
semi-orthogonal in exact arithmetic, hence the promise ``"orthogonal"``.  The matrices
``Q̂(f)`` actually used are computed in floating point (float32 in training), so
``lipschitz_upper_bound()`` certifies them: ``max_f ‖Q̂(f)‖₂ ≤ √(1 + max_f ‖Q̂ᴴQ̂ − I‖_F)``
with every rounding of that computation covered
(:func:`lipcli.numerics.gram_bounds.isometry_norm_upper_bound`).  This bounds the linear map
``x ↦ c2r(Q̂ · DFT(x))`` exactly: with ``E`` the Hermitian completion of the half-plane
products ``Z(f) = Q̂(f)x̂(f)``, ``y = Re IDFT(E)``, so ``‖y‖² ≤ ‖E‖²/(HW) ≤ max‖Q̂‖²·‖x̂‖²/(HW)
= max‖Q̂‖²·‖x‖²`` (Parseval), whether or not ``Q̂(−f) = conj Q̂(f)`` holds exactly in floating
point.  Every solve is checked by its residual (:func:`checked_solve`) and the eval forward
applies exactly the cached operator the bound is computed from (:meth:`CayleyConv.linear`).
The rounding of the FFTs inside a forward pass is not part of the bound (as SOC's
series rounding is not).  The matrices depend on the image size, so the layer records the
size it is first used with (buffer ``spatial_size``, saved with the model) and refuses other
sizes: its bound is for that size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lipcli.sdk.errors import LipError
from lipcli.sdk.fourier import FourierConvBase, kernel_spectrum
from lipcli.numerics.gram_bounds import isometry_norm_upper_bound
from lipcli.numerics.solve import checked_solve as _checked_solve, solve_residual_ok  # noqa: F401 (re-exported)


def cayley(A: Tensor) -> Tensor:
    """Semi-orthogonal Cayley transform of a batch ``A`` (``(..., m, n)``, real or complex):
    ``QᴴQ = I`` if ``m ≥ n``, ``QQᴴ = I`` otherwise (module docstring)."""
    m, n = A.shape[-2:]
    if m < n:
        return cayley(A.mH).mH
    U, V = A[..., :n, :], A[..., n:, :]
    M = U - U.mH + V.mH @ V
    eye = torch.eye(n, dtype=A.dtype, device=A.device)
    B = torch.cat([eye - M, -2.0 * V], dim=-2)
    return checked_solve(eye + M, B)  # B (I + M)⁻¹


def checked_solve(S: Tensor, B: Tensor) -> Tensor:
    """``B S⁻¹`` (batched), verified by its residual: :func:`lipcli.numerics.solve.checked_solve`
    (the batched LAPACK solve has returned wrong matrices or raised under several threads;
    a wrong ``Q`` would be evaluated and certified without being the layer's operator)."""
    return _checked_solve(S, B, left=False, what="Cayley transform")


class CayleyConv(FourierConvBase):
    """Cayley convolution ``(N, in, H, W) → (N, out, H/s, W/s)``, circular (FFT).

    Parameters ``weight`` (``out × in·s² × k × k``, PyTorch's default convolution
    initialisation), ``alpha`` (scalar, initialised to ``‖weight‖_F``) and ``bias``; buffer
    ``spatial_size`` (the operator's ``(H, W)``, ``0`` until the first forward).  The image
    size, the Fourier-domain application, the export stand-in and the eval lowering are
    :class:`lipcli.sdk.fourier.FourierConvBase`'s.
    """

    weight: Tensor
    alpha: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        k = self.kernel_size
        weight = torch.empty(self.out_channels, self.conv_in_channels, k, k)
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # nn.Conv2d's default
        self.weight = nn.Parameter(weight)
        self.alpha = nn.Parameter(torch.linalg.vector_norm(weight).detach().clone())

    # ------------------------------------------------------------------ operator
    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        """``Q(f)`` for the half-plane bins, shape ``(H·(W//2+1), out, in·s²)`` (real
        ``(1, out, in·s²)`` for a ``1 × 1`` image)."""
        assert size is not None
        scale = self.alpha / torch.linalg.vector_norm(self.weight)
        return cayley(kernel_spectrum(self.weight, size) * scale)

    def linear(self, x: Tensor) -> Tensor:
        """As :meth:`LipConvBase.linear`, except that in eval mode the values applied are
        always those of the cached :meth:`eval_operator`, the very tensor
        :meth:`lipschitz_upper_bound` certifies: when gradients to the parameters are asked
        for, the recomputed operator only carries them (``cached + (live − live)``, exactly
        the cached values), so evaluation and bound cannot diverge even if a recomputation
        rounded differently."""
        if self.training:
            return super().linear(x)
        z = self.rearrange(x)
        size = self.operator_size((int(z.shape[-2]), int(z.shape[-1])))
        op = self.eval_operator(size)
        if self.eval_grad_to_params and torch.is_grad_enabled() and any(
            p.requires_grad for p in self.parameters()
        ):
            live = self.compute_operator(size)
            op = op + (live - live.detach())
        return self.apply_operator(z, op)

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        return isometry_norm_upper_bound(op)
