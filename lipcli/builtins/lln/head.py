"""The LLN head (SPEC §4): last layer normalisation.

Logits ``f(y) = y Ŵᵀ + b`` with every row of ``Ŵ`` the corresponding row of ``W`` divided by its
l2 norm. Certified by the exact linear certificate ``min_{j != l} (f_l - f_j) / ||ŵ_l - ŵ_j||``
(certificate ``lln``, ``lipcli.builtins.lln.certificate``). Fed the pooled features
(``features="pool"``, D = 1024 for LipConvnet at width 32). Weight decay (SPEC §6) applies to
the LLN weight only: each head names the parameters that must be excluded in the class
attribute ``no_weight_decay`` (names as in ``named_parameters()``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


#: row norms below this are treated as this (avoids 0/0 for an all-zero row)
_ROW_NORM_FLOOR = 1e-12


class LLNHead(nn.Module):
    """Linear head with last layer normalisation: ``logits = y Ŵᵀ + b``, ``Ŵ_i = W_i/||W_i||``.

    Parameters ``weight`` (``num_classes x in_features``) and ``bias`` (``num_classes``),
    initialised like ``nn.Linear`` (``U(-1/sqrt(D), 1/sqrt(D))``). Certificates must use
    :meth:`normalized_weight`, the exact matrix the forward pass applies.
    """

    no_weight_decay: tuple[str, ...] = ("bias",)

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.num_classes = num_classes
        self.weight = nn.Parameter(torch.empty(num_classes, in_features))
        self.bias = nn.Parameter(torch.empty(num_classes))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.uniform_(-bound, bound)

    def normalized_weight(self) -> torch.Tensor:
        """``Ŵ``: every row of ``weight`` scaled to unit l2 norm (SPEC §4)."""
        norms = self.weight.norm(dim=1, keepdim=True).clamp_min(_ROW_NORM_FLOOR)
        return self.weight / norms

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.linear(y, self.normalized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}"

    def export_module(self) -> nn.Module:
        """``lip export``: a plain linear map with ``Ŵ`` computed once (the same float32
        matrix the forward pass applies)."""
        with torch.no_grad():
            return FixedLinear(self.normalized_weight().detach().clone(), self.bias.detach().clone())


class FixedLinear(nn.Module):
    """``y Wᵀ + b`` with ``W`` and ``b`` stored as buffers (the exported LLN head)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.linear(y, self.weight, self.bias)
