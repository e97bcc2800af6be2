"""Circular convolutions in the Fourier basis, for convolution plugins that parametrise their
map per frequency (lipcli-cayley, lipcli-bro, lipcli-lot); the export stand-in is :mod:`lipcli.sdk.fourier_export`.

* On an ``H × W`` torus a circular convolution with filter ``K`` (``out × in × k × k``) is
  block diagonal in the Fourier basis: at every frequency ``f`` it multiplies the input's
  spectrum ``x̂(f) ∈ ℂ^in`` by ``K̂(f) = Σ_{a,b} K[:, :, a, b] e^{2πi(f_y(a−c)/H + f_x(b−c)/W)}``
  (``c = k//2``; taps alias when ``k > H``) — :func:`kernel_spectrum`.  A real filter gives
  ``K̂(−f) = conj K̂(f)``.
* :class:`FourierConvBase` applies per-frequency matrices ``Q(f)`` (half-plane bins
  ``f_x ≤ W/2``): ``y = irfft2(Q · rfft2(x))``; on ``1 × 1`` images only the real DC bin
  exists, ``y = Q x``.  It records the image size it first sees (buffer ``spatial_size``,
  saved with the model) and refuses others: its matrices and their bound are for one size.
* Bound of the map actually computed, for any float matrices ``Q̂(f)``: with ``E`` the
  Hermitian completion of the half-plane products, ``y = Re IDFT(E)``, so
  ``‖y‖² ≤ ‖E‖²/(HW) ≤ max_f ‖Q̂(f)‖₂² ‖x̂‖²/(HW) = max_f ‖Q̂(f)‖₂² ‖x‖²`` (Parseval), whether
  or not ``Q̂(−f) = conj Q̂(f)`` holds exactly in floating point.  So a verified bound on
  ``max_f ‖Q̂(f)‖₂`` is a verified Lipschitz bound of the layer (the FFTs' own rounding inside
  a forward pass excepted, as for every FFT-based layer in lipcli).
* Eval lowering (:mod:`lipcli.sdk.lowering`): on one known input shape that exact map of the
  cached ``Q̂(f)`` is one block-circulant matrix; :meth:`FourierConvBase.eval_linear_map`
  builds it in float64 with a guaranteed error bound
  (:func:`lipcli.sdk.lowering_conv.fourier_matrix`) and ``export_module(context)`` runs it
  where it fits and costs at most the Fourier form's operations
  (:func:`lipcli.sdk.lowering_conv.dense_lowering_at_gain`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.convbase import LipConvBase
from lipcli.sdk.errors import LipError
from lipcli.sdk.lowering import LinearMap
from lipcli.sdk.lowering_conv import dense_lowering_at_gain, fourier_matrix, literal_facts


def phases(size: int, k: int, bins: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``e^{2πi f (a − k//2)/size}`` for ``f < bins``, ``a < k``: shape ``(bins, k)`` (exact
    integer phases reduced modulo ``size`` in float64)."""
    f = torch.arange(bins, dtype=torch.float64, device=device)[:, None]
    a = torch.arange(k, dtype=torch.float64, device=device)[None, :] - k // 2
    angle = 2 * math.pi * torch.remainder(f * a, size) / size
    return torch.polar(torch.ones_like(angle), angle).to(dtype)


