"""The CRC-Lip head (SPEC §4): ``h(y) = W₂ softplus(W₁ y + b₁) + b₂``.

One hidden layer of width ``hidden``, certified by CRC-Lip (paper §5, Appendix E; certificate
``crc-lip``, ``lipcli.builtins.crc.certifier``) and trained with the CRC-Lip loss
(``lipcli.builtins.crc.loss``). Fed the MaxMin output of the last convolution
(``features="activation"``, D = 2048 at width 32). No weight decay on any of its parameters
(SPEC §6).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the widest hidden layer a ``mlp`` head takes (8 times the paper's 4096)
MAX_HIDDEN = 32768


class MLPHead(nn.Module):
    """One-hidden-layer softplus MLP ``h(y) = fc2(softplus(fc1(y)))`` (SPEC §4, CRC-Lip).

    ``fc1 = nn.Linear(D, H)`` holds ``W₁, b₁``; ``fc2 = nn.Linear(H, c)`` holds ``W₂, b₂``.
    No weight decay on any of them (SPEC §6).
    """

    no_weight_decay: tuple[str, ...] = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")

    def __init__(self, in_features: int, num_classes: int, hidden: int = 4096) -> None:
        super().__init__()
        if hidden < 1:
            raise ValueError(f"MLP head: hidden must be positive, got {hidden}")
        self.in_features = in_features
        self.num_classes = num_classes
        self.hidden = hidden
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.softplus(self.fc1(y)))

    def export_module(self) -> nn.Module:
        """``lip export``: the forward is plain torch operations already."""
        return self
