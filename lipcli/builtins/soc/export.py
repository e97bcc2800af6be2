"""The SOC layer as ``lip export`` writes it: its fixed series of plain convolutions, or
the same linear map as one dense matrix.

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
With the input shape known (``lip export``), the series runs in channels-last memory format on
images of at least :data:`lipcli.builtins.soc.settings.CHANNELS_LAST_MIN_PIXELS` pixels, as in
the layer on CPU (the convolutions of few channels on large images are about twice as fast
there; a layout only, same values).

**Dense lowering** (:class:`~lipcli.sdk.lowering.DenseOperator`, the SDK's eval lowering).  The exported program's input size is fixed, so the
layer's linear part ``x ↦ trunc(P_T(S) pad(unshuffle(x)))`` is a fixed matrix ``M`` of size
``(c_out·H'·W') × (c_in·H·W)``.  On the small images of the later LipConvnet blocks (many
channels, few pixels) one matrix product with ``M`` costs far fewer operations than
``T − 1`` convolutions (LipConvnet-5 at width 16: 8.4 against 264 MFLOP per image at 4×4
inputs).  :func:`operator_matrix` computes ``M`` as the layer's eval series defines it, in
float64 with the float32 eval filter cast exactly: the Horner recurrence
``u ← x + S(u)/i`` (SPEC §1.4) on all basis images of the input at once, the convolution
with ``S`` on ``H'×W'`` images written as its (exact) matrix; the result is rounded once to
float32.  It is the same linear map
``P_T(S)`` whose Lipschitz bound the model certifies (SPEC §5), up to float32 rounding, as
the series lowering is.  :func:`lower_soc` takes the dense form when its matrix fits the
export's cap (``lip export --dense-max-mib``) and costs at most a quarter of the series'
operations (:data:`DENSE_MIN_GAIN`); otherwise the series.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.builtins.soc import settings
from lipcli.numerics.rounding import gamma, round_up
from lipcli.sdk.lowering import DENSE_MIN_GAIN, DenseOperator, LinearMap, dense_lowering

__all__ = ["DENSE_MIN_GAIN", "DenseSOC", "ExportedSOC", "linear_map", "lower_soc", "operator_matrix",
           "operator_matrix_with_error"]

class ExportedSOC(nn.Module):
    """``P_T(S)`` applied by ``T − 1`` plain convolutions, plus the bias (see module doc)."""

    def __init__(self, filt: Tensor, bias: Tensor, *, terms: int, stride: int, in_channels: int,
                 out_channels: int, channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = bool(channels_last)
        self.register_buffer("filter", filt.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().view(1, -1, 1, 1))
        self.terms = int(terms)
        self.stride = int(stride)
        self.channels = int(filt.shape[0])
        self.extra = self.channels - int(in_channels) * self.stride**2
        self.out_channels = int(out_channels)
        self.padding = int(filt.shape[-1]) // 2

    @classmethod
    def from_layer(cls, layer: nn.Module, channels_last: bool = False) -> "ExportedSOC":
        """The eval-mode operator of a :class:`lipcli.builtins.soc.layer.SOC` layer
        (``channels_last``: the series runs in channels-last memory format)."""
        with torch.no_grad():
            return cls(layer.skew_filter(), layer.bias, terms=layer.eval_terms, stride=layer.stride,
                       in_channels=layer.in_channels, out_channels=layer.out_channels,
                       channels_last=channels_last)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        if self.extra > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra))
        if x.shape[-1] == 1 and x.shape[-2] == 1:  # fixed when the program is traced/exported
            n = x.shape[0]
            x2 = x.reshape(n, self.channels)
            centre_t = self.filter[:, :, self.padding, self.padding].t()  # a view: the filter's
            u2 = x2                                      # centre tap is the whole convolution
            for i in range(self.terms - 1, 0, -1):
                u2 = torch.addmm(x2, u2, centre_t, alpha=1.0 / i)
            u = u2.reshape(n, self.channels, 1, 1)
        else:
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            u = x
            for i in range(self.terms - 1, 0, -1):
                u = torch.add(x, F.conv2d(u, self.filter, padding=self.padding), alpha=1.0 / i)
        if self.out_channels < self.channels:
            u = u[:, : self.out_channels]
        return u + self.bias

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, out_channels={self.out_channels}, stride={self.stride}, "
                f"terms={self.terms}, channels_last={self.channels_last}")


#: the dense form (kept under its old name)
DenseSOC = DenseOperator


def output_shape(layer: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(c_out, H/s, W/s)`` of ``layer`` on one input of shape ``(c_in, H, W)``."""
    _, h, w = input_shape
    return (int(layer.out_channels), int(h) // layer.stride, int(w) // layer.stride)


def series_flops(layer: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-adds ×2 of the series lowering per input example: ``T − 1`` convolutions
    with the ``C×C×k×k`` filter on ``H'×W'`` images (the centre tap alone on ``1×1`` images)."""
    _, h, w = output_shape(layer, input_shape)
    C, k = int(layer.channels), int(layer.kernel_size)
    taps = 1 if h == 1 and w == 1 else k * k
    return 2 * (int(layer.eval_terms) - 1) * C * C * taps * h * w


def conv_matrix(S: Tensor, h: int, w: int) -> Tensor:
    """The matrix ``(C·h·w) × (C·h·w)`` of ``u ↦ conv2d(u, S, padding=k//2)`` on ``h×w``
    images (zero padding, channel-major flattening): its entries are entries of ``S``
    (copied, exact), ``A[(o,y,x),(i,y',x')] = S[o, i, y'−y+k//2, x'−x+k//2]`` where in range."""
    C, k = int(S.shape[0]), int(S.shape[-1])
    p = k // 2
    A = S.new_zeros(C, h, w, C, h, w)
    for a in range(k):
        for y in range(max(0, p - a), min(h, h + p - a)):
            for b in range(k):
                for x in range(max(0, p - b), min(w, w + p - b)):
                    A[:, y, x, :, y + a - p, x + b - p] = S[:, :, a, b]
    return A.reshape(C * h * w, C * h * w)


@torch.no_grad()
def operator_matrix(layer: nn.Module, input_shape: tuple[int, ...]) -> Tensor:
    """``M`` (float64, ``(c_out·H'·W') × (c_in·H·W)``) with ``layer(x) = M·vec(x) + bias``
    in eval mode on inputs of shape ``input_shape = (c_in, H, W)`` (see
    :func:`operator_matrix_with_error`)."""
    return operator_matrix_with_error(layer, input_shape)[0]


@torch.no_grad()
def operator_matrix_with_error(layer: nn.Module, input_shape: tuple[int, ...],
                               norm_bound: float | None = None) -> tuple[Tensor, float]:
    """``(M, e)``: ``M`` as in :func:`operator_matrix` and ``e ≥ ‖M − P_T(S)‖₂`` (the exact
    map on these inputs, whose norm the layer's bound covers), the float64 rounding of the
    recurrence.

    The layer's eval series in float64 (its eval filter ``S`` cast exactly), on the whole
    identity basis at once: ``X`` = the unshuffled, channel-padded basis images as rows (0/1,
    exact), ``A`` = :func:`conv_matrix` of ``S`` (exact copies), then Horner
    ``U ← X + U·Aᵀ/i`` for ``i = T−1 … 1`` (SPEC §1.4; ``T − 1`` matrix products, the rows of
    ``U`` are the layer's outputs on the basis images), truncated to ``c_out`` channels.

    Error (Higham §3.5, :mod:`lipcli.numerics.rounding`): one ``addmm`` with inner dimension
    ``n`` and the rounded ``α = fl(1/i)`` is entrywise off by at most
    ``γ_{n+3}(|X| + |U||A|ᵀ/i)``, in Frobenius norm ``δ_i ≤ γ_{n+3}(‖X‖_F + ‖Û‖_F‖A‖_F/i)``;
    the error carried from the previous step grows by at most ``‖A‖₂/i ≤ b/i`` with ``b``
    (``norm_bound``, default :meth:`SOC.spectral_bound`) the guaranteed bound on ``‖S‖₂`` that
    also bounds the zero-padded convolution on a finite image.  So ``E ← E·b/i + δ_i`` and
    ``‖M − P‖₂ ≤ ‖M − P‖_F ≤ E`` (truncating channels does not increase it); every scalar
    operation is rounded up by :func:`~lipcli.numerics.rounding.round_up`."""
    S = layer.skew_filter().to(torch.float64)
    b = float(layer.spectral_bound()) if norm_bound is None else float(norm_bound)
    d_in = math.prod(input_shape)
    basis = torch.eye(d_in, dtype=torch.float64).view(d_in, *input_shape)
    X = layer._prepare_input(basis).contiguous()
    _, C, h, w = X.shape
    X = X.view(d_in, C * h * w)
    A_t = conv_matrix(S, h, w).T
    g = gamma(C * h * w + 3)
    up = 1.0 + 2.0 * gamma(A_t.numel() + 2)
    a_fro = math.sqrt(float(A_t.square().sum()) * up) * up
    x_fro = math.sqrt(d_in)
    err = 0.0
    U = X
    for i in range(int(layer.eval_terms) - 1, 0, -1):
        u_fro = math.sqrt(float(U.square().sum()) * up) * up
        err = round_up(err * b / i + g * (x_fro + u_fro * a_fro / i))
        U = torch.addmm(X, U, A_t, alpha=1.0 / i)
    U = U.view(d_in, C, h, w)[:, : int(layer.out_channels)]
    return U.reshape(d_in, -1).T.contiguous(), err


def linear_map(layer: nn.Module, input_shape: tuple[int, ...]) -> LinearMap:
    """The SDK's :class:`~lipcli.sdk.lowering.LinearMap` of a SOC layer on ``input_shape``."""
    shape = tuple(int(d) for d in input_shape)
    matrix, err = operator_matrix_with_error(layer, shape)
    return LinearMap(matrix, layer.bias.detach(), output_shape(layer, shape), err, layer.bias.dtype)


def lower_soc(layer: nn.Module, context: Any = None) -> nn.Module:
    """The export (and eval) stand-in of a SOC layer: a dense
    :class:`~lipcli.sdk.lowering.DenseOperator` when ``context`` (an
    :class:`~lipcli.sdk.export.ExportContext`) gives the input shape, the float32 matrix fits
    ``context.dense_max_bytes`` and one matrix product costs at most ``1/DENSE_MIN_GAIN`` of
    the series' operations (:func:`~lipcli.sdk.lowering.dense_lowering`); else
    :class:`ExportedSOC`.  The choice is described in the returned module's
    ``export_lowering``."""
    series = ExportedSOC.from_layer(layer)
    if context is None:
        series.export_lowering = {"lowering": "series", "convolutions": series.terms - 1}
        return series
    shape = tuple(int(d) for d in context.input_shape)
    out = output_shape(layer, shape)
    conv_flops = series_flops(layer, shape)
    dense = dense_lowering(layer, context, conv_flops, out)
    if dense is not None:
        return dense
    d_in, d_out = math.prod(shape), math.prod(out)
    facts = {"input_shape": list(shape), "output_shape": list(out),
             "series_flops_per_image": conv_flops, "dense_flops_per_image": 2 * d_in * d_out,
             "dense_mib": 4 * d_in * d_out / 2**20}
    min_pixels = settings.CHANNELS_LAST_MIN_PIXELS
    series.channels_last = min_pixels is not None and out[1] * out[2] >= min_pixels
    series.export_lowering = {"lowering": "series", "convolutions": series.terms - 1,
                              "channels_last": series.channels_last, **facts}
    return series
