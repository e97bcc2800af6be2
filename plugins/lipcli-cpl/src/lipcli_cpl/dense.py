"""The dense CPL layer ``x − h·Wᵀ ReLU(W x + b)`` on ``(N, features)`` (``W``:
``hidden × features``), with the same persistent power iteration and proven bound as
:class:`lipcli_cpl.conv.CPLConv` (:mod:`lipcli_cpl.core`; ``σ̄`` from
:func:`lipcli.numerics.spectral.spectral_norm_upper_bound`).  The comparison study's network
uses a 1×1 CPL convolution on 1×1 images as its dense layer, which is this map exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .conv import CPLBase
from .core import cpl_residual

__all__ = ["CPLLinear"]


class CPLLinear(CPLBase):
    """Dense CPL ``(N, features) → (N, features)``; ``hidden`` units (default ``features``)."""

    def __init__(self, features: int, hidden: int = 0, *, eval_step: str = "verified") -> None:
        super().__init__()
        if int(features) < 1 or int(hidden) < 0:
            raise ValueError("CPLLinear: sizes must be positive")
        self.features = int(features)
        self._init_parameters((int(hidden) or self.features, self.features), eval_step)
        self.u = torch.randn(1, self.features)  # a dense layer's input shape is known now

    def _u_shape(self, size):
        return (1, self.features)

    def _size(self):
        return None

    def _check(self, x: Tensor) -> None:
        if x.dim() != 2 or x.shape[1] != self.features:
            raise ValueError(f"CPLLinear expected input (N, {self.features}), got {tuple(x.shape)}")

    def forward(self, x: Tensor) -> Tensor:
        self._check(x)
        return cpl_residual(x, self.kernel, self.bias, self.step())

    def _eval_forward(self, x: Tensor) -> Tensor:
        self._check(x)
        return cpl_residual(x, self.kernel, self.bias, self.eval_state()[2])

    def export_module(self) -> nn.Module:
        from .export import ExportedCPLLinear

        with torch.no_grad():
            return ExportedCPLLinear(self.kernel, self.bias, self.eval_state()[2])

    def extra_repr(self) -> str:
        return f"{self.features}, hidden={self.kernel.shape[0]}"
