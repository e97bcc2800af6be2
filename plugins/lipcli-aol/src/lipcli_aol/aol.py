"""AOL convolution: almost-orthogonal Lipschitz rescaling (Prach & Lampert, ECCV 2022).

Maths (their Theorem 1 and its convolutional form, Theorem 2):

* For any matrix ``P`` and ``D = diag(d_i^{-1/2})`` with ``d_i = Σ_j |PᵀP|_{ij}``,
  ``‖P D‖₂ ≤ 1``: ``diag(d) − PᵀP`` is symmetric and diagonally dominant with a
  non-negative diagonal, hence positive semi-definite, so
  ``‖PD‖₂² = ‖D PᵀP D‖₂ ≤ ‖D diag(d) D‖₂ = 1``.
* For the convolution with filter ``K`` (``out × in × k × k``) the role of ``PᵀP`` is
  played by the Gram filter ``KᵀK[i, j, δ] = Σ_{o,a} K[o, i, a] K[o, j, a + δ]``
  (``δ ∈ [1−k, k−1]²``), so ``d_i = Σ_{j,δ} |KᵀK[i, j, δ]|`` and the layer convolves with
  ``K·D`` (input channel ``i`` scaled by ``d_i^{-1/2}``).  With zero "same" padding the
  convolution is ``Π C E`` (zero embedding, circular convolution on a large torus,
  cropping), so the bound holds for it too.
* Stride 2: ``pixel_unshuffle`` (a permutation) first, then the AOL convolution with 4× the
  input channels.  ``in ≠ out`` needs nothing special.

Initialisation (as in the paper): the centre tap is a (semi-)orthogonal matrix, the other
taps 0, so a fresh layer with ``out ≥ 4·in`` (or ``out ≥ in``) is an isometry.

Bound: in exact arithmetic the rescaled filter has norm ``≤ 1``; the float32 filter actually
used is rounded, so ``lipschitz_upper_bound()`` certifies the filter *as used* with the
verified Gram bound :func:`lipcli.numerics.gram_bounds.conv_gram_norm_upper_bound`
(measured for 8 to 512 channels, fresh and random filters: up to ``1 + 3e-7`` in float32,
``1 + 2e-12`` to ``1 + 3e-10`` in float64; the larger values for the isometric initialisation
of wide layers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.convbase import LipConvBase
from lipcli.numerics.gram_bounds import conv_gram_norm_upper_bound

#: smallest ``d_i`` used (a zero column is left at zero; a larger d only shrinks the norm)
_MIN_D = 1e-12


def aol_row_sums(weight: Tensor) -> Tensor:
    """``d_i = Σ_{j,δ} |KᵀK[i, j, δ]|`` for the filter ``K = weight`` (differentiable)."""
    out_ch, in_ch, kh, kw = weight.shape
    if kh == 1 and kw == 1:
        M = weight.reshape(out_ch, in_ch)
        return (M.T @ M).abs().sum(dim=1)
    Kt = weight.transpose(0, 1)  # (in, out, k, k): a "batch" of in images with out channels
    gram = F.conv2d(Kt, Kt, padding=(kh - 1, kw - 1))  # (in, in, 2k-1, 2k-1)
    return gram.abs().sum(dim=(1, 2, 3))


def aol_rescale(weight: Tensor) -> Tensor:
    """``K·D`` with ``D_ii = d_i^{-1/2}``, ``d`` from :func:`aol_row_sums` (differentiable)."""
    scale = aol_row_sums(weight).clamp_min(_MIN_D).rsqrt()
    return weight * scale.view(1, -1, 1, 1)


class AOLConv(LipConvBase):
    """AOL convolution ``(N, in, H, W) → (N, out, H/s, W/s)``, zero "same" padding.

    Parameters ``weight`` (``out × in·s² × k × k``) and ``bias``.  The rescaled filter is
    recomputed every training step and cached in eval mode.
    """

    weight: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        k = self.kernel_size
        weight = torch.zeros(self.out_channels, self.conv_in_channels, k, k)
        centre = torch.empty(self.out_channels, self.conv_in_channels)
        nn.init.orthogonal_(centre)
        weight[:, :, k // 2, k // 2] = centre
        self.weight = nn.Parameter(weight)

    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        return aol_rescale(self.weight)

    def apply_operator(self, x: Tensor, op: Tensor) -> Tensor:
        if op.shape[-1] == 1 and x.shape[-1] == 1 and x.shape[-2] == 1:
            n = x.shape[0]
            return F.linear(x.reshape(n, -1), op.view(op.shape[0], -1)).view(n, -1, 1, 1)
        return F.conv2d(x, op, padding=self.kernel_size // 2)

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        """Verified bound on the filter as used; the Schur weights ``d^{1/2}`` (float64)
        only make it tight (any positive weights give a valid bound)."""
        with torch.no_grad():
            d = aol_row_sums(self.weight.detach().double()).clamp_min(_MIN_D)
        return conv_gram_norm_upper_bound(op, schur_weights=d.sqrt())

    def export_module(self) -> nn.Module:
        """``lip export`` (:mod:`lipcli.sdk.export`): the eval filter ``K·D`` (the cached
        one the layer applies) and the bias baked into one plain convolution."""
        from .export import ExportedAOL

        with torch.no_grad():
            return ExportedAOL(self.eval_operator(None), self.bias, stride=self.stride)
