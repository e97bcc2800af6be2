"""The zero border of a Fourier convolution (:class:`lipcli.sdk.fourier.FourierConvBase`):
the form of the BRONet and LOT authors' layers (lipcli-bro's and lipcli-lot's
``border="zero"``).

A circular layer applies its per-frequency matrices on the torus of its (rearranged) input.
With a zero border of ``p = k//2`` pixels it instead pads the rearranged input with ``p`` zeros
on every side, applies the same kind of map on the ``(H+2p) × (W+2p)`` torus and crops the
``H × W`` interior: ``y = Π C E x`` with ``E`` the zero embedding (an isometry, ``‖E‖ = 1``),
``C`` the circular map (``‖C‖ ≤ U``, the verified bound of its float matrices, computed for the
padded size) and ``Π`` the crop (a coordinate projection, ``‖Π‖ = 1``).  So ``‖Π C E‖ ≤ U``:
the layer keeps the circular map's guaranteed bound (1-Lipschitz in exact arithmetic when the
circular map is orthogonal or a contraction), but it is not orthogonal: the crop discards the
part of ``C E x`` that lands in the border.

:class:`ZeroBorderMixin` (before :class:`~lipcli.sdk.fourier.FourierConvBase` in the bases)
gives a layer with an attribute ``pad`` (0: circular) the padded forward, the dense eval map
(the interior submatrix of the padded block-circulant matrix, same guaranteed error bound) and
the export stand-in.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.lowering import LinearMap
from lipcli.sdk.lowering_conv import circulant_matrix, fourier_kernel, unshuffle_columns

#: the border forms of a Fourier convolution with a zero border option
BORDERS = ("circular", "zero")


def pad_border(z: Tensor, pad: int) -> Tensor:
    """``E``: ``pad`` zeros on every side of the last two dimensions."""
    return F.pad(z, (pad, pad, pad, pad)) if pad else z


def crop_border(y: Tensor, pad: int) -> Tensor:
    """``Π``: the interior of the last two dimensions, ``pad`` pixels dropped on every side."""
    return y[..., pad:y.shape[-2] - pad, pad:y.shape[-1] - pad] if pad else y


def zero_border_matrix(op: Tensor, padded: tuple[int, int], pad: int, in_channels: int,
                       stride: int) -> tuple[Tensor, float]:
    """``(M, e)``: the float64 matrix of ``Π C E`` (with the stride-2 column permutation) from
    the half-plane matrices ``op`` on the ``padded`` torus.  ``M`` is a submatrix (interior
    rows and columns) of the block-circulant matrix of ``C``, so ``e``, the guaranteed error
    bound of that matrix (:func:`lipcli.sdk.lowering_conv.fourier_kernel`), bounds it too
    (the norm of a submatrix of an error is at most the norm of the error)."""
    Hp, Wp = padded
    H, W = Hp - 2 * pad, Wp - 2 * pad
    G, err = fourier_kernel(op, padded)
    full = circulant_matrix(G)
    out, cin = int(G.shape[0]), int(G.shape[1])
    rows_y = torch.arange(pad, pad + H)[:, None] * Wp + torch.arange(pad, pad + W)[None, :]
    inner = rows_y.reshape(-1)
    rows = (torch.arange(out)[:, None] * (Hp * Wp) + inner[None, :]).reshape(-1)
    cols = (torch.arange(cin)[:, None] * (Hp * Wp) + inner[None, :]).reshape(-1)
    M = full.index_select(0, rows.to(full.device)).index_select(1, cols.to(full.device))
    return unshuffle_columns(M, in_channels, stride, (H, W)), err


class ExportedZeroBorder(nn.Module):
    """``lip export`` of a zero-border layer: ``pixel_unshuffle`` (stride 2), ``E``, the
    circular stand-in on the padded torus (``inner``, stride 1, bias included: a constant per
    channel, the same inside the crop), ``Π``.  Plain torch operations."""

    def __init__(self, inner: nn.Module, *, stride: int, pad: int) -> None:
        super().__init__()
        self.inner = inner
        self.stride = int(stride)
        self.pad = int(pad)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        return crop_border(self.inner(pad_border(x, self.pad)), self.pad)

    def extra_repr(self) -> str:
        return f"zero border, pad={self.pad}, stride={self.stride}"


class ZeroBorderMixin:
    """The zero border for a :class:`~lipcli.sdk.fourier.FourierConvBase` subclass with an
    attribute ``pad`` (``k//2`` for ``border="zero"``, 0 for circular: then every method is
    the base class's).  Its ``spatial_size`` is the padded torus."""

    pad: int

    def rearrange(self, x: Tensor) -> Tensor:
        """The base rearrangement (``pixel_unshuffle`` for stride 2), then the zero border ``E``."""
        return pad_border(super().rearrange(x), self.pad)  # type: ignore[misc]

    def apply_operator(self, x: Tensor, op: Tensor) -> Tensor:
        """The circular map on the (padded) torus, then the crop ``Π``."""
        return crop_border(super().apply_operator(x, op), self.pad)  # type: ignore[misc]

    def eval_linear_map(self, input_shape: tuple[int, ...]) -> LinearMap | None:
        """The base class's block-circulant matrix; with a zero border its interior submatrix
        on the padded torus (:func:`zero_border_matrix`, same guaranteed error bound)."""
        if not self.pad:
            return super().eval_linear_map(input_shape)  # type: ignore[misc]
        layer: Any = self
        shape = tuple(int(d) for d in input_shape)
        s, p = layer.stride, self.pad
        if len(shape) != 3 or shape[0] != layer.in_channels or shape[1] % s or shape[2] % s:
            return None
        size = (shape[1] // s, shape[2] // s)
        padded = (size[0] + 2 * p, size[1] + 2 * p)
        if layer._recorded_size() != padded:
            return None
        with torch.no_grad():
            matrix, error = zero_border_matrix(layer.eval_operator(padded), padded, p, layer.in_channels, s)
        return LinearMap(matrix, layer.bias.detach(), (layer.out_channels, *size), error, layer.bias.dtype)

    def export_module(self, context: Any = None) -> nn.Module:
        """The base class's stand-ins; with a zero border the dense matrix of
        :meth:`eval_linear_map` when it pays, else :class:`ExportedZeroBorder` around the
        circular stand-in on the padded torus."""
        if not self.pad:
            return super().export_module(context)  # type: ignore[misc]
        from lipcli.sdk.fourier_export import ExportedFourierConv
        from lipcli.sdk.lowering_conv import dense_lowering_at_gain, literal_facts

        layer: Any = self
        padded = layer.bound_size()  # LipError before the layer has seen an input
        size = (padded[0] - 2 * self.pad, padded[1] - 2 * self.pad)
        facts: dict[str, Any] = {}
        if context is not None:
            shape = tuple(int(d) for d in context.input_shape)
            flops = layer.literal_flops(padded)
            dense = dense_lowering_at_gain(layer, context, flops, (layer.out_channels, *size))
            if dense is not None:
                return dense
            facts = literal_facts("fourier", shape, (layer.out_channels, *size), flops)
        with torch.no_grad():
            inner = ExportedFourierConv(layer.eval_operator(padded), layer.bias, size=padded, stride=1)
        stand_in = ExportedZeroBorder(inner, stride=layer.stride, pad=self.pad)
        if facts:
            stand_in.export_lowering = facts
        return stand_in
