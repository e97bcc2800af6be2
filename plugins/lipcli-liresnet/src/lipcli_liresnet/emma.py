"""EMMA, Efficient Margin MAximization (Hu et al., *Unlocking Deterministic Robustness
Certification on ImageNet*, NeurIPS 2023, §5), as a lipcli training loss (``--loss emma``).

For an example with label ``l``, logits ``f`` and the Lipschitz constants
``K_lj = ‖a_l − a_j‖ · Lip(g)`` of the logit differences ``f_l − f_j`` in input space (the LLN
head's normalised rows ``a`` and the feature map's training estimate ``Lip(g)``:
:func:`lipcli.sdk.losses.logit_difference_lipschitz`), EMMA raises every non-target logit by
the margin it would need to stay certified at the radius ``ε_j`` it can currently hope for::

    ε_j = clip((f_l − f_j) / (K_lj · ε), min_ratio, 1) · ε        (no gradient through ε_j)
    f'_j = f_j − f_l + ε_j · K_lj       (f'_l = 0)
    loss = CE(f', l)

i.e. the certified radius against class ``j`` clipped to ``[min_ratio·ε, ε]``: classes already
certified beyond ``ε`` are raised by the full ``ε K_lj``, misclassified ones by
``min_ratio·ε·K_lj``.  Gradients flow through the logits and through ``K`` (the head's rows
and the Lipschitz estimate), which is what makes EMMA shrink the network's Lipschitz
constant where it matters.  Defaults as in the authors' CIFAR configuration: ``ε = 36/255``,
``min_ratio = 0.01``.  Subtracting ``f_l`` does not change the cross-entropy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.losses import (
    LossContext,
    LossOutput,
    at_least_float32,
    check_affine_head,
    emma_logits,
    logit_difference_lipschitz,
)

DEFAULT_EPS = 36.0 / 255.0


class EMMALoss(nn.Module):
    """``emma`` (module docstring)."""

    def __init__(self, context: LossContext, *, eps: float, min_ratio: float) -> None:
        super().__init__()
        self.context, self.eps, self.min_ratio = context, float(eps), float(min_ratio)
        self._checked = False

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        features = model.features(images)
        if not self._checked:
            check_affine_head(model.head, features, "emma")
            self._checked = True
        with torch.autocast(features.device.type, enabled=False):
            feats = at_least_float32(features)
            logits = model.head(feats)
            K = logit_difference_lipschitz(model, feats, self.context)
            loss = F.cross_entropy(emma_logits(logits, labels, K, self.eps, self.min_ratio), labels)
        # logged: the largest pair constant max K_lj (an estimate, see the module docstring)
        return LossOutput(loss, logits.detach(), {"pair_lipschitz": K.detach().max()})

    def resolved_params(self) -> dict[str, Any]:
        return {"eps": self.eps, "min_ratio": self.min_ratio}


def emma_factory(context: LossContext, *, eps: float = DEFAULT_EPS, min_ratio: float = 0.01) -> EMMALoss:
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not 0 < min_ratio <= 1:
        raise ValueError(f"min_ratio must be in (0, 1], got {min_ratio}")
    return EMMALoss(context, eps=eps, min_ratio=min_ratio)
