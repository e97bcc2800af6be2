"""The exported program: lowered feature map, head and (optionally) certificate.

:func:`build_program` walks the eval-mode model through the lowering protocol
(:mod:`lipcli.export.lowering`) and returns an :class:`ExportedProgram`:

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

from lipcli.export.lowering import ExportedCertificate, lower_module

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
                  lipschitz: float | None = None) -> ExportedProgram:
    """Lower every child of ``model.body`` and ``model.head`` (errors name the layer and its
    component); ``certificate`` and ``lipschitz`` for ``--certify``."""
    body = getattr(model, "body", None)
    head = getattr(model, "head", None)
    if not isinstance(body, nn.Sequential) or not isinstance(head, nn.Module):
        from lipcli.export.lowering import ExportError

        raise ExportError(
            f"{type(model).__name__} has no 'body' nn.Sequential and 'head': lip export needs the "
            "feature map / head layout of lipcli architectures"
        )
    lowered = nn.Sequential()
    for name, child in body.named_children():
        lowered.add_module(name, lower_module(child, f"layer {name!r}"))
    program = ExportedProgram(
        lowered, lower_module(head, "the head"),
        None if certificate is None else certificate.module.eval(), lipschitz,
    )
    for p in program.parameters():
        p.requires_grad_(False)
    return program.eval()
