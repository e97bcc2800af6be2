"""The dense Sandwich layer (the study's / LBDN's ``SandwichFc``): ``√2·AᵀΨ ReLU(√2·Ψ⁻¹B x + b)``
with ``[A B] = Cayley(α·P/‖P‖_F)`` (``P``: ``weight``, ``out × (in + out)``; ``alpha`` starts at
``‖P‖_F``), verified bound :func:`lipcli_sandwich.core.sandwich_bound`.  The comparison study's
network uses it as the Sandwich network's dense layer."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .core import SQRT2, cayley, sandwich_bound

__all__ = ["SandwichFc"]


class SandwichFc(nn.Module):
    lip_affine = False

    def __init__(self, in_features: int, out_features: int, *, psi_in_bias: bool = False) -> None:
        super().__init__()
        if int(in_features) < 1 or int(out_features) < 1:
            raise ValueError("SandwichFc: sizes must be positive")
        self.in_features, self.out_features = int(in_features), int(out_features)
        lin = nn.Linear(self.in_features + self.out_features, self.out_features)
        self.weight = nn.Parameter(lin.weight.detach().clone())
        self.bias = nn.Parameter(lin.bias.detach().clone())
        self.alpha = nn.Parameter(self.weight.detach().norm().clone())
        self.psi = nn.Parameter(torch.zeros(self.out_features))
        self.psi_in_bias = bool(psi_in_bias)
        self._cache: tuple[tuple, Tensor, float | None] | None = None

    def compute_q(self) -> Tensor:
        return cayley(self.alpha * self.weight / self.weight.norm())

    def _token(self) -> tuple:
        return tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in self.parameters()) + (self.psi_in_bias,)

    def train(self, mode: bool = True) -> "SandwichFc":
        self._cache = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "SandwichFc":
        self._cache = None
        return super()._apply(fn, recurse)

    def eval_q(self) -> Tensor:
        token = self._token()
        if self._cache is None or self._cache[0] != token:
            with torch.no_grad():
                self._cache = (token, self.compute_q(), None)
        return self._cache[1]

    def apply_q(self, x: Tensor, Q: Tensor) -> Tensor:
        q = self.out_features
        x = F.linear(x, Q[:, q:])
        if self.psi_in_bias:
            x = F.relu(x * SQRT2 + self.bias * torch.exp(self.psi))
        else:
            x = F.relu(x * torch.exp(-self.psi) * SQRT2 + self.bias) * torch.exp(self.psi)
        return SQRT2 * F.linear(x, Q[:, :q].T)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"SandwichFc expected input (N, {self.in_features}), got {tuple(x.shape)}")
        needs_graph = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        Q = self.compute_q() if (self.training or needs_graph) else self.eval_q()
        return self.apply_q(x, Q)

    def lipschitz_upper_bound(self) -> float:
        Q = self.eval_q()
        assert self._cache is not None
        if self._cache[2] is None:
            self._cache = (self._cache[0], Q, sandwich_bound(Q, self.psi, stable=self.psi_in_bias))
        return float(self._cache[2])

    def export_module(self) -> nn.Module:
        return _ExportedFc(self)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, psi_in_bias={self.psi_in_bias}"


class _ExportedFc(nn.Module):
    """The eval layer with its cached ``Q`` and ``ψ`` baked (plain torch operations)."""

    def __init__(self, layer: SandwichFc) -> None:
        super().__init__()
        with torch.no_grad():
            Q = layer.eval_q()
            q = layer.out_features
            self.register_buffer("b", Q[:, q:].clone())
            self.register_buffer("at", Q[:, :q].T.clone())
            self.register_buffer("bias", layer.bias.detach().clone())
            self.register_buffer("up", torch.exp(layer.psi.detach()).clone())
            self.register_buffer("down", torch.exp(-layer.psi.detach()).clone())
        self.stable = layer.psi_in_bias

    def forward(self, x: Tensor) -> Tensor:
        x = F.linear(x, self.b)
        if self.stable:
            x = F.relu(x * SQRT2 + self.bias * self.up)
        else:
            x = F.relu(x * self.down * SQRT2 + self.bias) * self.up
        return SQRT2 * F.linear(x, self.at)
