"""The Sandwich convolution as ``lip export`` writes it: two Fourier convolutions with fixed
per-bin matrices (lipcli's :class:`~lipcli.sdk.fourier_export.ExportedFourierConv`, real matrix
products under ONNX) and a ReLU between: ``irfft2(a·rfft2(ReLU(irfft2(b·rfft2(x)) + bias)))``
with ``b = √2Ψ⁻¹B̃`` and ``a = √2ÃᴴΨ``, the very tensors the eval layer caches."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.fourier_export import ExportedFourierConv


class ExportedSandwich(nn.Module):
    def __init__(self, op1: Tensor, op2: Tensor, bias: Tensor, *, size: tuple[int, int], stride: int) -> None:
        super().__init__()
        self.stride = int(stride)
        self.first = ExportedFourierConv(op1, bias, size=size, stride=1)
        self.second = ExportedFourierConv(op2, torch.zeros_like(bias), size=size, stride=1)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        return self.second(F.relu(self.first(x)))
