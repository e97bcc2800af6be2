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
constant where it matters.  Subtracting ``f_l`` does not change the cross-entropy.

``ε`` schedule (:class:`lipcli.sdk.losses.EpsSchedule`): in epoch ``e`` of ``E``,
``ε(e) = eps · (min_eps + (max_eps − min_eps) · min(e / E / ramp, 1))``, the formula of the
authors' ``eps_fn`` (hukkai/liresnet ``train.py``, lines 115-119; their CIFAR-10 values
``min_eps = 0.1``, ``max_eps = 3``, ``ramp = 0.5``, ``configs/cifar10.yaml``).  lipcli's
defaults (``min_eps = max_eps = 1``) keep ``ε = eps`` fixed; ``eps = 36/255`` and
``min_ratio = 0.01`` are the authors' base radius and clip floor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.losses import (
    EpsRamp,
    LossContext,
    LossOutput,
    TrainProgress,
    at_least_float32,
    check_eps_schedule,
    check_affine_head,
    emma_logits,
    logit_difference_lipschitz,
)

DEFAULT_EPS = 36.0 / 255.0


class EMMALoss(nn.Module):
    """``emma`` (module docstring)."""

    def __init__(self, context: LossContext, *, eps: float, min_ratio: float, min_eps: float = 1.0,
                 max_eps: float = 1.0, ramp: float = 0.5) -> None:
        super().__init__()
        self.context, self.eps, self.min_ratio = context, float(eps), float(min_ratio)
        self.ramp = EpsRamp(check_eps_schedule(eps, min_eps, max_eps, ramp))
        self._checked = False

    def begin_epoch(self, progress: TrainProgress) -> None:
        self.ramp.begin_epoch(progress)

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        features = model.features(images)
        if not self._checked:
            check_affine_head(model.head, features, "emma")
            self._checked = True
        with torch.autocast(features.device.type, enabled=False):
            feats = at_least_float32(features)
            logits = model.head(feats)
            K = logit_difference_lipschitz(model, feats, self.context)
            loss = F.cross_entropy(emma_logits(logits, labels, K, self.ramp.value(), self.min_ratio), labels)
        # logged: the largest pair constant max K_lj (an estimate, see the module docstring)
        parts = {"pair_lipschitz": K.detach().max()}
        if not self.ramp.schedule.constant:  # logged as train_eps
            parts["eps"] = self.ramp.current.detach().clone()
        return LossOutput(loss, logits.detach(), parts)

    def resolved_params(self) -> dict[str, Any]:
        return {**self.ramp.params(), "min_ratio": self.min_ratio}


def emma_factory(context: LossContext, *, eps: float = DEFAULT_EPS, min_ratio: float = 0.01,
                 min_eps: float = 1.0, max_eps: float = 1.0, ramp: float = 0.5) -> EMMALoss:
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not 0 < min_ratio <= 1:
        raise ValueError(f"min_ratio must be in (0, 1], got {min_ratio}")
    return EMMALoss(context, eps=eps, min_ratio=min_ratio, min_eps=min_eps, max_eps=max_eps, ramp=ramp)
