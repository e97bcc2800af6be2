"""Fused GPU kernels for SOC's filter-side work (optional; ``torch.compile`` / Triton).

The filter gradient of the normalised skew filter (:class:`lipcli.builtins.soc.filters._NormalisedSkew`,
SPEC §1.2) is, with ``G = ∂ℓ/∂S``, ``c = ⟨G, S⟩`` and the rank-one factors ``(eu_r, ev_r)``::

    H = G − c · Σ_r eu_r ⊗ ev_r,        ∂ℓ/∂W = (H − T(H)) / ρ

Eagerly that is a dot product, two kernels per rank-one term, the skew and the scaling: about
a dozen small kernels per SOC layer and step, each a pass over the filter.  Compiled by
``torch.compile`` (inductor, Triton) it is one reduction and one pointwise kernel that reads
``G`` twice (at ``(o, i, a, b)`` and at the transposed index) and writes the result once.

Used only for CUDA tensors and only where it is switched on: :data:`FUSED_FILTER` (from the
environment variable ``LIPCLI_FUSED_FILTER``: ``1`` on, ``0`` off (default), read when lipcli
is imported).  The CPU path never uses it (no compiler needed; CPU values unchanged).  If
the compiler or its toolchain is missing or compilation fails, the first call says why
(:data:`FUSION_STATUS`) and every call from then on runs the eager code — the same
mathematics, up to floating-point reordering of the sums.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

#: use the compiled filter-gradient kernel for CUDA tensors (see the module docstring)
FUSED_FILTER: bool = os.environ.get("LIPCLI_FUSED_FILTER", "0").strip().lower() in ("1", "on", "true", "yes")

#: "not tried", "compiled", or why the eager code is used
FUSION_STATUS: dict[str, str] = {}


def skew_gradient_eager(G: Tensor, S: Tensor, rho: Tensor,
                        factors: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """``(H − T(H))/ρ`` with ``H = G − ⟨G, S⟩ Σ_r eu_r ⊗ ev_r`` (the reference form)."""
    c = torch.dot(G.reshape(-1), S.reshape(-1))
    H = G
    for eu, ev in factors:
        H = H - (eu * c) * ev
    return (H - H.transpose(0, 1).flip(2, 3)) / rho


class _CompiledOrEager:
    """``torch.compile(fn)`` on first use; on any failure the eager ``fn`` for good, with
    the reason in :data:`FUSION_STATUS`."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name, self.fn = name, fn
        self.compiled: Callable[..., Any] | None = None
        FUSION_STATUS[name] = "not tried"

    def __call__(self, *args: Any) -> Any:
        if FUSION_STATUS[self.name].startswith("eager"):
            return self.fn(*args)
        try:
            if self.compiled is None:
                self.compiled = torch.compile(self.fn, fullgraph=True)
            out = self.compiled(*args)
            FUSION_STATUS[self.name] = "compiled"
            return out
        except Exception as exc:  # noqa: BLE001 - no compiler, no Triton, a compile error...
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            FUSION_STATUS[self.name] = f"eager: compilation failed ({type(exc).__name__}: {first})"
            return self.fn(*args)


def compiled_or_eager(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled on first use (see :class:`_CompiledOrEager`); status under ``name``."""
    return _CompiledOrEager(name, fn)


_skew_gradient_fused = compiled_or_eager("skew_gradient", skew_gradient_eager)


def use_fused(t: Tensor) -> bool:
    """Whether the fused kernels are used for tensors like ``t``."""
    return FUSED_FILTER and t.device.type == "cuda"


def skew_gradient(G: Tensor, S: Tensor, rho: Tensor,
                  factors: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    """:func:`skew_gradient_eager`, compiled into fused kernels (CUDA, :data:`FUSED_FILTER`)."""
    if use_fused(G):
        return _skew_gradient_fused(G, S, rho, list(factors))
    return skew_gradient_eager(G, S, rho, factors)
