"""``SLLDense``: the dense SLL layer ``h(x) = x − 2 Kᵀ T⁻¹ ReLU(K x + b)`` on ``(N, features)``.

lipcli has no plugin kind for dense (fully connected) body layers, so this is an importable
module class (``from lipcli_sll import SLLDense``) for networks built in Python (e.g. a
residual SLL network): it has the same contract as a lipcli body layer —
:meth:`SLLDense.lipschitz_upper_bound` is GUARANTEED (the verified
:func:`lipcli_sll.core.sll_bound` of the float matrix and scales the eval-mode layer applies),
and ``export_module()`` lowers it to plain torch operations.  The maths is
:mod:`lipcli_sll.core` with a ``1 × 1`` "filter": ``T_ii = Σ_j |K Kᵀ|_ij q_j / q_i``
(Araujo et al., ICLR 2023, Theorem 3).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .core import initial_log_q, sll_bound, sll_scale

__all__ = ["SLLDense", "ExportedSLLDense"]


class SLLDense(nn.Module):
    """Dense SLL layer on ``(N, features)``; ``hidden`` units (default ``features``).

    Parameters ``weight`` (``hidden × features``), ``bias`` (``hidden``), ``log_q``
    (``hidden``, ``q = exp(log_q)``; ``q_init="ones"``: 0, ``"normal"``: ``N(0, 1)`` as the
    SLL authors').
    """

    lip_affine = False

    def __init__(self, features: int, hidden: int | None = None, *, q_init: str = "ones") -> None:
        super().__init__()
        hidden = int(hidden) if hidden else int(features)
        if features < 1 or hidden < 1:
            raise ValueError("SLLDense: features and hidden must be positive")
        self.features = int(features)
        weight = torch.empty(hidden, self.features)
        nn.init.xavier_normal_(weight)
        self.weight = nn.Parameter(weight)
        bound = 1.0 / self.features**0.5
        self.bias = nn.Parameter(torch.empty(hidden).uniform_(-bound, bound))
        self.log_q = nn.Parameter(initial_log_q(hidden, q_init))
        self._cache: tuple[tuple, Tensor, float | None] | None = None

    def _kernel(self) -> Tensor:
        return self.weight[:, :, None, None]

    def _token(self) -> tuple:
        return tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in self.parameters())

    def eval_scale(self) -> Tensor:
        """``1/T`` of the current parameters, detached and cached."""
        token = self._token()
        if self._cache is None or self._cache[0] != token:
            with torch.no_grad():
                scale = sll_scale(self._kernel(), self.log_q)
            self._cache = (token, scale, None)
        return self._cache[1]

    def invalidate(self) -> None:
        """Drop the cached scales and bound (after writes that bypass version counters, such
        as ``weight.data[...] = ...``)."""
        self._cache = None

    def train(self, mode: bool = True) -> "SLLDense":
        self._cache = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "SLLDense":
        self._cache = None
        return super()._apply(fn, recurse)

    def forward(self, x: Tensor) -> Tensor:
        needs_graph = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if self.training or needs_graph:
            scale = sll_scale(self._kernel(), self.log_q)
        else:
            scale = self.eval_scale()
        z = F.relu(F.linear(x, self.weight, self.bias))
        return x - F.linear(z * (2.0 * scale), self.weight.T)

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on the l2 Lipschitz constant of the eval-mode layer (cached)."""
        scale = self.eval_scale()
        assert self._cache is not None
        if self._cache[2] is None:
            value = sll_bound(self._kernel().detach(), scale, self.log_q.detach())
            self._cache = (self._cache[0], scale, value)
        return float(self._cache[2])

    def export_module(self) -> nn.Module:
        with torch.no_grad():
            return ExportedSLLDense(self.weight, self.bias, self.eval_scale())

    def extra_repr(self) -> str:
        return f"features={self.features}, hidden={self.weight.shape[0]}"


class ExportedSLLDense(nn.Module):
    """The eval-mode :class:`SLLDense` with fixed tensors: ``x − Kᵀ (2s ⊙ ReLU(K x + b))``,
    the scale applied to the hidden activations as the layer does (same rounding); torch
    operations only."""

    def __init__(self, weight: Tensor, bias: Tensor, scale: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())
        self.register_buffer("scale2", (2.0 * scale.detach()).clone().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        z = F.relu(F.linear(x, self.weight, self.bias))
        return x - F.linear(z * self.scale2, self.weight.T)
