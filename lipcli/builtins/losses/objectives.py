"""Built-in training losses: ``ce`` (default), ``cr`` and ``margin-offset``.

(The CRC-Lip loss ``crc-lip`` lives with the rest of CRC-Lip training in
:mod:`lipcli.builtins.crc.loss`.)  All follow :mod:`lipcli.sdk.losses`:
``factory(context, **params)`` -> ``loss(model, images, labels) -> LossOutput``.

``ce``
    ``CE(f(x), l)``, computed in float32: the paper's loss for the LLN head.
``cr``
    The certificate regulariser of the paper authors' code (SOC / LLN training, their
    ``--gamma``): ``CE(f(x), l) − γ · mean_i relu(R_i)`` with the certificate of an affine head
    ``f(y) = A y + b`` on the features ``y = g(x)``::

        R_i = min_{j ≠ l} (f_l − f_j) / (‖a_l − a_j‖₂ · L)

    ``a_k`` is row ``k`` of ``A`` (for LLN the normalised weight row, so this is the LLN
    certificate, SPEC §4) and ``L = 1 / min(std)`` the input normalisation's Lipschitz factor
    (the paper code's ``L``; the other layers are 1-Lipschitz).  ``A`` is read off the head
    itself (``A = h(I) − h(0)``, differentiable), so any affine head works; a head that is
    not affine is rejected at the first step.  ``γ = 0`` is plain ``ce`` (same values).
``margin-offset``
    Prach & Lampert (ECCV 2022), offset cross-entropy: the true class's logit is lowered by
    ``u = √2 · ε · L`` and the logits divided by the temperature ``τ``::

        loss = τ · CE((f(x) − u · onehot(l)) / τ, l)

    so that the loss keeps pushing until the margin exceeds ``√2 ε L`` (what a 1-Lipschitz
    logit map needs to certify radius ``ε``).  ``ε`` is in input space, ``L = 1 / min(std)``
    as above.  ``eps = 0, temperature = 1`` is plain ``ce`` (same values).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.losses import LossContext, LossOutput, affine_head_rows, at_least_float32, check_affine_head

#: default radius (input space) of the margin-offset loss: the paper's smallest, 36/255
DEFAULT_EPS = 36.0 / 255.0


class CrossEntropyLoss(nn.Module):
    """``ce``: cross-entropy of the clean logits (float32)."""

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        logits = model(images)
        loss = F.cross_entropy(at_least_float32(logits), labels)
        return LossOutput(loss, logits.detach(), {})


class CertificateRegularizedLoss(nn.Module):
    """``cr``: ``CE − γ · mean relu(certificate)`` for affine heads (module docstring)."""

    def __init__(self, context: LossContext, *, gamma: float) -> None:
        super().__init__()
        self.gamma = float(gamma)
        self.lipschitz = context.input_lipschitz
        self._checked = False

    def certificates(self, head: nn.Module, features: torch.Tensor, logits: torch.Tensor,
                     labels: torch.Tensor) -> torch.Tensor:
        """``R_i`` of every example (differentiable in the features and the head)."""
        rows = affine_head_rows(head, features.shape[1], like=logits)  # (c, D)
        sq = (rows * rows).sum(dim=1)
        gram = sq[:, None] + sq[None, :] - 2.0 * rows @ rows.t()
        # clamped before the root: the diagonal (0) gets no gradient, and no inf/nan anywhere
        distance = gram.clamp_min(1e-24).sqrt()  # (c, c), ‖a_k − a_j‖
        scale = distance[labels] * self.lipschitz  # (N, c)
        margins = logits.gather(1, labels[:, None]) - logits
        own = F.one_hot(labels, logits.shape[1]).bool()
        return (margins / scale).masked_fill(own, float("inf")).min(dim=1).values

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        features = model.features(images)
        head = model.head
        if not self._checked:
            check_affine_head(head, features, "cr")
            self._checked = True
        with torch.autocast(features.device.type, enabled=False):
            feats = at_least_float32(features)
            logits = head(feats)
            ce = F.cross_entropy(logits, labels)
            cert = self.certificates(head, feats, logits, labels)
            loss = ce - self.gamma * F.relu(cert).mean()
        return LossOutput(loss, logits.detach(), {"certificate": cert.detach().mean()})

    def resolved_params(self) -> dict[str, Any]:
        return {"gamma": self.gamma}


class MarginOffsetLoss(nn.Module):
    """``margin-offset``: ``τ · CE((f − u·onehot)/τ)`` with ``u = √2 ε L`` (module docstring)."""

    def __init__(self, context: LossContext, *, eps: float, temperature: float) -> None:
        super().__init__()
        self.eps, self.temperature = float(eps), float(temperature)
        self.offset = math.sqrt(2.0) * self.eps * context.input_lipschitz

    def objective(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = logits - self.offset * F.one_hot(labels, logits.shape[1]).to(logits.dtype)
        return F.cross_entropy(shifted / self.temperature, labels) * self.temperature

    def forward(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> LossOutput:
        logits = model(images)
        out = at_least_float32(logits)
        return LossOutput(self.objective(out, labels), logits.detach(), {})

    def resolved_params(self) -> dict[str, Any]:
        return {"eps": self.eps, "temperature": self.temperature}
