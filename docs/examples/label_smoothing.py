"""A complete training-loss plugin: label-smoothed cross-entropy (``lip train --loss smooth-ce``).

docs/plugins.md shows this file verbatim; tests/test_docs.py trains a tiny model with it.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.losses import LossContext, LossOutput
from lipcli.sdk.specs import LossSpec, Param


class LabelSmoothing(nn.Module):
    def __init__(self, smoothing: float) -> None:
        super().__init__()
        self.smoothing = smoothing

    def forward(self, model: nn.Module, images, labels) -> LossOutput:
        logits = model(images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.smoothing)
        return LossOutput(loss, logits.detach(), {})


def factory(context: LossContext, *, smoothing: float = 0.1) -> LabelSmoothing:
    if not 0 <= smoothing < 1:
        raise ValueError("smoothing must be in [0, 1)")
    return LabelSmoothing(smoothing)


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [
        LossSpec(
            name="smooth-ce",
            factory=factory,
            description="label-smoothed cross-entropy",
            params=(Param(name="smoothing", type=float, default=0.1, help="in [0, 1)"),),
        )
    ]
