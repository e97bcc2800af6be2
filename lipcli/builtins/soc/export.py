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
export's cap (``lip export --dense-max-mib``), costs at most ``1/DENSE_MIN_GAIN`` of the
series' operations and its build pays off on the inputs it will run on
(:func:`~lipcli.sdk.lowering.pays_off`, build cost :func:`build_plan`); otherwise the series.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.builtins.soc import settings
from lipcli.numerics.rounding import gamma, norm_from_squares, round_up
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


#: float64 working memory (bytes) of one chunk of basis images in :func:`operator_matrix_with_error`
BUILD_CHUNK_BYTES = 64 * 2**20


def _taps(k: int, side: int) -> tuple[int, int]:
    """``(first, count)``: the taps of a size-``k`` filter (padding ``k//2``) that ever meet
    an image of ``side`` pixels (offsets ``|t − k//2| < side``); the others only meet padding."""
    count = min(k, 2 * side - 1)
    return k // 2 - count // 2, count


def build_plan(layer: nn.Module, input_shape: tuple[int, ...]) -> tuple[str, int, int]:
    """``(method, n, flops)`` of :func:`operator_matrix_with_error` on ``input_shape``:
    ``"im2col"`` (the convolution applied to the basis images as an explicit im2col and one
    float64 matrix product with inner dimension ``n = C·kh·kw``, the taps that meet the image)
    or ``"dense"`` (the ``(C·h·w)²`` convolution matrix, inner dimension ``n = C·h·w``),
    whichever has the smaller ``n``; ``flops`` (×2 multiply-adds) of the whole build,
    ``(T − 1)·2·d_in·C·h·w·n``."""
    c_in, H, W = (int(d) for d in input_shape)
    s = int(layer.stride)
    C, k, h, w = int(layer.channels), int(layer.kernel_size), H // s, W // s
    n_conv = C * _taps(k, h)[1] * _taps(k, w)[1]
    method, n = ("im2col", n_conv) if n_conv < C * h * w else ("dense", C * h * w)
    return method, n, 2 * (int(layer.eval_terms) - 1) * c_in * H * W * C * h * w * n


def _fro_bound(t: Tensor, terms: int) -> float:
    """An upper bound on ``‖t‖_F`` (``terms`` ≥ the number of entries summed)."""
    return norm_from_squares(float(t.square().sum()), terms)


def _conv_fro_bound(S: Tensor, h: int, w: int) -> float:
    """Upper bound on ``‖A‖_F`` for ``A`` = :func:`conv_matrix` of ``S`` on ``h×w`` images
    without forming it: tap ``(a, b)`` appears in ``(h − |a−p|)₊·(w − |b−p|)₊`` rows."""
    k, p = int(S.shape[-1]), int(S.shape[-1]) // 2
    counts = [[max(0, h - abs(a - p)) * max(0, w - abs(b - p)) for b in range(k)] for a in range(k)]
    weights = torch.tensor(counts, dtype=torch.float64, device=S.device)  # exact integers
    up = 1.0 + 2.0 * gamma(S.numel() + 3)
    return math.sqrt(float((S.square() * weights).sum()) * up) * up


