"""The CRC-Lip training loss (paper eq. 5, SPEC §4): the ``crc-lip`` loss component.

Moved here from the trainer: the trainer only calls the ``lip_losses`` protocol
(:mod:`lipcli.sdk.losses`); everything about the MLP head's curvature lives in this module::

    loss = CE(h(y + δ*), l) + γ · mean_{j ≠ l} max(m_lj, M_lj)

* ``y = g(x)`` the features; ``δ*`` from :class:`FeatureAttack`: an ``attack_steps``-step l2
  attack on the features only, radius ``ρ_f = ρ / min(std)`` (``ρ`` = parameter ``radius`` in
  input space; ``1/min(std)`` is the Lipschitz factor of the input normalisation, SPEC's
  ``ρ / 0.2507`` for CIFAR), step ``1.5 ρ_f / steps``, random start of one step length,
  target = the class of smallest margin ``h_l − h_j`` at the current point, each step
  ``δ ← Π_ball(δ − step · ∇/‖∇‖)`` where ``∇`` is the gradient of that margin; no gradient
  flows through ``δ*`` (``y`` itself carries the gradient, "the identity map carries
  gradients to g").
* ``M_lj = ¼ λ_max(W₁ᵀ diag(d⁺) W₁)``, ``m_lj = ¼ λ_max(W₁ᵀ diag(d⁻) W₁)``, ``d = W₂[l] − W₂[j]``
  (``¼ ≥ softplus''``).  Computed cheaply and differentiably by :class:`CurvaturePenalty`:
  a persistent unit vector ``u`` tracks the top right singular vector of ``W₁`` (one power
  step per training step, ``power_iter_steps`` (50) at the end of every epoch); per pair,
  ``power_steps`` (2) power steps on ``W₁ᵀ diag(d±) W₁`` start from ``u`` without gradient,
  and the Rayleigh quotient ``¼ Σ_h d±_h (W₁ v)_h²`` at the resulting unit ``v`` is the
  differentiable value (``v`` held constant), as the reference does.  These are LOWER
  estimates of ``λ_max``: fine for a regulariser, never used for certificates.  Pairs: all
  classes ``j ≠ l`` for the labels in the batch (``classes = 0``), or the ``k`` highest other
  logits per example (``classes = k``; the reference uses 9).  ``γ`` = parameter ``gamma``.
* Paper settings (the loss spec's ``recipe``): CIFAR-10 ``ρ = 36/255``, ``γ = 0.5``;
  CIFAR-100 ``ρ = 0.2``, ``γ = 0.75``; other data sets CIFAR-10's.  Trained with gradient
  clipping at 1.0 unless ``--grad-clip`` says otherwise (the spec's ``grad_clip``).

The curvature regulariser needs the head ``fc2(softplus(fc1(y)))`` of the built-in ``mlp``
head (the feature attack works with any head; ``gamma=0`` drops the regulariser).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.losses import LossContext, LossOutput, at_least_float32, class_margins

_margins = class_margins


class FeatureAttack:
    """The ``steps``-step l2 attack on the features used by CRC-Lip training (eq. 5).

    See the module docstring; returns ``δ`` with ``‖δ‖ ≤ radius`` and no autograd history.
    """

    def __init__(self, radius: float, steps: int = 5, step_multiplier: float = 1.5) -> None:
        self.radius = float(radius)
        self.steps = int(steps)
        self.step_size = step_multiplier * self.radius / self.steps

    def __call__(self, head: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        y = at_least_float32(features.detach())
        if self.radius <= 0:
            return torch.zeros_like(y)
        delta = self.step_size * F.normalize(torch.randn_like(y), dim=1)
        for _ in range(self.steps):
            with torch.enable_grad():
                d = delta.detach().requires_grad_(True)
                logits = at_least_float32(head(y + d))
                margin = _margins(logits, labels)
                target = margin.argmin(dim=1, keepdim=True)
                objective = margin.gather(1, target).sum()
                (grad,) = torch.autograd.grad(objective, d)
            delta = delta - self.step_size * F.normalize(grad, dim=1)
            norms = delta.norm(dim=1, keepdim=True)
            delta = delta * torch.clamp(self.radius / norms.clamp_min(1e-12), max=1.0)
        return delta.detach()


class CurvaturePenalty(nn.Module):
    """``mean_j max(m_lj, M_lj)`` per example for an MLP head ``fc2(softplus(fc1(y)))``.

    See the module docstring for the estimate.  Buffer ``u`` (the top right singular vector
    of ``W₁``) is training state, saved in checkpoints.
    """

    #: bound on softplus'' (SPEC §4)
    HESSIAN_BOUND = 0.25

    def __init__(self, in_features: int, *, power_steps: int = 2, other_classes: int = 0, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        u = torch.randn(in_features, generator=gen)
        self.register_buffer("u", u / u.norm())
        self.power_steps = int(power_steps)
        self.other_classes = int(other_classes)

    @staticmethod
    def head_weights(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        fc1, fc2 = getattr(head, "fc1", None), getattr(head, "fc2", None)
        w1, w2 = getattr(fc1, "weight", None), getattr(fc2, "weight", None)
        if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor):
            raise LipUsageError(
                f"the crc-lip curvature regulariser needs an MLP head with fc1/fc2 linear layers; "
                f"{type(head).__name__} has none (use --loss crc-lip:gamma=0 or another loss)"
            )
        return w1, w2

    @torch.no_grad()
    def update_u(self, head: nn.Module, steps: int = 1) -> None:
        """``steps`` power steps of ``W₁ᵀW₁`` on ``u`` (the reference's sigma vector)."""
        w1, _ = self.head_weights(head)
        w1 = at_least_float32(w1.detach())
        u = self.u
        for _ in range(steps):
            u = F.normalize(w1.t() @ (w1 @ u), dim=0)
        self.u.copy_(u)

    def pair_bounds(self, head: nn.Module, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """Differentiable estimates of ``max(m, M)`` for the class pairs ``(first[i], second[i])``."""
        w1, w2 = self.head_weights(head)
        w1, w2 = at_least_float32(w1), at_least_float32(w2)
        d = w2[first] - w2[second]  # (P, H)
        dmag = torch.cat([d.clamp_min(0.0), (-d).clamp_min(0.0)], dim=0)  # d⁺ rows, then d⁻
        with torch.no_grad():
            v = self.u.to(w1.dtype).expand(dmag.shape[0], -1).clone()
            w1d, dd = w1.detach(), dmag.detach()
            for _ in range(self.power_steps):
                v = F.normalize(((v @ w1d.t()) * dd) @ w1d, dim=1)
        z = v @ w1.t()  # (2P, H), gradient to W1
        lam = self.HESSIAN_BOUND * (z * z * dmag).sum(dim=1)
        n = first.shape[0]
        return torch.maximum(lam[:n], lam[n:])

    def forward(self, head: nn.Module, labels: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example ``mean_j max(m_lj, M_lj)``: shape ``(N,)``."""
        _, w2 = self.head_weights(head)
        c = w2.shape[0]
        if self.other_classes == 0 or self.other_classes >= c - 1 or logits is None:
            labs, inverse = torch.unique(labels, return_inverse=True)
            everyone = torch.arange(c, device=labels.device)
            others = everyone[None, :].expand(labs.shape[0], c).masked_select(
                everyone[None, :] != labs[:, None]
            ).view(labs.shape[0], c - 1)
            first = labs[:, None].expand_as(others).reshape(-1)
            values = self.pair_bounds(head, first, others.reshape(-1)).view(labs.shape[0], c - 1)
            return values.mean(dim=1)[inverse]
        k = self.other_classes
        masked = at_least_float32(logits.detach()).scatter(1, labels[:, None], float("-inf"))
        others = masked.topk(k, dim=1).indices  # (N, k)
        keys = labels[:, None] * c + others
        uniq, inverse = torch.unique(keys.reshape(-1), return_inverse=True)
        values = self.pair_bounds(head, uniq // c, uniq % c)
        return values[inverse].view(-1, k).mean(dim=1)


class CRCLipLoss(nn.Module):
    """The ``crc-lip`` training loss: CE at the feature attack's point + γ · curvature.

    ``radius`` is in input space (the attack runs at ``radius / min(std)`` in feature space);
    ``gamma = 0`` drops the curvature term, ``radius = 0`` the attack.  Its state (the
    curvature's vector ``u``, under the key ``u``) is saved in checkpoints.
    """

    def __init__(self, context: LossContext, *, radius: float, gamma: float, attack_steps: int = 5,
                 power_steps: int = 2, classes: int = 0) -> None:
        super().__init__()
        self.radius, self.gamma = float(radius), float(gamma)
        self.attack_steps, self.power_steps, self.classes = int(attack_steps), int(power_steps), int(classes)
        self.refresh_steps = int(context.refresh_steps)
        self.attack = (FeatureAttack(self.radius * context.input_lipschitz, steps=self.attack_steps)
                       if self.radius else None)
        self.curvature: CurvaturePenalty | None = None
        if self.gamma:
            head = context.model.head
            w1 = CurvaturePenalty.head_weights(head)[0]
            self.curvature = CurvaturePenalty(
                w1.shape[1], power_steps=self.power_steps, other_classes=self.classes, seed=context.seed,
            ).to(device=context.device, dtype=at_least_float32(w1).dtype)
            self.curvature.update_u(head, self.refresh_steps)

    def resolved_params(self) -> dict[str, Any]:
        return {"radius": self.radius, "gamma": self.gamma, "attack_steps": self.attack_steps,
                "power_steps": self.power_steps, "classes": self.classes}

    # the checkpoint keeps the curvature's state under "u" (as before the loss became a plugin)
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return {} if self.curvature is None else self.curvature.state_dict(*args, **kwargs)

    def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        if self.curvature is not None:
            return self.curvature.load_state_dict(state, strict=strict)
        return None

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        head = model.head
        features = model.features(images)
        with torch.no_grad():
            clean = head(features).detach()
        with torch.autocast(features.device.type, enabled=False):
            feats = at_least_float32(features)
            delta = self.attack(head, feats, labels) if self.attack is not None else torch.zeros_like(feats)
            adv_logits = head(feats + delta)
            ce = F.cross_entropy(adv_logits, labels)
            loss = ce
            parts = {}
            if self.curvature is not None and self.gamma > 0:
                if self.training:
                    self.curvature.update_u(head, 1)
                curv = self.curvature(head, labels, clean).mean()
                loss = loss + self.gamma * curv
                parts["curvature"] = curv.detach()
        return LossOutput(loss, clean, parts)

    def end_epoch(self, model: nn.Module) -> None:
        """``refresh_steps`` power steps on ``u`` (the reference's end-of-epoch update)."""
        if self.curvature is not None:
            self.curvature.update_u(model.head, self.refresh_steps)
