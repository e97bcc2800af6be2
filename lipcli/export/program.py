"""The exported program: lowered feature map, head and (optionally) certificate.

:func:`build_program` walks the eval-mode model through the lowering protocol
(:mod:`lipcli.sdk.export`) and returns an :class:`ExportedProgram`:

* input ``x``: ``float32 (N, C, H, W)`` images in ``[0, 1]`` (the normalisation is inside);
* output without a certificate: ``logits`` ``float32 (N, classes)``;
* output with a certificate: ``(logits, radius)``, ``radius`` ``float64 (N,)`` the
  certified **input-space** l2 radius of the prediction ``argmax(logits)``:
  the feature-space certificate divided by the guaranteed Lipschitz bound ``L`` of the
  feature map (normalisation included), rounded down (multiplied by ``1 − 2⁻⁵²``, at least
  one unit in the last place below the quotient, as ``lip certify``'s one-ulp rounding);
  0 where the certificate's float64 prediction differs from ``argmax(logits)`` (a near tie).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from types import SimpleNamespace

from lipcli.lipschitz.bound import lowered_upper_bound
from lipcli.lowering import caps
from lipcli.lowering.network import lower_body
from lipcli.sdk.export import LOWERING_ATTRIBUTE, ExportedCertificate, ExportError, lower_module
from lipcli.sdk.lowering import DenseOperator, LoweringContext

#: factor that rounds the quotient ``r / L`` down (see the module docstring)
ROUND_DOWN = 1.0 - 2.0**-52


class ExportedProgram(nn.Module):
    """``x -> logits`` or ``x -> (logits, radius)`` in plain torch operations."""

    def __init__(self, body: nn.Sequential, head: nn.Module, certificate: nn.Module | None = None,
                 lipschitz: float | None = None) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.certificate = certificate
        if certificate is not None and not (lipschitz is not None and lipschitz > 0):
            raise ValueError("a certificate needs the guaranteed Lipschitz bound (> 0)")
        self.lipschitz = float(lipschitz) if lipschitz is not None else 0.0
        #: per layer, how it was lowered (``export_lowering`` of the lowered modules that
        #: describe themselves): ``[{"layer": name, ...}]``; not part of the computation
        self.lowering: list[dict[str, Any]] = []

    def forward(self, x: torch.Tensor) -> Any:
        y = self.body(x)
        logits = self.head(y)
        if self.certificate is None:
            return logits
        pred, radius = self.certificate(y)
        radius = radius / self.lipschitz * ROUND_DOWN
        radius = torch.where(pred == logits.argmax(dim=1), radius, torch.zeros_like(radius))
        return logits, radius


def build_program(model: nn.Module, certificate: ExportedCertificate | None = None,
                  lipschitz: float | None = None, input_shape: tuple[int, ...] | None = None,
                  dense_max_bytes: int = caps.dense_max_bytes(caps.EXPORT_DENSE_MAX_MIB)) -> ExportedProgram:
    """Lower every child of ``model.body`` and ``model.head`` (errors name the layer and its
    component); ``certificate`` and ``lipschitz`` for ``--certify`` (``lipschitz`` ``None``:
    the GUARANTEED bound of the lowered operator,
    :func:`lipcli.lipschitz.bound.lowered_upper_bound`).  With ``input_shape`` (one
    example, no batch) the body is lowered by :func:`lipcli.lowering.network.lower_body`
    (the eval lowering ``lip certify`` runs: each child with a
    :class:`~lipcli.sdk.lowering.LoweringContext` holding its input shape and
    ``dense_max_bytes``)."""
    body = getattr(model, "body", None)
    head = getattr(model, "head", None)
    if not isinstance(body, nn.Sequential) or not isinstance(head, nn.Module):
        raise ExportError(
            f"{type(model).__name__} has no 'body' nn.Sequential and 'head': lip export needs the "
            "feature map / head layout of lipcli architectures"
        )
    if input_shape is not None:  # the eval lowering shared with lip certify
        lowered, lowering = lower_body(model, tuple(input_shape), int(dense_max_bytes), plain=True)
    else:
        lowered, lowering = nn.Sequential(), []
        for name, child in body.named_children():
            lowered.add_module(name, lower_module(child, f"layer {name!r}"))
    excess = {name: float(child.bound_excess) for name, child in lowered.named_children()
              if isinstance(child, DenseOperator)}
    if certificate is not None and lipschitz is None:
        # the GUARANTEED bound of the operator that runs (dense layers' float32 matrices included)
        lipschitz = lowered_upper_bound(model, SimpleNamespace(excess=excess))[0]
    context = None
    if input_shape is not None:
        with torch.no_grad():
            param = next(model.parameters(), None)
            probe = torch.zeros((1, *input_shape), dtype=param.dtype if param is not None else None,
                                device=param.device if param is not None else None)
            context = LoweringContext(tuple(lowered(probe).shape[1:]), int(dense_max_bytes))
    head_lowered = lower_module(head, "the head", context)
    described = getattr(head_lowered, LOWERING_ATTRIBUTE, None)
    if isinstance(described, dict):
        lowering.append({"layer": "head", **described})
    program = ExportedProgram(
        lowered, head_lowered,
        None if certificate is None else certificate.module.eval(), lipschitz,
    )
    program.excess = excess
    program.lowering = lowering
    for p in program.parameters():
        p.requires_grad_(False)
    return program.eval()
