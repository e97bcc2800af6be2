"""The eval lowering of a whole model, built once per model and input shape (see
:mod:`lipcli.lowering`): :func:`lower_body`, :class:`LoweredNetwork`, :func:`lowered_network`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lipcli.host.layout import body_of, model_input_shape
from lipcli.lowering.caps import certify_dense_max_mib, check_dense_max_mib, dense_max_bytes
from lipcli.sdk.errors import LipError
from lipcli.sdk.export import EXPORT_METHOD, LOWERING_ATTRIBUTE, lower_module
from lipcli.sdk.lowering import DenseOperator, LoweringContext

#: the model attribute holding its cached lowered networks (dropped by copies that must not share them)
CACHE_ATTRIBUTE = "_lipcli_lowered"


def default_dense_max_mib(device: torch.device | str) -> float:
    """The default per-layer matrix cap for ``device``
    (:data:`lipcli.lowering.caps.CERTIFY_DENSE_MAX_MIB`)."""
    return certify_dense_max_mib(torch.device(device).type)


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def lower_body(model: nn.Module, input_shape: tuple[int, ...], dense_max_bytes: int, *,
               plain: bool, inputs: int | None = None) -> tuple[nn.Sequential, list[dict[str, Any]]]:
    """``(lowered body, per-layer descriptions)`` of the eval-mode ``model`` on inputs of
    ``input_shape`` (one example), each child lowered with a
    :class:`~lipcli.sdk.lowering.LoweringContext` holding its input shape, ``dense_max_bytes``
    and ``inputs`` (how many inputs it will run on; ``None``: unbounded).  With
    ``plain=True`` (``lip export``) every child becomes its plain-torch stand-in; otherwise
    only the dense stand-ins replace their layers and every other child stays the model's
    own module.  Errors name the layer (:class:`~lipcli.sdk.export.ExportError`)."""
    body = body_of(model)
    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None else torch.get_default_dtype()
    h = torch.zeros((1, *input_shape), dtype=dtype, device=_model_device(model))
    lowered = nn.Sequential()
    lowering: list[dict[str, Any]] = []
    for name, child in body.named_children():
        context = LoweringContext(tuple(int(d) for d in h.shape[1:]), int(dense_max_bytes), inputs)
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
    """The cached :class:`LoweredNetwork` of the eval-mode ``model`` (see
    :mod:`lipcli.lowering`).  ``input_shape`` defaults to the model's (``model_input_shape``),
    ``dense_max_mib`` to :func:`default_dense_max_mib` of the model's device (0: no dense
    layer; checked by :func:`~lipcli.lowering.caps.check_dense_max_mib`); ``series=True``:
    the model's own layers; ``inputs``: how many inputs the network will run on, so that a
    layer is lowered only where its build pays off (:func:`lipcli.sdk.lowering.pays_off`;
    ``None``: unbounded, every layer that fits and is cheaper).  Only the latest network is
    kept."""
    if model.training:
        raise LipError("the eval lowering needs the model in eval mode (model.eval())")
    check_dense_max_mib(dense_max_mib, default_allowed=True)
    shape = tuple(int(d) for d in (input_shape or model_input_shape(model)))
    cap = default_dense_max_mib(_model_device(model)) if dense_max_mib is None else float(dense_max_mib)
    if inputs is not None and int(inputs) < 0:
        raise LipError(f"the number of inputs must be >= 0, got {inputs}")
    key = (shape, cap, bool(series), inputs, _weights_token(model))
    cached = model.__dict__.get(CACHE_ATTRIBUTE)
    if isinstance(cached, _Cached) and cached.key == key:
        return cached.network
    model.__dict__.pop(CACHE_ATTRIBUTE, None)  # free the old matrices first
    if series:
        body, lowering = body_of(model), []
    else:
        body, lowering = lower_body(model, shape, dense_max_bytes(cap), plain=False, inputs=inputs)
    network = LoweredNetwork(body, model.head, lowering, shape, cap, series, inputs).eval()
    model.__dict__[CACHE_ATTRIBUTE] = _Cached(key, network)
    return network
