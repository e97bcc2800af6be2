"""The eval lowering protocol (plugin SDK): a layer that knows its fixed linear map.

In eval mode many Lipschitz layers are a fixed linear map plus a bias (SOC's truncated
series, Cayley, BCOP, BRO-type layers).  On inputs of one known shape that map is one
matrix ``M`` of size ``(d_out × d_in)``, and on small images (many channels, few pixels)
one matrix product costs far fewer operations than the layer's literal evaluation.  A layer
takes part by implementing

``eval_linear_map(input_shape) -> LinearMap | None``

returning its map on inputs of shape ``input_shape`` (one example, no batch) as a float64
matrix together with a bound on how far that matrix is from the exact linear map its
``lipschitz_upper_bound()`` covers (``None``: not linear, or too large to form).  The layer
reuses :func:`dense_lowering` in its ``export_module(context)``; ``lip certify``,
``lip lipschitz --empirical``, the attack and promise checks and ``lip export`` then all run
the same lowered operator (:mod:`lipcli.lowering` builds and caches it per model and input
shape, each layer told its input shape and the cap in a :class:`LoweringContext`).

**The bound of the operator that runs.**  :class:`DenseOperator` applies ``M₃₂``, the
float64 matrix ``M₆₄`` rounded once to float32.  With ``P`` the exact map that the layer's
``lipschitz_upper_bound()`` ``U`` covers (``‖P‖₂ ≤ U``),

``‖M₃₂‖₂ ≤ ‖P‖₂ + ‖M₆₄ − P‖₂ + ‖M₃₂ − M₆₄‖₂ ≤ U + e + r``

where ``e ≥ ‖M₆₄ − P‖₂`` is the layer's own float64 error bound (:attr:`LinearMap.error`)
and ``r ≥ ‖M₃₂ − M₆₄‖₂`` is computed from the rounding error itself: ``Δ = M₃₂ − M₆₄`` is
exact in float64 (the rounding error of float64 → float32 has at most 29 significant bits),
and ``‖Δ‖₂ ≤ min(‖Δ‖_F, √(‖Δ‖₁‖Δ‖_∞))``, each from sums of at most ``N = d_out·d_in``
non-negative float64 terms (in any order and chunking), rounded up by ``(1 + 2γ_{N+2})``
(:mod:`lipcli.numerics.rounding`).  (Entrywise
``|Δ| ≤ 2⁻²⁴|M₆₄|``, so ``r ≤ 2⁻²⁴‖M₆₄‖_F``; the computed value is usually a few times
smaller.)  :attr:`DenseOperator.bound_excess` ``= e + r`` (rounded up) is what the lowered
network's guaranteed bound adds to the layer's ``U``.  The float32 rounding of *applying*
``M₃₂`` to an input (one matrix product) is, as for the series' convolutions, a perturbation
of the computed features and not part of any Lipschitz bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.lowering_costs import BUILD_FLOP_WEIGHT, DENSE_MIN_GAIN
from lipcli.numerics.rounding import gamma, norm_from_squares, round_up, sum_upper

#: name of the method a layer implements to offer its fixed linear map
LINEAR_MAP_METHOD = "eval_linear_map"
#: :data:`DENSE_MIN_GAIN` (one matrix product at least this many times cheaper than the
#: literal layer) and :data:`BUILD_FLOP_WEIGHT` (a float64 build operation against a float32
#: one saved) are defined torch-free in :mod:`lipcli.sdk.lowering_costs` (help texts read them)


@dataclass(frozen=True)
class LoweringContext:
    """What ``export_module(context)`` is told about the layer it lowers (``lip certify``,
    ``lip export`` and every other eval lowering, :mod:`lipcli.lowering`).

    Attributes:
        input_shape: shape of one input example of the module, without the batch dimension
            (fixed in the exported program).
        dense_max_bytes: the largest float32 matrix (bytes) a linear layer may store as its
            dense operator instead of its literal form (0: never); a layer goes dense only
            when that also costs fewer floating-point operations.  Set from the user's
            ``dense_max_mib`` (:mod:`lipcli.lowering.caps`: its defaults, its check, its
            conversion to bytes).
        inputs: how many input examples the lowered layer will run on (``None``: unknown or
            unbounded, as in ``lip export``); a dense operator is only built when the
            operations it saves on that many inputs exceed the cost of building it
            (:func:`dense_lowering`, :func:`pays_off`).
    """

    input_shape: tuple[int, ...]
    dense_max_bytes: int
    inputs: int | None = None


@dataclass
class LinearMap:
    """A layer's eval map on one input shape: ``layer(x) = matrix·vec(x) + bias``.

    Attributes:
        matrix: float64 ``(d_out, d_in)``, channel-major flattening of input and output.
        bias: the layer's bias, per output channel ``(c_out,)`` or per output entry ``(d_out,)``.
        output_shape: one output example's shape (no batch).
        error: ``≥ ‖matrix − P‖₂`` for the exact map ``P`` that the layer's
            ``lipschitz_upper_bound()`` bounds (float64 rounding of forming the matrix).
        dtype: the dtype the layer runs in (the matrix is rounded to it once).
    """

    matrix: Tensor
    bias: Tensor
    output_shape: tuple[int, ...]
    error: float
    dtype: torch.dtype = torch.float32


#: rows of the float64 rounding error formed at once by :func:`rounding_excess` (bounds its
#: working memory to a few copies of this many rows, not of the whole matrix)
EXCESS_CHUNK_ROWS = 1024


def rounding_excess(matrix64: Tensor, rounded: Tensor) -> float:
    """A guaranteed upper bound on ``‖rounded − matrix64‖₂`` (see the module docstring).
    Formed in chunks of :data:`EXCESS_CHUNK_ROWS` rows; every sum (of at most ``numel``
    non-negative terms, in any order and any chunking) is rounded up by ``(1 + 2γ_{numel+2})``."""
    if matrix64.numel() == 0:
        return 0.0
    rows, cols = matrix64.shape[0], matrix64.shape[-1]
    square_sum, row_max = 0.0, 0.0
    col_sums = torch.zeros(cols, dtype=torch.float64, device=matrix64.device)
    for r0 in range(0, rows, EXCESS_CHUNK_ROWS):
        a = (rounded[r0:r0 + EXCESS_CHUNK_ROWS].to(torch.float64) - matrix64[r0:r0 + EXCESS_CHUNK_ROWS]).abs_()
        row_max = max(row_max, float(a.sum(1).max()))
        col_sums += a.sum(0)
        square_sum += float(a.square_().sum())
    n = matrix64.numel()
    fro = norm_from_squares(square_sum, n)
    holder = math.sqrt(sum_upper(float(col_sums.max()), n) * sum_upper(row_max, n)) * (1.0 + 2.0 * gamma(n + 2))
    return round_up(min(fro, holder))


class DenseOperator(nn.Module):
    """``y = M₃₂·vec(x) + b`` on inputs of one fixed shape: one ``F.linear`` between two
    reshapes (plain torch, exportable).  ``bound_excess`` is ``e + r`` of the module
    docstring: the layer's guaranteed bound plus it covers ``‖M₃₂‖₂``."""

    def __init__(self, matrix: Tensor, bias: Tensor, *, input_shape: tuple[int, ...],
                 output_shape: tuple[int, ...], bound_excess: float = 0.0) -> None:
        super().__init__()
        if tuple(matrix.shape) != (math.prod(output_shape), math.prod(input_shape)):
            raise ValueError(f"matrix {tuple(matrix.shape)} does not map {input_shape} to {output_shape}")
        bias = bias.detach().to(matrix.dtype).reshape(-1)
        if bias.numel() == output_shape[0] and bias.numel() != matrix.shape[0]:
            bias = bias.repeat_interleave(math.prod(output_shape[1:]))
        self.register_buffer("matrix", matrix.detach().contiguous())
        self.register_buffer("bias", bias.contiguous())
        self.input_shape = tuple(int(d) for d in input_shape)
        self.output_shape = tuple(int(d) for d in output_shape)
        self.bound_excess = float(bound_excess)

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x.flatten(1), self.matrix, self.bias)
        return y.unflatten(1, self.output_shape)

    def extra_repr(self) -> str:
        return (f"input_shape={self.input_shape}, output_shape={self.output_shape}, "
                f"bound_excess={self.bound_excess:.3g}")


