"""Shared by the CRC-Lip tests (tests/builtins/crc): ``MLP(dim, hidden, classes, scale=1.0,
seed=0)``, a float64 softplus MLP with the ``mlp`` head's attribute names (``fc1``, ``fc2``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Same attribute names as the ``mlp`` head: ``fc1``, ``fc2``, softplus in between."""

    def __init__(self, dim: int, hidden: int, classes: int, scale: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, classes)
        with torch.no_grad():
            self.fc1.weight.mul_(scale)
            self.fc2.weight.mul_(scale)
        self.double()

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.softplus(self.fc1(y)))
