"""The SLL convolution as ``lip export`` writes it: plain torch operations, tensors baked.

In eval mode an :class:`lipcli_sll.conv.SLLConv` is ``z − Cᵀ(2s ⊙ ReLU(C z + b))`` with
``z`` the input after ``pixel_unshuffle`` (stride 2) and zero channels appended (the first
``out`` channels of the result kept when there are more), ``C`` the
convolution with the filter ``K`` (zero "same" padding), ``Cᵀ`` the transposed convolution
and ``s`` the cached scales ``1/T`` (the very tensor the layer applies and its bound is
computed for).  :class:`ExportedSLL` stores ``K``, ``b`` and ``2s`` as buffers and applies
them with ``conv2d`` / ``relu`` / ``conv_transpose2d`` (ONNX ``Conv``, ``Relu``,
``ConvTranspose``).  This module imports nothing but torch.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class ExportedSLL(nn.Module):
    """``z − conv_transpose2d(2s ⊙ relu(conv2d(z, K, b)), K)`` with fixed tensors."""

    def __init__(self, weight: Tensor, bias: Tensor, scale: Tensor, *, stride: int,
                 extra_channels: int, out_channels: int) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())
        self.register_buffer("scale2", (2.0 * scale.detach()).reshape(1, -1, 1, 1).clone().contiguous())
        self.stride = int(stride)
        self.extra_channels = int(extra_channels)
        self.out_channels = int(out_channels)
        self.crop = self.out_channels < int(weight.shape[1])
        self.padding = int(weight.shape[-1]) // 2

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        if self.extra_channels:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        z = F.relu(F.conv2d(x, self.weight, self.bias, padding=self.padding))
        y = x - F.conv_transpose2d(z * self.scale2, self.weight, padding=self.padding)
        return y[:, : self.out_channels] if self.crop else y

    def extra_repr(self) -> str:
        hidden, channels, k, _ = self.weight.shape
        return f"{channels} channels, hidden={hidden}, kernel_size={k}, stride={self.stride}"
