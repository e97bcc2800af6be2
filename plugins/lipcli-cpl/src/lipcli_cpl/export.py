"""CPL layers as ``lip export`` writes them: plain torch operations, tensors baked.

In eval mode a CPL layer is ``z − h·Wᵀ ReLU(W z + b)`` with the cached step ``h`` (the very
tensor the layer applies and its bound is computed for); :class:`ExportedCPL` (the
convolution, with its rearrangement, zero channels and crop) and :class:`ExportedCPLLinear`
store the filter, the bias and ``h`` as buffers and apply them with ``conv2d`` / ``relu`` /
``conv_transpose2d`` (or ``linear`` / ``matmul``).  This module imports nothing but torch.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class ExportedCPL(nn.Module):
    """``z − h·conv_transpose2d(relu(conv2d(z, K, b)), K)`` with fixed tensors."""

    def __init__(self, kernel: Tensor, bias: Tensor, h: Tensor, *, stride: int, extra_channels: int,
                 out_channels: int) -> None:
        super().__init__()
        self.register_buffer("kernel", kernel.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())
        self.register_buffer("h", h.detach().reshape(()).clone())
        self.stride, self.extra_channels, self.out_channels = int(stride), int(extra_channels), int(out_channels)
        self.crop = self.out_channels < int(kernel.shape[1])
        self.padding = int(kernel.shape[-1]) // 2

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        if self.extra_channels:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        z = F.relu(F.conv2d(x, self.kernel, self.bias, padding=self.padding))
        y = x - self.h * F.conv_transpose2d(z, self.kernel, padding=self.padding)
        return y[:, : self.out_channels] if self.crop else y


class ExportedCPLLinear(nn.Module):
    """``x − h·relu(x Wᵀ + b) W`` with fixed tensors."""

    def __init__(self, kernel: Tensor, bias: Tensor, h: Tensor) -> None:
        super().__init__()
        self.register_buffer("kernel", kernel.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())
        self.register_buffer("h", h.detach().reshape(()).clone())

    def forward(self, x: Tensor) -> Tensor:
        return x - self.h * (F.relu(F.linear(x, self.kernel, self.bias)) @ self.kernel)
