"""The Lipschitz constant of a model's feature map ``g: x -> y`` (SPEC §5): the GUARANTEED
bound, also of the eval-lowered operator that runs (:func:`lowered_upper_bound`), and the
layer-shape helpers (the empirical lower bound: :mod:`lipcli.lipschitz.empirical`; the report
of all three: :mod:`lipcli.lipschitz.report`; the model layout, ``body_of`` and
``model_input_shape``: :mod:`lipcli.host.layout`).

``g`` is ``model.body``: a :class:`torch.nn.Sequential` whose first child is the input
normalisation ``(x - mean)/std`` and whose last child flattens to ``(N, D)``. For a sequential
composition, ``Lip(g) <= prod_i Lip(child_i)`` (SPEC §5), so three numbers are reported:

``upper_bound`` (GUARANTEED)
    ``prod_i U_i`` with ``U_i = child.lipschitz_upper_bound()`` when the child has that method
    (SOC layers: ``||P_T(S)|| <= 1 + ||S||^T/T! * 1/(1 - ||S||/(T+1))``; the normalisation:
    ``1/min std``), else ``U_i = 1`` when its ``lip_promises`` contain ``"1-lipschitz"``
    (MaxMin, pools, flatten). A child with neither is an error, never silently 1. Every
    multiplication is rounded *up* by one ulp, so the float64 product is itself an upper bound
    of the exact product of the per-layer bounds.

``estimate`` (LOWER estimate, the reference's convention)
    ``prod_i E_i`` with ``E_i = child.lipschitz_estimate(input_shape, iters)`` (power method on
    the layer at its evaluation terms), ``1/min std`` for the normalisation (exact) and 1 for
    1-Lipschitz children. Each ``E_i`` is a lower estimate of ``Lip(child_i)``, but the product
    is *not* a bound of either kind on ``Lip(g)``: this is what the paper's code divides by.

``empirical_lower`` (a true lower bound on ``Lip(g)``, :mod:`lipcli.lipschitz.empirical`)
    ``max ||g(a) - g(b)|| / ||a - b||`` over a few pairs ``a = x + t v, b = x - t v`` found by
    a short power iteration on ``J(x)^T J(x)`` (``J`` the Jacobian of ``g`` at data points or
    random images ``x``), evaluated in float64. Any such ratio is ``<= Lip(g)`` by definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.host.layout import body_of, model_input_shape  # re-exported (read here too)
from lipcli.numerics.rounding import round_up
from lipcli.sdk.errors import LipError
from lipcli.sdk.specs import ONE_LIPSCHITZ

#: names used in reports
BOUND_LABEL = "GUARANTEED upper bound"
ESTIMATE_LABEL = "ESTIMATE (paper convention: product of per-layer power-method estimates, not guaranteed)"
EMPIRICAL_LABEL = "empirical LOWER bound (largest output/input distance ratio found)"


def _mul_up(a: float, b: float) -> float:
    """``a * b`` rounded up by one ulp (an upper bound of the exact product, for a, b >= 0)."""
    return math.nextafter(a * b, math.inf)


@torch.no_grad()
def layer_input_shapes(model: nn.Module, input_shape: tuple[int, int, int] | None = None) -> dict[str, tuple[int, ...]]:
    """Input shape (without batch dim) of every body child: from ``model.describe()`` when the
    architecture provides it (no computation), else recorded by forward pre-hooks on a dummy
    input of shape ``input_shape`` (default :func:`model_input_shape`)."""
    body = body_of(model)
    shape = input_shape or model_input_shape(model)
    names = [name for name, _ in body.named_children()]
    describe = getattr(model, "describe", None)
    if callable(describe):  # LipConvnet knows its shapes without running the network
        try:
            planned = {name: tuple(inp) for name, inp, _out in describe(shape)}
        except (TypeError, ValueError):
            planned = {}
        if all(name in planned for name in names):
            return {name: planned[name] for name in names}
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for name, child in body.named_children():
        def hook(_mod: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            shapes[name] = tuple(args[0].shape[1:])
        handles.append(child.register_forward_pre_hook(hook))
    try:
        param = next(model.parameters(), None)
        dtype = param.dtype if param is not None else torch.get_default_dtype()
        device = param.device if param is not None else torch.device("cpu")
        body(torch.zeros((1, *shape), dtype=dtype, device=device))
    finally:
        for h in handles:
            h.remove()
    return shapes


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 over the state dict (names, shapes, dtypes, bytes): identifies the weights
    (and power-iteration buffers) that a stored Lipschitz value or result belongs to; equal
    to :func:`~lipcli.host.modelfile.tensors_fingerprint` of the model file's tensors."""
    from lipcli.host.modelfile import tensors_fingerprint

    return tensors_fingerprint(model.state_dict())


