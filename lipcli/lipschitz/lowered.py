"""The eval lowering of a model, built once per model and input shape and used everywhere.

In eval mode a layer that knows its fixed linear map (:mod:`lipcli.sdk.lowering`: SOC and any
plugin implementing ``eval_linear_map``) may run as one dense matrix product on inputs of a
known shape, which on small images costs far fewer operations than its literal form (SOC:
14 convolutions of the 15-term series).  The layer decides in its
``export_module(context)`` (dense where its float32 matrix fits the cap, is at least
``DENSE_MIN_GAIN`` times cheaper per input and its build pays off on the number of inputs it
will run on, :func:`lipcli.sdk.lowering.pays_off`; its literal form otherwise); this module
applies that decision to a whole model:

* :func:`lower_body` walks ``model.body`` child by child with an
  :class:`~lipcli.sdk.export.ExportContext` holding each child's input shape.  With
  ``plain=True`` (``lip export``) every child becomes its plain-torch stand-in; otherwise
  (``lip certify``, ``lip lipschitz --empirical``, the attack and promise checks) only the
  dense stand-ins replace their layers and every other child stays the model's own module.
* :func:`lowered_network` returns a :class:`LoweredNetwork` (``features``, ``forward``)
  cached on the model for its input shape, cap, device and weights (a changed parameter or
  buffer builds it again); ``series=True`` returns the model's own layers (no lowering), for
  comparison.
* :func:`lowered_upper_bound` is the GUARANTEED bound of the operator that runs: the model's
  per-layer bounds (:func:`~lipcli.lipschitz.bound.guaranteed_upper_bound`) with each dense
  layer's ``U`` replaced by ``U + bound_excess`` (the float64 error of forming its matrix and
  the float32 rounding of storing it, :mod:`lipcli.sdk.lowering`), multiplied rounded up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lipcli._util.constants import DENSE_MAX_MIB_DEFAULT, DENSE_MAX_MIB_OTHER
from lipcli.lipschitz import bound as _bound
from lipcli.lipschitz.bound import LayerBound, body_of, model_input_shape
from lipcli.numerics.rounding import round_up
from lipcli.sdk.errors import LipError
from lipcli.sdk.export import LOWERING_ATTRIBUTE, EXPORT_METHOD, ExportContext, lower_module
from lipcli.sdk.lowering import DenseOperator

_CACHE_ATTRIBUTE = "_lipcli_lowered"


def default_dense_max_mib(device: torch.device | str) -> float:
    """The default per-layer matrix cap for ``device``
    (:data:`lipcli._util.constants.DENSE_MAX_MIB_DEFAULT`)."""
    kind = torch.device(device).type
    return DENSE_MAX_MIB_DEFAULT.get(kind, DENSE_MAX_MIB_OTHER)


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def lower_body(model: nn.Module, input_shape: tuple[int, ...], dense_max_bytes: int, *,
               plain: bool, inputs: int | None = None) -> tuple[nn.Sequential, list[dict[str, Any]]]:
    """``(lowered body, per-layer descriptions)`` of the eval-mode ``model`` on inputs of
    ``input_shape`` (one example); see the module docstring for ``plain``; ``inputs``: how
    many inputs it will run on (``None``: unbounded).  Errors name the layer
    (:class:`~lipcli.sdk.export.ExportError`)."""
    body = body_of(model)
    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None else torch.get_default_dtype()
    h = torch.zeros((1, *input_shape), dtype=dtype, device=_model_device(model))
    lowered = nn.Sequential()
    lowering: list[dict[str, Any]] = []
    for name, child in body.named_children():
        context = ExportContext(tuple(int(d) for d in h.shape[1:]), int(dense_max_bytes), inputs)
        with torch.no_grad():
            h = child(h)
        if plain or callable(getattr(child, EXPORT_METHOD, None)):
            stand_in = lower_module(child, f"layer {name!r}", context)
        else:
            stand_in = child
        if not plain and not isinstance(stand_in, DenseOperator):
            stand_in = child
        described = getattr(stand_in, LOWERING_ATTRIBUTE, None)
        if isinstance(described, dict):
            lowering.append({"layer": name, **described})
        if isinstance(stand_in, DenseOperator):
            stand_in.to(device=h.device)
            stand_in.requires_grad_(False)
        lowered.add_module(name, stand_in)
    return lowered, lowering


class LoweredNetwork(nn.Module):
    """The model as it runs in eval: ``features(x)`` (the lowered body) and
    ``forward(x) = head(features(x))``.  ``lowering``: per-layer descriptions;
    ``excess``: ``bound_excess`` of each dense layer by name; ``series``: no lowering;
    ``inputs``: the number of inputs the lowering was sized for (``None``: unbounded)."""

    def __init__(self, body: nn.Sequential, head: nn.Module, lowering: list[dict[str, Any]],
                 input_shape: tuple[int, ...], dense_max_mib: float, series: bool,
                 inputs: int | None = None) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.lowering = lowering
        self.input_shape = tuple(input_shape)
        self.dense_max_mib = float(dense_max_mib)
        self.series = bool(series)
        self.inputs = None if inputs is None else int(inputs)
        self.excess = {name: float(child.bound_excess) for name, child in body.named_children()
                       if isinstance(child, DenseOperator)}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    @property
    def dense_layers(self) -> list[str]:
        return sorted(self.excess)


def _weights_token(model: nn.Module) -> tuple:
    return tuple((id(t), t._version, t.data_ptr(), t.dtype, str(t.device))
                 for t in (*model.parameters(), *model.buffers()))


@dataclass
class _Cached:
    key: tuple
    network: LoweredNetwork = field(repr=False)


def lowered_network(model: nn.Module, input_shape: tuple[int, ...] | None = None, *,
                    dense_max_mib: float | None = None, series: bool = False,
                    inputs: int | None = None) -> LoweredNetwork:
    """The cached :class:`LoweredNetwork` of the eval-mode ``model`` (see the module
    docstring).  ``input_shape`` defaults to the model's (``model_input_shape``),
    ``dense_max_mib`` to :func:`default_dense_max_mib` of the model's device (0: no dense
    layer); ``series=True``: the model's own layers; ``inputs``: how many inputs the network
    will run on, so that a layer is lowered only where its build pays off
    (:func:`lipcli.sdk.lowering.pays_off`; ``None``: unbounded, every layer that fits and is
    cheaper).  Only the latest network is kept."""
    if model.training:
        raise LipError("the eval lowering needs the model in eval mode (model.eval())")
    if dense_max_mib is not None and not (math.isfinite(dense_max_mib) and dense_max_mib >= 0):
        raise LipError(f"the dense lowering cap must be a finite number of MiB >= 0, got {dense_max_mib}")
    shape = tuple(int(d) for d in (input_shape or model_input_shape(model)))
    cap = default_dense_max_mib(_model_device(model)) if dense_max_mib is None else float(dense_max_mib)
    if inputs is not None and int(inputs) < 0:
        raise LipError(f"the number of inputs must be >= 0, got {inputs}")
    key = (shape, cap, bool(series), inputs, _weights_token(model))
    cached = model.__dict__.get(_CACHE_ATTRIBUTE)
    if isinstance(cached, _Cached) and cached.key == key:
        return cached.network
    model.__dict__.pop(_CACHE_ATTRIBUTE, None)  # free the old matrices first
    if series:
        body, lowering = body_of(model), []
    else:
        body, lowering = lower_body(model, shape, int(cap * 2**20), plain=False, inputs=inputs)
    network = LoweredNetwork(body, model.head, lowering, shape, cap, series, inputs).eval()
    model.__dict__[_CACHE_ATTRIBUTE] = _Cached(key, network)
    return network


def lowered_upper_bound(model: nn.Module, network: LoweredNetwork | None = None,
                        computed: tuple[float, list[LayerBound]] | None = None,
                        ) -> tuple[float, list[LayerBound]]:
    """GUARANTEED bound of the lowered feature map (module docstring): the per-layer rows
    of :func:`guaranteed_upper_bound` (or ``computed``, its result) with ``bound_excess``
    added to each dense layer's."""
    total, rows = computed if computed is not None else _bound.guaranteed_upper_bound(model)
    if network is None or not network.excess:
        return total, rows
    # Π(U_i + e_i) = Π U_i · Π(1 + e_i/U_i) ≤ total · Π(1 + e_i/U_i), every step rounded up
    out: list[LayerBound] = []
    for row in rows:
        if row.name in network.excess:
            excess = network.excess[row.name]
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
