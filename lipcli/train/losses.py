"""The training losses: cross-entropy, and CRC-Lip's feature attack and curvature penalty (eq. 5).

See the :mod:`lipcli.train` package docstring for the maths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import LipUsageError


def _margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``f_l − f_j`` for every class ``j`` with ``+inf`` at ``j = l``: shape ``(N, c)``."""
    true = logits.gather(1, labels[:, None])
    margins = true - logits
    return margins.scatter(1, labels[:, None], float("inf"))


class FeatureAttack:
    """The ``attack_steps``-step l2 attack on the features used by CRC-Lip training (eq. 5).

    See the :mod:`lipcli.train` docstring; returns ``δ`` with ``‖δ‖ ≤ radius`` and no autograd history.
    """

    def __init__(self, radius: float, steps: int = 5, step_multiplier: float = 1.5) -> None:
        self.radius = float(radius)
        self.steps = int(steps)
        self.step_size = step_multiplier * self.radius / self.steps

    def __call__(self, head: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        y = features.detach().float()
        if self.radius <= 0:
            return torch.zeros_like(y)
        delta = self.step_size * F.normalize(torch.randn_like(y), dim=1)
        for _ in range(self.steps):
            with torch.enable_grad():
                d = delta.detach().requires_grad_(True)
                logits = head(y + d).float()
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

    See the :mod:`lipcli.train` docstring for the estimate.  Buffer ``u`` (the top right
    singular vector of ``W₁``) is training state, saved in checkpoints.
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
                f"the curvature regulariser needs an MLP head with fc1/fc2 linear layers; "
                f"{type(head).__name__} has none (use --curvature-weight 0)"
            )
        return w1, w2

    @torch.no_grad()
    def update_u(self, head: nn.Module, steps: int = 1) -> None:
        """``steps`` power steps of ``W₁ᵀW₁`` on ``u`` (the reference's sigma vector)."""
        w1, _ = self.head_weights(head)
        w1 = w1.detach().float()
        u = self.u
        for _ in range(steps):
            u = F.normalize(w1.t() @ (w1 @ u), dim=0)
        self.u.copy_(u)

    def pair_bounds(self, head: nn.Module, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """Differentiable estimates of ``max(m, M)`` for the class pairs ``(first[i], second[i])``."""
        w1, w2 = self.head_weights(head)
        w1, w2 = w1.float(), w2.float()
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
        masked = logits.detach().float().scatter(1, labels[:, None], float("-inf"))
        others = masked.topk(k, dim=1).indices  # (N, k)
        keys = labels[:, None] * c + others
        uniq, inverse = torch.unique(keys.reshape(-1), return_inverse=True)
        values = self.pair_bounds(head, uniq // c, uniq % c)
        return values[inverse].view(-1, k).mean(dim=1)


class TrainStep(nn.Module):
    """One training forward: the loss of the model's head type (the module DDP wraps).

    ``forward(images, labels)`` returns ``(loss, clean_logits, parts)`` where ``parts`` holds
    detached loss components.
    """

    def __init__(
        self, model: nn.Module, *, attack: FeatureAttack | None = None,
        curvature: CurvaturePenalty | None = None, curvature_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.attack = attack
        self.curvature = curvature
        self.curvature_weight = float(curvature_weight)

    @property
    def crc(self) -> bool:
        return self.attack is not None or self.curvature is not None

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        if not self.crc:
            logits = self.model(images)
            loss = F.cross_entropy(logits.float(), labels)
            return loss, logits.detach(), {"ce": loss.detach()}
        head = self.model.head
        features = self.model.features(images)
        with torch.no_grad():
            clean = head(features).detach()
        with torch.autocast(features.device.type, enabled=False):
            feats = features.float()
            delta = self.attack(head, feats, labels) if self.attack is not None else torch.zeros_like(feats)
            adv_logits = head(feats + delta)
            ce = F.cross_entropy(adv_logits, labels)
            loss = ce
            parts = {"ce": ce.detach()}
            if self.curvature is not None and self.curvature_weight > 0:
                if self.training:
                    self.curvature.update_u(head, 1)
                curv = self.curvature(head, labels, clean).mean()
                loss = loss + self.curvature_weight * curv
                parts["curvature"] = curv.detach()
        return loss, clean, parts
