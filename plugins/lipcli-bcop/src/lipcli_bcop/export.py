"""The BCOP convolution as ``lip export`` writes it: the converged orthogonal filter, baked.

In eval mode a BCOP layer convolves (circular padding, after ``pixel_unshuffle`` for stride 2)
with the filter from Björck's iteration run to convergence in float64
(:meth:`lipcli_bcop.bcop.BCOPConv.compute_eval_operator`, the very tensor the layer caches
and its bound is computed for).  :class:`ExportedBCOP` stores that filter and the bias as
buffers: no Björck iteration, no parametrisation, one ordinary convolution in the
``torch.export`` / TorchScript / ONNX program.  Circular padding is written as index
gathers with constant indices (the image size is fixed when the program is traced), which
every runtime has and which also covers filters wider than the image.  On ``1 × 1`` images
the circular convolution is the sum of the taps, a matrix.  This module imports nothing but
torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ExportedBCOP(nn.Module):
    """Circular ``conv2d(pixel_unshuffle(x), filter) + bias`` with fixed tensors."""

    def __init__(self, filt: Tensor, bias: Tensor, *, stride: int) -> None:
        super().__init__()
        self.register_buffer("filter", filt.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())
        # every tap meets the one pixel of a 1x1 torus
        self.register_buffer("taps_sum", filt.detach().sum(dim=(2, 3)).contiguous())
        self.stride = int(stride)
        self.half = int(filt.shape[-1]) // 2

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        h, w = int(x.shape[-2]), int(x.shape[-1])  # fixed when the program is traced/exported
        if h == 1 and w == 1:
            n = x.shape[0]
            return F.linear(x.reshape(n, -1), self.taps_sum, self.bias).reshape(n, -1, 1, 1)
        p = self.half
        if p > 0:
            rows = torch.arange(-p, h + p, device=x.device) % h
            cols = torch.arange(-p, w + p, device=x.device) % w
            x = x.index_select(2, rows).index_select(3, cols)
        return F.conv2d(x, self.filter, self.bias)

    def extra_repr(self) -> str:
        out, cin, k, _ = self.filter.shape
        return f"{cin}, {out}, kernel_size={k}, stride={self.stride} (after the rearrangement), circular"