def kernel_spectrum(kernel: Tensor, size: tuple[int, int]) -> Tensor:
    """``K̂(f)`` for the half-plane bins of an ``H × W`` torus: shape ``(H·(W//2+1), out, in)``
    (complex64 for float32 kernels, complex128 for float64); for a ``1 × 1`` image the real
    ``(1, out, in)`` tap sum."""
    H, W = size
    if H == 1 and W == 1:
        return kernel.sum(dim=(2, 3))[None]
    k = kernel.shape[-1]
    cdtype = torch.complex128 if kernel.dtype == torch.float64 else torch.complex64
    ey = phases(H, k, H, cdtype, kernel.device)
    ex = phases(W, k, W // 2 + 1, cdtype, kernel.device)
    spec = torch.einsum("oiab,ya,xb->yxoi", kernel.to(cdtype), ey, ex)
    return spec.reshape(-1, kernel.shape[0], kernel.shape[1])


class FourierConvBase(LipConvBase):
    """A :class:`~lipcli.sdk.convbase.LipConvBase` whose operator is a batch of matrices
    ``(H·(W//2+1), out, in·s²)`` applied in the Fourier basis (module docstring).  Subclasses
    implement ``compute_operator(size)`` and ``operator_bound(op, size)``."""

    spatial_size: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        self.register_buffer("spatial_size", torch.zeros(2, dtype=torch.int64))
        self._size_seen: tuple[tuple[int, int], tuple[int, int] | None] | None = None

    # ------------------------------------------------------------------ the image size
    def _recorded_size(self) -> tuple[int, int] | None:
        buf = self.spatial_size
        if self._size_seen is None or self._size_seen[0] != (buf._version, buf.data_ptr()):
            h, w = (int(v) for v in buf.tolist())
            self._size_seen = ((buf._version, buf.data_ptr()), (h, w) if h > 0 else None)
        return self._size_seen[1]

    def operator_size(self, size: tuple[int, int]) -> tuple[int, int]:
        recorded = self._recorded_size()
        if recorded is None:
            with torch.no_grad():
                self.spatial_size.copy_(torch.tensor(size, dtype=torch.int64))
            self._size_seen = ((self.spatial_size._version, self.spatial_size.data_ptr()), size)
        elif recorded != size:
            raise ValueError(
                f"{type(self).__name__} was first used with {recorded[0]}x{recorded[1]} images "
                f"(after the stride-2 rearrangement) and got {size[0]}x{size[1]}; its "
                "per-frequency matrices and their bound are for one image size"
            )
        return size

    def bound_size(self) -> tuple[int, int]:
        recorded = self._recorded_size()
        if recorded is None:
            raise LipError(
                f"a {type(self).__name__} layer has not seen an input yet: its matrices and "
                "their bound depend on the image size; run the model on one batch first"
            )
        return recorded

    # ------------------------------------------------------------------ operator
    def apply_operator(self, x: Tensor, op: Tensor) -> Tensor:
        N, C, H, W = x.shape
        if H == 1 and W == 1:
            return F.linear(x.reshape(N, C), op[0]).view(N, -1, 1, 1)
        return self.from_spectrum(op @ self.to_spectrum(x), (H, W))

    @staticmethod
    def to_spectrum(x: Tensor) -> Tensor:
        """``rfft2`` of ``(N, C, H, W)`` as one ``C × N`` matrix per half-plane bin:
        ``(H·(W//2+1), C, N)`` (the layout :meth:`apply_operator` multiplies)."""
        N, C = x.shape[:2]
        return torch.fft.rfft2(x).permute(2, 3, 1, 0).reshape(-1, C, N)

    @staticmethod
    def from_spectrum(Y: Tensor, size: tuple[int, int]) -> Tensor:
        """The inverse of :meth:`to_spectrum` on an ``H × W`` image: ``(bins, C, N)`` →
        ``irfft2`` as ``(N, C, H, W)``."""
        H, W = size
        C, N = Y.shape[-2:]
        return torch.fft.irfft2(Y.reshape(H, W // 2 + 1, C, N).permute(3, 2, 0, 1), s=(H, W))

    # ------------------------------------------------------------------ eval lowering
    def eval_linear_map(self, input_shape: tuple[int, ...]) -> LinearMap | None:
        """The eval map on inputs of ``input_shape`` (``(in, H, W)``, before the rearrangement)
        as a dense float64 matrix (:mod:`lipcli.sdk.lowering`): block circulant, built from
        the cached eval matrices ``Q̂(f)`` (the very tensor :meth:`lipschitz_upper_bound`
        bounds) by :func:`lipcli.sdk.lowering_conv.fourier_matrix`, whose ``error`` is a
        guaranteed bound on its distance to the exact map ``x ↦ irfft2(Q̂ · rfft2(x))``
        (``0`` on ``1 × 1`` images).  ``None`` when the layer has not recorded this image
        size (no bound exists for another size)."""
        shape = tuple(int(d) for d in input_shape)
        s = self.stride
        if len(shape) != 3 or shape[0] != self.in_channels or shape[1] % s or shape[2] % s:
            return None
        size = (shape[1] // s, shape[2] // s)
        if self._recorded_size() != size:
            return None
        with torch.no_grad():
            matrix, error = fourier_matrix(self.eval_operator(size), size, self.in_channels, s)
        return LinearMap(matrix, self.bias.detach(), (self.out_channels, *size), error, self.bias.dtype)

    def literal_flops(self, size: tuple[int, int]) -> int:
        """Operations per example of the Fourier form on the rearranged ``size`` (a cost
        model): one complex ``out × in·s²`` product per half-plane bin (8 per complex
        multiply-add) and ``2.5·N·log₂N`` per channel for each real FFT; ``2·out·in·s²`` on
        ``1 × 1`` images."""
        H, W = size
        n, cin, cout = H * W, self.conv_in_channels, self.out_channels
        if n == 1:
            return 2 * cout * cin
        fft = math.ceil(2.5 * n * math.log2(n)) * (cin + cout)
        return 8 * H * (W // 2 + 1) * cout * cin + fft

    def export_module(self, context: Any = None) -> nn.Module:
        """``lip export`` and the eval lowering: with ``context`` (an
        :class:`~lipcli.sdk.lowering.LoweringContext`), the dense matrix of
        :meth:`eval_linear_map` when it fits and pays
        (:func:`~lipcli.sdk.lowering_conv.dense_lowering_at_gain`); otherwise the eval matrices for the
        recorded image size (the cached ones the layer applies and is bounded for) and the
        bias baked into :class:`ExportedFourierConv` (FFT form for pt2/TorchScript, real
        matrix products for ONNX; imports nothing but torch)."""
        from lipcli.sdk.fourier_export import ExportedFourierConv

        size = self.bound_size()  # LipError before the layer has seen an input
        facts: dict[str, Any] = {}
        if context is not None:
            shape = tuple(int(d) for d in context.input_shape)
            flops = self.literal_flops(size)
            out_shape = (self.out_channels, *size)
            dense = dense_lowering_at_gain(self, context, flops, out_shape)
            if dense is not None:
                return dense
            facts = literal_facts("fourier", shape, out_shape, flops)
        with torch.no_grad():
            stand_in = ExportedFourierConv(self.eval_operator(size), self.bias, size=size, stride=self.stride)
        if facts:
            stand_in.export_lowering = facts
        return stand_in
