"""The SOC layer as ``lip export`` writes it: its fixed series of plain convolutions.

In eval mode a SOC layer is the linear map ``z = P_T(S) x + bias`` with the eval filter
``S = A/σ`` (σ from the stored power vectors) and ``T = eval_terms`` (SPEC §1.4), after
``pixel_unshuffle`` (stride 2) and zero channel padding, keeping the first ``c_out``
channels (SPEC §1.3).  :class:`ExportedSOC` evaluates exactly that with ``conv2d``, ``mul``
and ``add`` only (Horner: ``u ← x + conv(u, S)·(1/i)`` for ``i = T−1 … 1``), so that
``torch.export``, TorchScript and ONNX see ``T − 1`` ordinary convolutions with the
current ``S`` as a constant.  Each step is one convolution and one ``add`` with ``alpha``
(``x + (1/i)·conv``: one elementwise pass, not a multiply then an add); on ``1×1`` images
(the last blocks of LipConvnet) the convolution is the filter's centre tap, a matrix, and the
step one ``addmm`` as in the layer itself.  Same values as the layer up to float32 rounding
(the layer may fuse the add into the convolution or scale the filter instead of the output).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ExportedSOC(nn.Module):
    """``P_T(S)`` applied by ``T − 1`` plain convolutions, plus the bias (see module doc)."""

    def __init__(self, filt: Tensor, bias: Tensor, *, terms: int, stride: int, in_channels: int,
                 out_channels: int) -> None:
        super().__init__()
        self.register_buffer("filter", filt.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().view(1, -1, 1, 1))
        self.terms = int(terms)
        self.stride = int(stride)
        self.channels = int(filt.shape[0])
        self.extra = self.channels - int(in_channels) * self.stride**2
        self.out_channels = int(out_channels)
        self.padding = int(filt.shape[-1]) // 2
        # the filter's centre tap, transposed: the whole convolution on 1x1 images
        centre = filt.detach()[:, :, self.padding, self.padding]
        self.register_buffer("centre_t", centre.t().contiguous())

    @classmethod
    def from_layer(cls, layer: nn.Module) -> "ExportedSOC":
        """The eval-mode operator of a :class:`lipcli.builtins.soc.layer.SOC` layer."""
        with torch.no_grad():
            return cls(layer.skew_filter(), layer.bias, terms=layer.eval_terms, stride=layer.stride,
                       in_channels=layer.in_channels, out_channels=layer.out_channels)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        if self.extra > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra))
        if x.shape[-1] == 1 and x.shape[-2] == 1:  # fixed when the program is traced/exported
            n = x.shape[0]
            x2 = x.reshape(n, self.channels)
            u2 = x2
            for i in range(self.terms - 1, 0, -1):
                u2 = torch.addmm(x2, u2, self.centre_t, alpha=1.0 / i)
            u = u2.reshape(n, self.channels, 1, 1)
        else:
            u = x
            for i in range(self.terms - 1, 0, -1):
                u = torch.add(x, F.conv2d(u, self.filter, padding=self.padding), alpha=1.0 / i)
        if self.out_channels < self.channels:
            u = u[:, : self.out_channels]
        return u + self.bias

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, out_channels={self.out_channels}, stride={self.stride}, "
                f"terms={self.terms}")
