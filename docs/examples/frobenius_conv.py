"""A complete convolution plugin on ``LipConvBase``: ``fnorm`` (``lip train --conv fnorm``).

docs/plugins.md shows this file verbatim; tests/test_docs.py runs lipcli.testing's convolution,
network-bound, model-file and export checks on it.

Maths: with zero "same" padding the layer's linear part is ``y = Σ_t S_t K_t x`` over the
``k²`` taps ``t`` of the filter (``K_t`` a channel matrix, ``S_t`` a shift that fills in zeros,
norm ≤ 1), so ``‖y‖ ≤ Σ_t ‖K_t‖₂ ‖x‖ ≤ Σ_t ‖K_t‖_F ‖x‖ ≤ k ‖K‖_F ‖x‖`` (Cauchy–Schwarz over
the taps).  The layer convolves with ``K / max(1, k ‖K‖_F)``: at most 1 in exact arithmetic.
Its declared bound certifies the float filter as used, with lipcli's verified Gram bound.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.gram_bounds import conv_gram_norm_upper_bound
from lipcli.sdk.convbase import LipConvBase
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ConvSpec


class FrobeniusConv(LipConvBase):
    """``(N, in, H, W) → (N, out, H/s, W/s)``; stride 2, the bias and the cached eval filter
    and bound come from :class:`LipConvBase`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        k, cin = self.kernel_size, self.conv_in_channels  # 4·in for stride 2
        std = 1.0 / (k * math.sqrt(out_channels * cin * k * k))  # k·‖K‖_F ≈ 1
        self.weight = nn.Parameter(torch.randn(out_channels, cin, k, k) * std)

    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        """The scaled filter (differentiable; cached in eval mode)."""
        return self.weight / (self.kernel_size * torch.linalg.vector_norm(self.weight)).clamp_min(1.0)

    def apply_operator(self, x: Tensor, op: Tensor) -> Tensor:
        """The linear map without bias on the (rearranged) input."""
        return F.conv2d(x, op, padding=self.kernel_size // 2)

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        """GUARANTEED bound on the l2 norm of the convolution with the float filter ``op``."""
        return conv_gram_norm_upper_bound(op)

    def export_module(self, context: object = None) -> nn.Module:
        """``lip export``: the eval layer with its filter and bias baked (no parameters)."""
        return ExportedFrobeniusConv(self.eval_operator(), self.bias, self.stride)


class ExportedFrobeniusConv(nn.Module):
    """Plain torch operations: rearrangement, convolution with a fixed filter, bias."""

    def __init__(self, filt: Tensor, bias: Tensor, stride: int) -> None:
        super().__init__()
        self.register_buffer("filt", filt.detach().clone())
        self.register_buffer("bias", bias.detach().clone())
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        y = F.conv2d(x, self.filt, padding=self.filt.shape[-1] // 2)
        return y + self.bias.view(1, -1, 1, 1)


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [ConvSpec(name="fnorm", factory=FrobeniusConv,
                     description="convolution scaled to k·‖K‖_F ≤ 1 (bound: lipcli's verified Gram bound)")]
