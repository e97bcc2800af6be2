"""A Fourier-domain convolution as ``lip export`` writes it: its per-frequency matrices, baked.

(Used by :class:`lipcli.sdk.fourier.FourierConvBase`, i.e. lipcli-cayley, lipcli-bro and
lipcli-lot; torch only, so the exported program needs no lipcli.)

In eval mode the layer is ``y = irfft2(Q · rfft2(x)) + bias`` (after ``pixel_unshuffle``
for stride 2) with fixed matrices ``Q(f)`` for the half-plane bins of the recorded image size
``H × W`` (the very tensor the layer caches and its bound is computed for).
:class:`ExportedFourierConv` stores ``Q`` as the real block matrices
``[[Re Q, −Im Q], [Im Q, Re Q]]`` and has two ways to apply it, chosen when the program is
written:

* **pt2 and TorchScript** (torch runs the program): exactly the layer's computation,
  ``rfft2``, one batched complex matrix product per bin (``Q`` reassembled from its real
  and imaginary parts), ``irfft2`` — the same cost as the layer;
* **ONNX** (``torch.onnx.is_in_onnx_export()``): ONNX has no general complex tensors and
  onnxruntime's ``DFT`` is slow, so the same linear map is written with real matrix
  products only, with ``F = W//2 + 1`` half-plane columns:

  1. the real DFT along ``W``: ``x @ [cos | −sin]`` (``W × 2F``) gives ``Re, Im`` of
     ``rfft(x)``;
  2. the complex DFT along ``H`` as one real ``2H × 2H`` matrix ``[[C, S], [−S, C]]``
     acting on ``[Re; Im]`` (``C_{fh} = cos 2πfh/H``, ``S`` the sines);
  3. per frequency, the real ``2·out × 2·in`` block of ``Q(f)``;
  4. the inverse complex DFT along ``H``, ``(1/H)[[Cᵀ, −Sᵀ], [Sᵀ, Cᵀ]]``;
  5. the complex-to-real inverse along ``W``: ``[Re | Im] @ [[w·cos/W], [−w·sin/W]]`` with
     the Hermitian weights ``w = 1`` for the DC and Nyquist columns, ``2`` otherwise (the
     imaginary parts of those columns drop out, as in ``irfft``).

  The matrices are computed in float64 from exact integer phases and stored in the layer's
  dtype.

On ``1 × 1`` images only the real DC bin exists: ``y = Q x + bias`` in every format.  This
module imports nothing but torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _cos_sin(rows: int, cols: int, period: int) -> tuple[Tensor, Tensor]:
    """``cos, sin`` of ``2π·(r·c mod period)/period`` for ``r < rows``, ``c < cols`` (float64)."""
    r = torch.arange(rows, dtype=torch.float64)[:, None]
    c = torch.arange(cols, dtype=torch.float64)[None, :]
    angle = 2 * math.pi * torch.remainder(r * c, period) / period
    return torch.cos(angle), torch.sin(angle)


def fourier_matrices(height: int, width: int) -> dict[str, Tensor]:
    """The real matrices of steps 1, 2, 4 and 5 (module docstring), float64."""
    bins = width // 2 + 1
    cw, sw = _cos_sin(width, bins, width)  # (W, F)
    ch, sh = _cos_sin(height, height, height)  # (H, H), symmetric
    weight = torch.full((bins,), 2.0, dtype=torch.float64)
    weight[0] = 1.0
    if width % 2 == 0:
        weight[-1] = 1.0
    return {
        "forward_w": torch.cat([cw, -sw], dim=1),
        "forward_h": torch.cat([torch.cat([ch, sh], 1), torch.cat([-sh, ch], 1)], 0),
        "inverse_h": torch.cat([torch.cat([ch.T, -sh.T], 1), torch.cat([sh.T, ch.T], 1)], 0) / height,
        "inverse_w": torch.cat([cw.T * weight[:, None], -sw.T * weight[:, None]], 0) / width,
    }


class ExportedFourierConv(nn.Module):
    """``irfft2(Q · rfft2(x)) + bias`` with ``Q`` fixed (module docstring).

    ``op`` is the layer's eval operator: complex ``(H·(W//2+1), out, in)`` or, for a
    ``1 × 1`` image, real ``(1, out, in)``; ``size`` is ``(H, W)`` after the rearrangement.
    """

    def __init__(self, op: Tensor, bias: Tensor, *, size: tuple[int, int], stride: int) -> None:
        super().__init__()
        self.stride = int(stride)
        self.height, self.width = (int(s) for s in size)
        self.bins = self.width // 2 + 1
        self.out_channels = int(op.shape[1])
        self.in_channels = int(op.shape[2])
        dtype = bias.dtype
        self.register_buffer("bias", bias.detach().clone().contiguous())
        if self.height == 1 and self.width == 1:
            self.register_buffer("matrix", op.detach()[0].real.to(dtype).clone().contiguous())
            return
        q = op.detach()
        block = torch.cat([torch.cat([q.real, -q.imag], 2), torch.cat([q.imag, q.real], 2)], 1)
        self.register_buffer("mixing", block.to(dtype).contiguous())  # (H·F, 2·out, 2·in)
        for name, m in fourier_matrices(self.height, self.width).items():
            self.register_buffer(name, m.to(dtype).contiguous())

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        n = x.shape[0]
        if self.height == 1 and self.width == 1:
            return F.linear(x.reshape(n, -1), self.matrix, self.bias).reshape(n, -1, 1, 1)
        y = self.real_products(x) if torch.onnx.is_in_onnx_export() else self.fourier(x)
        return y + self.bias.view(1, -1, 1, 1)

    def fourier(self, x: Tensor) -> Tensor:
        """The layer's own computation (FFTs and complex products), without the bias."""
        n, cin, cout, h, w = x.shape[0], self.in_channels, self.out_channels, self.height, self.width
        q = torch.complex(self.mixing[:, :cout, :cin], self.mixing[:, cout:, :cin])
        spectrum = torch.fft.rfft2(x).permute(2, 3, 1, 0).reshape(-1, cin, n)
        mixed = (q @ spectrum).reshape(h, self.bins, cout, n).permute(3, 2, 0, 1)
        return torch.fft.irfft2(mixed, s=(h, w))

    def real_products(self, x: Tensor) -> Tensor:
        """The same map with real matrix products only (module docstring), without the bias."""
        n, cin, cout, h, f = x.shape[0], self.in_channels, self.out_channels, self.height, self.bins
        a = x @ self.forward_w  # (N, in, H, 2F): Re | Im of the DFT along W
        spectrum = self.forward_h @ torch.cat([a[..., :f], a[..., f:]], dim=2)  # (N, in, 2H, F)
        spectrum = spectrum.reshape(n, cin, 2, h, f).permute(3, 4, 2, 1, 0).reshape(h * f, 2 * cin, n)
        mixed = self.mixing @ spectrum  # (H·F, 2·out, N)
        mixed = mixed.reshape(h, f, 2, cout, n).permute(4, 3, 2, 0, 1).reshape(n, cout, 2 * h, f)
        z = self.inverse_h @ mixed  # (N, out, 2H, F): Re; Im of the inverse DFT along H
        return torch.cat([z[:, :, :h], z[:, :, h:]], dim=-1) @ self.inverse_w  # (N, out, H, W)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, size={self.height}x{self.width}, "
                f"stride={self.stride} (after the rearrangement)")