def dense_operator(linear: LinearMap, input_shape: tuple[int, ...]) -> DenseOperator:
    """The :class:`DenseOperator` of ``linear``: the matrix rounded once to ``linear.dtype``,
    its excess ``error + rounding_excess`` (rounded up)."""
    rounded = linear.matrix.to(linear.dtype)
    excess = round_up(float(linear.error) + rounding_excess(linear.matrix, rounded))
    return DenseOperator(rounded, linear.bias, input_shape=input_shape,
                         output_shape=linear.output_shape, bound_excess=excess)


def pays_off(inputs: int | None, literal_flops: int, dense_flops: int, build_flops: int) -> bool:
    """The one rule of the eval lowering's economics: a dense operator is built only when
    the operations it saves on the inputs it will run on exceed the cost of building it,
    ``inputs·(literal_flops − dense_flops) ≥ BUILD_FLOP_WEIGHT·build_flops`` (per input:
    the layer's literal operations against one matrix product; ``inputs=None``: unbounded,
    as in ``lip export`` — it always pays)."""
    if inputs is None:
        return True
    return int(inputs) * (int(literal_flops) - int(dense_flops)) >= BUILD_FLOP_WEIGHT * int(build_flops)


def dense_lowering(layer: nn.Module, context: LoweringContext | None, literal_flops: int,
                   output_shape: tuple[int, ...], build_flops: int | None = None,
                   min_gain: float = DENSE_MIN_GAIN) -> DenseOperator | None:
    """The dense stand-in of ``layer`` for ``context`` (a :class:`LoweringContext`),
    or ``None`` when the layer should stay literal: no input shape, the float32 matrix over
    ``context.dense_max_bytes``, one matrix product not ``min_gain`` (default
    ``DENSE_MIN_GAIN``) times cheaper than ``literal_flops`` (the layer's operations per
    example), a build that does not pay off on
    ``context.inputs`` inputs (:func:`pays_off`; ``build_flops``: the operations of
    ``eval_linear_map``, default ``d_in·literal_flops``, the layer applied to every basis
    input), or no linear map offered.  The returned module describes itself in
    ``export_lowering``."""
    if context is None:
        return None
    shape = tuple(int(d) for d in context.input_shape)
    d_in, d_out = math.prod(shape), math.prod(output_shape)
    dense_flops = 2 * d_in * d_out
    nbytes = 4 * d_in * d_out
    if nbytes > int(context.dense_max_bytes) or dense_flops * min_gain > literal_flops:
        return None
    build = d_in * int(literal_flops) if build_flops is None else int(build_flops)
    if not pays_off(getattr(context, "inputs", None), literal_flops, dense_flops, build):
        return None
    method = getattr(layer, LINEAR_MAP_METHOD, None)
    linear = method(shape) if callable(method) else None
    if linear is None:
        return None
    dense = dense_operator(linear, shape)
    dense.export_lowering = {"lowering": "dense", "input_shape": list(shape),
                             "output_shape": list(output_shape),
                             "series_flops_per_image": int(literal_flops),
                             "dense_flops_per_image": dense_flops, "dense_mib": nbytes / 2**20,
                             "build_flops": build, "bound_excess": dense.bound_excess}
    if min_gain != DENSE_MIN_GAIN:
        dense.export_lowering["min_gain"] = min_gain
    return dense
