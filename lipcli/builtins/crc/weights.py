"""CRC-Lip head weights in float64, and the exact float64 softplus with its error allowance
(SPEC §4).

Head: ``h(y) = W₂ σ(W₁ y + b₁) + b₂`` with σ = softplus (``head.fc1``, ``head.fc2``).  We
certify the mathematical function with ``σ(x) = log(1 + eˣ)`` (the head's float32 forward and
the ``threshold=20`` shortcut of ``F.softplus`` differ from it by rounding only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U64  # float64

@dataclass
class MLPWeights:
    """Float64 (and float32) copies of an MLP head's weights plus norms used in error bounds."""

    w1: torch.Tensor  # (H, D) float64
    b1: torch.Tensor  # (H,)
    w2: torch.Tensor  # (c, H)
    b2: torch.Tensor  # (c,)
    w1_solver: torch.Tensor  # (H, D) in the CG dtype
    w1_row_norm: torch.Tensor  # (H,) ‖W₁[k]‖₂
    w1_frob: float  # ‖W₁‖_F
    w2_abs: torch.Tensor  # (c, H) |W₂|
    w2_row_norm: torch.Tensor  # (c,) ‖W₂[i]‖₂
    w1_sq_bound: float = math.inf  # verified upper bound on ‖W₁‖₂² (set by the certifier)

    @property
    def hidden(self) -> int:
        return self.w1.shape[0]

    @property
    def dim(self) -> int:
        return self.w1.shape[1]

    @property
    def num_classes(self) -> int:
        return self.w2.shape[0]

    @property
    def device(self) -> torch.device:
        return self.w1.device


def mlp_weights(head: nn.Module, solver_dtype: torch.dtype = torch.float32) -> MLPWeights:
    """Extract ``W₁, b₁, W₂, b₂`` from ``head.fc1`` / ``head.fc2`` as float64 tensors."""
    if not (hasattr(head, "fc1") and hasattr(head, "fc2")):
        raise TypeError("crc-lip certifies heads with fc1 = Linear(D, H), fc2 = Linear(H, c)")
    with torch.no_grad():
        w1 = head.fc1.weight.detach().to(torch.float64).contiguous()
        w2 = head.fc2.weight.detach().to(torch.float64).contiguous()
        b1 = _bias(head.fc1, w1.shape[0], w1.device)
        b2 = _bias(head.fc2, w2.shape[0], w1.device)
        return MLPWeights(
            w1=w1,
            b1=b1,
            w2=w2,
            b2=b2,
            w1_solver=w1.to(solver_dtype).contiguous(),
            w1_row_norm=w1.norm(dim=1),
            w1_frob=float(w1.norm()),
            w2_abs=w2.abs(),
            w2_row_norm=w2.norm(dim=1),
        )


def _bias(layer: nn.Module, size: int, device: torch.device) -> torch.Tensor:
    bias = getattr(layer, "bias", None)
    if bias is None:
        return torch.zeros(size, dtype=torch.float64, device=device)
    return bias.detach().to(torch.float64)


def softplus64(z: torch.Tensor) -> torch.Tensor:
    """``log(1 + eᶻ)`` to full float64 accuracy (no threshold shortcut)."""
    return z.clamp_min(0) + torch.log1p(torch.exp(-z.abs()))


def hidden_error(z: torch.Tensor, z_err: torch.Tensor, sp: torch.Tensor, hidden: int) -> torch.Tensor:
    """Per-unit bound on |computed σ(z) - exact σ(z_exact)| incl. the later summation error.

    ``z_err`` bounds |z - z_exact|; σ is 1-Lipschitz; σ's own evaluation costs a few ulps;
    the summation ``Σ_k d_k σ_k`` over ``H`` terms adds at most ``γ_{H+2} Σ|d_k| σ_k``.
    """
    return z_err + 8 * _U64 * (sp + 1.0) + (hidden + 4) * _U64 * sp
