"""Logit Annealing (LA), the loss of BRONet (Lai et al., *Enhancing Certified Robustness via
Block Reflector Orthogonal Layers and Logit Annealing Loss*, ICLR 2025, §5), as a lipcli
training loss (``--loss la``).

LA is a focal-style cross-entropy on margin-offset logits: with the logits ``z`` (by default
the EMMA-shifted logits of Hu et al. 2023, see below), the label ``l``, offset ``ξ``,
temperature ``τ`` and annealing exponent ``γ``::

    z' = (z − ξ · onehot(l)) / τ
    CE_i = CE(z'_i, l_i),    p_i = exp(−CE_i)           (the softmax probability of l)
    loss = mean_i  α · τ · (1 − p_i)^γ · CE_i

The factor ``(1 − p)^γ`` anneals the push on examples whose margin is already large, so the
limited capacity of a Lipschitz network goes to the examples near the decision boundary (the
paper's argument: for a Lipschitz-bounded network, CE keeps enlarging all margins at the
expense of the hard ones).  ``γ = 0`` is the offset cross-entropy of Prach & Lampert (ECCV
2022) scaled by ``τ``.  ``α`` (``alpha``, default 1: BRONet's ``bronet/`` backbone code has
none) is the focal factor of BRONet's LipConvNet code (``--la_alpha 0.25``,
``lipconvnet/utils/custom_loss.py`` ``FocalLoss``): a constant scale of the loss, which with
SGD and weight decay changes the balance of the two.

With ``eps > 0`` (default, the authors' ``lip_reg``), ``z`` are the EMMA logits: every
non-target logit is raised by its clipped certified-radius margin
``clip((z_l − z_j)/(K_lj ε), min_ratio, 1) · ε · K_lj`` (no gradient through the clip factor),
``K_lj = ‖a_l − a_j‖ · Lip(g)`` from :func:`lipcli.sdk.losses.logit_difference_lipschitz`
(affine heads only); ``eps = 0``: the plain logits (any head).

``ε`` schedule (:class:`lipcli.sdk.losses.EpsSchedule`): in epoch ``e`` of ``E``,
``ε(e) = eps · (min_eps + (max_eps − min_eps) · min(e / E / ramp, 1))``, the formula of the
authors' ``eps_fn`` (ntuaislab/BRONet ``bronet/train.py``, lines 174-177, with their
``min_eps_ratio``/``max_eps_ratio``; CIFAR-10: 0.1 and 3, ramp over the first half:
``bronet/configs/benchmark_reproduce/cifar10.yaml``).  lipcli's defaults
(``min_eps = max_eps = 1``) keep ``ε = eps`` fixed.

Defaults: the authors' CIFAR-10/100 values of ``γ = 5``, ``τ = 0.75``, ``ξ = 2``,
``ε = 36/255``, ``min_ratio = 0.01``.
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
#: most annealing exponent accepted (``(1 − p)^γ`` underflows long before)
MAX_GAMMA = 100.0


def logit_annealing(logits: torch.Tensor, labels: torch.Tensor, *, offset: float,
                    temperature: float, gamma: float, alpha: float = 1.0) -> torch.Tensor:
    """``mean_i α τ (1 − p_i)^γ CE_i`` on ``(logits − ξ onehot) / τ`` (module docstring)."""
    z = (logits - offset * F.one_hot(labels, logits.shape[1]).to(logits.dtype)) / temperature
    ce = F.cross_entropy(z, labels, reduction="none")
    p = torch.exp(-ce)
    return alpha * (temperature * (1.0 - p).pow(gamma) * ce).mean()


class LogitAnnealingLoss(nn.Module):
    """``la`` (module docstring)."""

    def __init__(self, context: LossContext, *, temperature: float, offset: float, gamma: float,
                 eps: float, min_ratio: float, min_eps: float = 1.0, max_eps: float = 1.0,
                 ramp: float = 0.5, alpha: float = 1.0) -> None:
        super().__init__()
        self.context = context
        self.temperature, self.offset, self.gamma = float(temperature), float(offset), float(gamma)
        self.alpha = float(alpha)
        self.eps, self.min_ratio = float(eps), float(min_ratio)
        self.ramp = EpsRamp(check_eps_schedule(eps, min_eps, max_eps, ramp))
        self._checked = False

    def begin_epoch(self, progress: TrainProgress) -> None:
        self.ramp.begin_epoch(progress)

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        features = model.features(images)
        if self.eps > 0 and not self._checked:
            check_affine_head(model.head, features, "la")
            self._checked = True
        with torch.autocast(features.device.type, enabled=False):
            feats = at_least_float32(features)
            logits = model.head(feats)
            z = logits
            if self.eps > 0:
                K = logit_difference_lipschitz(model, feats, self.context)
                z = emma_logits(logits, labels, K, self.ramp.value(), self.min_ratio)
            loss = logit_annealing(z, labels, offset=self.offset, temperature=self.temperature,
                                   gamma=self.gamma, alpha=self.alpha)
        parts = {} if self.ramp.schedule.constant else {"eps": self.ramp.current.detach().clone()}
        return LossOutput(loss, logits.detach(), parts)

    def resolved_params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "offset": self.offset, "gamma": self.gamma,
                **self.ramp.params(), "min_ratio": self.min_ratio, "alpha": self.alpha}


def la_factory(context: LossContext, *, temperature: float = 0.75, offset: float = 2.0,
               gamma: float = 5.0, eps: float = DEFAULT_EPS, min_ratio: float = 0.01,
               min_eps: float = 1.0, max_eps: float = 1.0, ramp: float = 0.5,
               alpha: float = 1.0) -> LogitAnnealingLoss:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not offset >= 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if not 0 <= gamma <= MAX_GAMMA:
        raise ValueError(f"gamma must be in [0, {MAX_GAMMA:g}], got {gamma}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not 0 < min_ratio <= 1:
        raise ValueError(f"min_ratio must be in (0, 1], got {min_ratio}")
    if not 0 < alpha <= 1e3:
        raise ValueError(f"alpha must be in (0, 1000], got {alpha}")
    return LogitAnnealingLoss(context, temperature=temperature, offset=offset, gamma=gamma,
                              eps=eps, min_ratio=min_ratio, min_eps=min_eps, max_eps=max_eps, ramp=ramp,
                              alpha=alpha)
