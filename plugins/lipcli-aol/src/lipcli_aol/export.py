"""The AOL convolution as ``lip export`` writes it: one plain ``conv2d``.

In eval mode an AOL layer is ``conv2d(rearrange(x), K·D) + bias`` with the rescaled filter
``K·D`` fixed (:func:`lipcli_aol.aol.aol_rescale`, the very tensor the layer caches), zero
"same" padding, after ``pixel_unshuffle`` for stride 2.  :class:`ExportedAOL` stores that
filter and the bias as buffers and applies them with torch operations only, so the
``torch.export`` / TorchScript / ONNX program contains one ordinary convolution (a matrix
product on ``1 × 1`` images, where only the centre tap meets the image).  This module
imports nothing but torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ExportedAOL(nn.Module):
    """``conv2d(pixel_unshuffle(x), filter, bias, padding=k//2)`` with fixed tensors."""

    def __init__(self, filt: Tensor, bias: Tensor, *, stride: int) -> None:
        super().__init__()
        self.register_buffer("filter", filt.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())
        self.stride = int(stride)
        self.padding = int(filt.shape[-1]) // 2
        # the centre tap: the whole convolution on 1x1 images (zero padding)
        centre = filt.detach()[:, :, self.padding, self.padding]
        self.register_buffer("centre", centre.clone().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        if x.shape[-1] == 1 and x.shape[-2] == 1:  # fixed when the program is traced/exported
            n = x.shape[0]
            return F.linear(x.reshape(n, -1), self.centre, self.bias).reshape(n, -1, 1, 1)
        return F.conv2d(x, self.filter, self.bias, padding=self.padding)

    def extra_repr(self) -> str:
        out, cin, k, _ = self.filter.shape
        return f"{cin}, {out}, kernel_size={k}, stride={self.stride} (after the rearrangement)"
