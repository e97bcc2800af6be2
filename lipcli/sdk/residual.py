"""The convex-combination residual ``x ↦ λ·x + (1 − λ)·inner(x)`` (the LOT authors' ``ResLayer``,
Xu et al., NeurIPS 2022; ``AI-secure/Layerwise-Orthogonal-Training``, ``lip_convnets.py``), a body
child any architecture can use (lipcli's ``lipresnet-<n>``, lipcli-lot's ``lot-lipresnet-<n>``).

Guaranteed bound (proof): for ``g(x) = a·x + c·f(x)`` with ``a, c ≥ 0``,
``‖g(x) − g(y)‖ ≤ a‖x − y‖ + c‖f(x) − f(y)‖ ≤ (a + c·L_f)‖x − y‖`` (triangle inequality), and
``L_f ≤ Π U_j`` over the inner layers (their guaranteed bounds; 1 for a ``"1-lipschitz"``
promise).  ``a`` and ``c`` are taken as the larger of ``λ``, ``1 − λ`` in float64 and their
float32 roundings (the numbers a float32 or float64 forward multiplies by), and every
operation is rounded up, so :meth:`ConvexResidual.lipschitz_upper_bound` bounds the map
computed with those numbers; it is ``1`` (``≤ 1 + 1e-6`` in float32) when the layers are.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import Tensor, nn

from lipcli.sdk.errors import LipError
from lipcli.sdk.specs import ONE_LIPSCHITZ

__all__ = ["AUTHORS_MIX", "ConvexResidual", "layer_bound", "mix_weights"]


#: the authors' fixed mixing weight: ``sigmoid(0)``
AUTHORS_MIX = 0.5


def _up(value: float) -> float:
    return math.nextafter(value, math.inf)


def layer_bound(module: nn.Module, where: str) -> float:
    """A guaranteed Lipschitz bound of one layer: its ``lipschitz_upper_bound()``, else 1 by
    a ``"1-lipschitz"`` promise; a :class:`LipError` for a layer with neither."""
    bound = getattr(module, "lipschitz_upper_bound", None)
    if callable(bound):
        value = float(bound())
        if not math.isfinite(value) or value < 0:
            raise LipError(f"{where} reported an invalid Lipschitz bound {value!r}")
        return value
    if ONE_LIPSCHITZ in getattr(module, "lip_promises", ()):
        return 1.0
    raise LipError(f"{where} ({type(module).__name__}) neither has lipschitz_upper_bound() nor "
                   f"promises {ONE_LIPSCHITZ!r}")


def mix_weights(mix: float) -> tuple[float, float]:
    """``(a, c)``: upper bounds of the skip and branch weights a forward multiplies by, in
    float32 or float64 (module docstring)."""
    skip, branch = float(mix), 1.0 - float(mix)
    a = max(skip, float(torch.tensor(skip, dtype=torch.float32)))
    c = max(branch, float(torch.tensor(branch, dtype=torch.float32)))
    return a, c


class ConvexResidual(nn.Module):
    """``x ↦ λ·x + (1 − λ)·inner(x)`` for a same-shape ``inner`` (an ``nn.Sequential``);
    bound ``a + c·Π U_j`` (module docstring).  No promise of its own."""

    lip_promises: tuple[str, ...] = ()

    def __init__(self, inner: nn.Sequential, mix: float = AUTHORS_MIX) -> None:
        super().__init__()
        if not 0.0 <= float(mix) <= 1.0:
            raise ValueError(f"the residual mix must be in [0, 1], got {mix}")
        self.inner = inner
        self.mix = float(mix)

    def forward(self, x: Tensor) -> Tensor:
        return self.mix * x + (1.0 - self.mix) * self.inner(x)

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED: ``a + c·Π U_j`` rounded up (module docstring)."""
        a, c = mix_weights(self.mix)
        total = 1.0
        for name, child in self.inner.named_children():
            total = _up(total * layer_bound(child, f"residual layer {name!r}"))
        return _up(a + _up(c * total))

    def lipschitz_estimate(self, input_shape: tuple[int, ...], iters: int = 50) -> float:
        """``λ + (1 − λ)·Π E_j`` with the layers' own lower estimates (an estimate, the
        paper's convention, not a bound of either kind)."""
        total = 1.0
        for child in self.inner.children():
            est = getattr(child, "lipschitz_estimate", None)
            total *= float(est(tuple(input_shape), iters=iters)) if callable(est) else 1.0
        return self.mix + (1.0 - self.mix) * total

    def export_module(self) -> nn.Module:
        """Plain torch: the inner layers' own stand-ins (literal: no dense lowering inside a
        residual, so no lowering excess is hidden from the network bound)."""
        from lipcli.sdk.export import lower_module

        inner = nn.Sequential(OrderedDict(
            (name, lower_module(child, f"residual layer {name!r}")) for name, child in self.inner.named_children()
        ))
        return _ExportedConvexResidual(inner, self.mix)

    def extra_repr(self) -> str:
        return f"mix={self.mix}"


class _ExportedConvexResidual(nn.Module):
    def __init__(self, inner: nn.Sequential, mix: float) -> None:
        super().__init__()
        self.inner = inner
        self.mix = float(mix)

    def forward(self, x: Tensor) -> Tensor:
        return self.mix * x + (1.0 - self.mix) * self.inner(x)