def _layer_kind(child: nn.Module) -> str:
    if ONE_LIPSCHITZ in getattr(child, "lip_promises", ()) and not callable(
        getattr(child, "lipschitz_upper_bound", None)
    ):
        return "promise"
    if callable(getattr(child, "lipschitz_upper_bound", None)):
        return "bound"
    return "none"


@dataclass(frozen=True)
class LayerBound:
    """One body child's factor in the GUARANTEED bound: ``upper_bound`` from its
    ``lipschitz_upper_bound()`` (``source`` ``"bound"``) or 1 by its promise (``"promise"``)."""

    name: str
    type: str
    source: str
    upper_bound: float


def guaranteed_upper_bound(model: nn.Module) -> tuple[float, list[LayerBound]]:
    """``(prod_i U_i, per-layer rows)`` — the GUARANTEED bound of SPEC §5 (see module doc).

    Raises :class:`LipError` if a body child neither has ``lipschitz_upper_bound()`` nor
    promises ``"1-lipschitz"``; or if a layer's bound is not a finite number ``>= 0``.
    """
    body = body_of(model)
    total = 1.0
    rows: list[LayerBound] = []
    for name, child in body.named_children():
        kind = _layer_kind(child)
        if kind == "none":
            raise LipError(
                f"layer {name!r} ({type(child).__name__}) neither has lipschitz_upper_bound() "
                f"nor promises {ONE_LIPSCHITZ!r}: cannot bound the network's Lipschitz constant"
            )
        if kind == "bound":
            value = float(child.lipschitz_upper_bound())
            if not math.isfinite(value) or value < 0:
                raise LipError(f"layer {name!r} reported an invalid Lipschitz bound {value!r}")
        else:
            value = 1.0
        total = _mul_up(total, value)
        rows.append(LayerBound(name=name, type=type(child).__name__, source=kind, upper_bound=value))
    return total, rows


def lowered_upper_bound(model: nn.Module, network: Any = None,
                        computed: tuple[float, list[LayerBound]] | None = None,
                        ) -> tuple[float, list[LayerBound]]:
    """GUARANTEED bound of the operator that runs: the per-layer rows of
    :func:`guaranteed_upper_bound` (or ``computed``, its result) with the ``bound_excess`` of
    each dense layer of ``network`` (its ``excess``, layer name -> excess: a
    :class:`~lipcli.lowering.network.LoweredNetwork` or an exported program; the float64 error
    of forming the matrix and the float32 rounding of storing it, :mod:`lipcli.sdk.lowering`)
    added to that layer's ``U``, multiplied rounded up."""
    total, rows = computed if computed is not None else guaranteed_upper_bound(model)
    excess_of = getattr(network, "excess", None) or {}
    if not excess_of:
        return total, rows
    # Π(U_i + e_i) = Π U_i · Π(1 + e_i/U_i) ≤ total · Π(1 + e_i/U_i), every step rounded up
    out: list[LayerBound] = []
    for row in rows:
        if row.name in excess_of:
            excess = excess_of[row.name]
            value = round_up(row.upper_bound + excess)
            factor = round_up(1.0 + excess / row.upper_bound) if row.upper_bound > 0 else math.inf
            total = round_up(total * factor) if math.isfinite(factor) else math.inf
            row = LayerBound(name=row.name, type=row.type, source=row.source, upper_bound=value)
        out.append(row)
    if not math.isfinite(total):  # a layer bound of 0: the plain product
        total = 1.0
        for row in out:
            total = math.nextafter(total * row.upper_bound, math.inf)
    return total, out


def _estimate_of(child: nn.Module, kind: str, shape: tuple[int, ...], iters: int) -> float:
    if kind == "promise":
        return 1.0
    est = getattr(child, "lipschitz_estimate", None)
    if callable(est):
        return float(est(tuple(shape), iters=iters))
    # no power method (e.g. the normalisation, whose bound 1/min std is exact)
    return float(child.lipschitz_upper_bound())
