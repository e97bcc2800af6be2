"""Built-in classification heads (SPEC §4): the LLN linear head and the CRC-Lip MLP head.

* ``lln``: last layer normalisation, logits ``f(y) = y Ŵᵀ + b`` with every row of ``Ŵ`` the
  corresponding row of ``W`` divided by its l2 norm. Certified by the exact linear
  certificate ``min_{j != l} (f_l - f_j) / ||ŵ_l - ŵ_j||`` (certificate ``lln``). Fed the
  pooled features (``features="pool"``, D = 1024 for LipConvnet at width 32).
* ``mlp``: ``h(y) = W₂ softplus(W₁ y + b₁) + b₂`` (one hidden layer, width ``hidden``),
  certified by CRC-Lip (paper §5, Appendix E; certificate ``crc-lip``). Fed the MaxMin
  output of the last convolution (``features="activation"``, D = 2048 at width 32).

Weight decay (SPEC §6) applies to the LLN weight only: each head names the parameters that
must be excluded in the class attribute ``no_weight_decay`` (names as in
``named_parameters()``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.hookspecs import hookimpl
from lipcli.specs import HeadSpec, Param

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


def _lln_factory(in_features: int, num_classes: int) -> LLNHead:
    return LLNHead(in_features, num_classes)


def _mlp_factory(in_features: int, num_classes: int, hidden: int = 4096) -> MLPHead:
    return MLPHead(in_features, num_classes, hidden=hidden)


@hookimpl
def lip_heads() -> list[HeadSpec]:
    return [
        HeadSpec(
            name="lln",
            factory=_lln_factory,
            description="linear head with last layer normalisation (exact certificate)",
            certificate="lln",
            features="pool",
        ),
        HeadSpec(
            name="mlp",
            factory=_mlp_factory,
            description="1-hidden-layer softplus MLP certified by CRC-Lip",
            certificate="crc-lip",
            features="activation",
            loss="crc-lip",
            params=(Param(name="hidden", type=int, default=4096, help="hidden width H"),),
        ),
    ]
