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

from lipcli.sdk.export import LOWERING_ATTRIBUTE, ExportContext, ExportedCertificate, lower_module
from lipcli.export.options import DENSE_MAX_MIB
from lipcli.sdk.export import ExportError

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
                  dense_max_bytes: int = int(DENSE_MAX_MIB * 2**20)) -> ExportedProgram:
    """Lower every child of ``model.body`` and ``model.head`` (errors name the layer and its
    component); ``certificate`` and ``lipschitz`` for ``--certify``.  With ``input_shape``
    (one example, no batch) each child is lowered with an :class:`ExportContext` holding the
    shape of its input (found by running one zero example through the eval-mode model) and
    ``dense_max_bytes``."""
    body = getattr(model, "body", None)
    head = getattr(model, "head", None)
    if not isinstance(body, nn.Sequential) or not isinstance(head, nn.Module):
        raise ExportError(
            f"{type(model).__name__} has no 'body' nn.Sequential and 'head': lip export needs the "
            "feature map / head layout of lipcli architectures"
        )
    lowering: list[dict[str, Any]] = []
    h = None if input_shape is None else torch.zeros((1, *input_shape))

    def lower(child: nn.Module, name: str, where: str) -> nn.Module:
        nonlocal h
        context = None
        if h is not None:
            context = ExportContext(tuple(h.shape[1:]), int(dense_max_bytes))
            with torch.no_grad():
                h = child(h)
        lowered = lower_module(child, where, context)
        described = getattr(lowered, LOWERING_ATTRIBUTE, None)
        if isinstance(described, dict):
            lowering.append({"layer": name, **described})
        return lowered

    lowered = nn.Sequential()
    for name, child in body.named_children():
        lowered.add_module(name, lower(child, name, f"layer {name!r}"))
    program = ExportedProgram(
        lowered, lower(head, "head", "the head"),
        None if certificate is None else certificate.module.eval(), lipschitz,
    )
    program.lowering = lowering
    for p in program.parameters():
        p.requires_grad_(False)
    return program.eval()