def _step(S: Tensor, method: str, n: int, h: int, w: int) -> tuple[Any, Any, int]:
    """``(apply, layout, rows)`` for :func:`operator_matrix_with_error`: ``apply(U)`` is
    ``conv(U, S)`` on a chunk of images, ``layout`` puts prepared images ``(r, C, h, w)`` in
    the layout ``apply`` takes, ``rows`` the chunk size.  ``"im2col"``: channels-last images
    ``(r, h, w, C)``, written into a zero-padded buffer whose strided view of the ``kh×kw``
    windows is copied (exactly) into the ``(r·h·w) × n`` column matrix, then ONE float64
    product with the ``n × C`` filter (taps, then channels); ``"dense"``: channel-major
    images times the transposed :func:`conv_matrix`."""
    C = int(S.shape[0])
    if method == "dense":
        A_t = conv_matrix(S, h, w).T
        rows = max(1, BUILD_CHUNK_BYTES // (8 * 4 * C * h * w))
        return (lambda U: (U.reshape(U.shape[0], -1) @ A_t).view(U.shape),  # noqa: E731
                lambda x: x.contiguous(), rows)
    (a0, kh), (b0, kw) = _taps(int(S.shape[-1]), h), _taps(int(S.shape[-1]), w)
    ph, pw = kh // 2, kw // 2
    St = S[:, :, a0:a0 + kh, b0:b0 + kw].permute(2, 3, 1, 0).reshape(n, C).contiguous()
    rows = max(1, BUILD_CHUNK_BYTES // (8 * (h * w * n + 4 * C * (h + 2 * ph) * (w + 2 * pw))))
    pad: dict[int, Tensor] = {}

    def apply(U: Tensor) -> Tensor:
        r = U.shape[0]
        if r not in pad:  # zero border, interior rewritten at every step
            pad[r] = U.new_zeros(r, h + 2 * ph, w + 2 * pw, C)
        P = pad[r]
        P[:, ph:ph + h, pw:pw + w] = U
        sr, sy, sx, sc = P.stride()
        cols = P.as_strided((r, h, w, kh, kw, C), (sr, sy, sx, sy, sx, sc)).reshape(r * h * w, n)
        return (cols @ St).view(r, h, w, C)  # one float64 matmul, inner dimension n

    return apply, lambda x: x.permute(0, 2, 3, 1).contiguous(), rows


@torch.no_grad()
def operator_matrix_with_error(layer: nn.Module, input_shape: tuple[int, ...],
                               norm_bound: float | None = None) -> tuple[Tensor, float]:
    """``(M, e)``: ``M`` as in :func:`operator_matrix` and ``e ≥ ‖M − P_T(S)‖₂`` (the exact
    map on these inputs, whose norm the layer's bound covers), the float64 rounding of the
    recurrence.

    **Build.**  The layer's eval series in float64 (its eval filter ``S`` cast exactly) on
    the identity basis, in chunks of basis rows (:data:`BUILD_CHUNK_BYTES` of working memory
    each, on the layer's device): ``X`` = the unshuffled, channel-padded basis images (0/1,
    exact), then Horner ``U ← X + (1/i)·conv(U, S)`` for ``i = T−1 … 1`` (SPEC §1.4; the rows
    of ``U`` are the layer's outputs on the basis images), truncated to ``c_out`` channels.
    ``conv(U, S)`` is, by :func:`build_plan`, either an explicit im2col (:func:`_step`: the
    ``kh×kw`` windows of the zero-padded images, restricted to the taps of ``S`` that meet
    the image, copied — exact copies of entries of ``U`` and exact zeros — into a column
    matrix, then ONE float64 matrix product with the ``n × C`` filter, ``n = C·kh·kw``) or,
    on images so small that ``C·h·w ≤ n`` (2×2 with a 3×3 filter, 1×1), the product with
    the dense convolution matrix :func:`conv_matrix` (inner dimension ``n = C·h·w``).
    torch's ``conv2d`` is not used: its algorithm (Winograd, FFT, ...) is not ours to choose
    and not a dot product per entry; a float64 matrix product is (BLAS/cuBLAS ``dgemm``: each
    entry a sum of the ``n`` products in an order of its choosing, blocked or split, never a
    fast-matrix-multiplication scheme, never TF32 —
    that applies to float32 only); then ``torch.add(X, Y, alpha=fl(1/i))``.

    **Error** (Higham §3.5, :mod:`lipcli.numerics.rounding`).  Each entry of a step is
    ``x + α̂·ŷ`` with ``ŷ`` one length-``n`` dot product in float64 (any order), ``α̂ =
    fl(1/i)`` (one rounding), the product and the sum (two more), so it is off from
    ``x + (1/i)·Σ s_j u_j`` by at most ``γ_{n+3}(|x| + Σ|s_j||u_j|/i)``; in Frobenius norm
    over a chunk, ``δ_i ≤ γ_{n+3}(‖X‖_F + ‖Û‖_F‖A‖_F/i)`` with ``A`` the convolution matrix
    (:func:`_conv_fro_bound`).  The error carried from the previous step grows by at most
    ``‖A‖₂/i ≤ b/i``, ``b`` (``norm_bound``, default :meth:`SOC.spectral_bound`) the
    guaranteed bound on ``‖S‖₂`` that also bounds the zero-padded convolution on a finite
    image.  So per chunk ``E ← E·b/i + δ_i``, and ``‖M − P‖₂ ≤ ‖M − P‖_F ≤ √(Σ_chunks E²)``
    (truncating channels does not increase it); every scalar step is rounded up by
    :func:`~lipcli.numerics.rounding.round_up`, whose relative margin (``e ≥ γ·‖X‖_F ≥
    1e-16``) also covers underflow (at most ``(n+3)·2⁻¹⁰⁷⁴`` per entry)."""
    S = layer.skew_filter().to(torch.float64)
    b = float(layer.spectral_bound()) if norm_bound is None else float(norm_bound)
    shape = tuple(int(d) for d in input_shape)
    d_in = math.prod(shape)
    C, c_out, terms = int(layer.channels), int(layer.out_channels), int(layer.eval_terms)
    h, w = shape[1] // layer.stride, shape[2] // layer.stride
    method, n, _ = build_plan(layer, shape)
    apply, layout, rows = _step(S, method, n, h, w)
    g = gamma(n + 3)
    a_fro = _conv_fro_bound(S, h, w)
    out = torch.empty(d_in, c_out, h, w, dtype=torch.float64, device=S.device)
    err_sq = 0.0
    for r0 in range(0, d_in, rows):
        r1 = min(d_in, r0 + rows)
        basis = torch.zeros(r1 - r0, d_in, dtype=torch.float64, device=S.device)
        basis[torch.arange(r1 - r0), torch.arange(r0, r1)] = 1.0
        X = layout(layer._prepare_input(basis.view(-1, *shape)))
        x_fro, err, U = math.sqrt(r1 - r0), 0.0, X
        for i in range(terms - 1, 0, -1):
            u_fro = _fro_bound(U, U.numel())
            err = round_up(err * b / i + g * (x_fro + u_fro * a_fro / i))
            U = torch.add(X, apply(U), alpha=1.0 / i)
        out[r0:r1] = (U.permute(0, 3, 1, 2) if method == "im2col" else U)[:, :c_out]
        err_sq = round_up(err_sq + round_up(err * err))
    return out.view(d_in, -1).T.contiguous(), round_up(math.sqrt(err_sq))


def linear_map(layer: nn.Module, input_shape: tuple[int, ...]) -> LinearMap:
    """The SDK's :class:`~lipcli.sdk.lowering.LinearMap` of a SOC layer on ``input_shape``."""
    shape = tuple(int(d) for d in input_shape)
    matrix, err = operator_matrix_with_error(layer, shape)
    return LinearMap(matrix, layer.bias.detach(), output_shape(layer, shape), err, layer.bias.dtype)


def lower_soc(layer: nn.Module, context: Any = None) -> nn.Module:
    """The export (and eval) stand-in of a SOC layer: a dense
    :class:`~lipcli.sdk.lowering.DenseOperator` when ``context`` (a
    :class:`~lipcli.sdk.lowering.LoweringContext`) gives the input shape, the float32 matrix fits
    ``context.dense_max_bytes``, one matrix product costs at most ``1/DENSE_MIN_GAIN`` of
    the series' operations and the build pays off on ``context.inputs``
    (:func:`~lipcli.sdk.lowering.dense_lowering`); else
    :class:`ExportedSOC`.  The choice is described in the returned module's
    ``export_lowering``."""
    series = ExportedSOC.from_layer(layer)
    if context is None:
        series.export_lowering = {"lowering": "series", "convolutions": series.terms - 1}
        return series
    shape = tuple(int(d) for d in context.input_shape)
    out = output_shape(layer, shape)
    conv_flops = series_flops(layer, shape)
    build = build_plan(layer, shape)[2]
    dense = dense_lowering(layer, context, conv_flops, out, build_flops=build)
    if dense is not None:
        return dense
    d_in, d_out = math.prod(shape), math.prod(out)
    facts = {"input_shape": list(shape), "output_shape": list(out),
             "series_flops_per_image": conv_flops, "dense_flops_per_image": 2 * d_in * d_out,
             "dense_mib": 4 * d_in * d_out / 2**20, "build_flops": build}
    min_pixels = settings.CHANNELS_LAST_MIN_PIXELS
    series.channels_last = min_pixels is not None and out[1] * out[2] >= min_pixels
    series.export_lowering = {"lowering": "series", "convolutions": series.terms - 1,
                              "channels_last": series.channels_last, **facts}
    return series
