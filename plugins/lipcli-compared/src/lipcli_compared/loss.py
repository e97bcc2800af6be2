"""The comparison study's loss (``trainer/metrics/lipschit_ce_loss.py``: ``LipCrossEntropyLoss``;
the offset cross-entropy of Prach & Lampert, ECCV 2022) as the loss component ``offset-ce``:

    ``loss = T · CE((f(x) − u·onehot(l)) / T, l)``

with the offset ``u`` in logit space (the study: ``T = 1/4``, ``u = 2√2·36/255 = 0.3993``,
``settings/defaults_*.yml``), whatever the input normalisation (lipcli's ``margin-offset`` states
the radius in input space instead and scales it by ``1/min(std)``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.losses import LossContext, LossOutput, at_least_float32

#: the study's values
TEMPERATURE, OFFSET = 0.25, 0.3993


class OffsetCrossEntropy(nn.Module):
    def __init__(self, context: LossContext, *, temperature: float = TEMPERATURE, offset: float = OFFSET) -> None:
        super().__init__()
        if not temperature > 0 or not offset >= 0:
            raise ValueError("offset-ce needs temperature > 0 and offset >= 0")
        self.temperature, self.offset = float(temperature), float(offset)

    def objective(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = logits - self.offset * F.one_hot(labels, logits.shape[1]).to(logits.dtype)
        return F.cross_entropy(shifted / self.temperature, labels) * self.temperature

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        logits = model(images)
        return LossOutput(self.objective(at_least_float32(logits), labels), logits.detach(), {})

    def resolved_params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "offset": self.offset}
