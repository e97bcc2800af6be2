"""The CPL map, its power iteration as the comparison study runs it, and a proven bound.

CPL (Meunier et al., ICML 2022; the comparison study's ``CPLConv2d``,
``berndprach/1LipschitzLayersCompared`` ``models/layers/lipschitz/cpl.py``) is

    ``l(x) = x − h·Wᵀσ(W x + b)``,  ``h = 2/(σ̂² + ε)``,  ``σ = ReLU``,

with ``W`` a convolution (filter ``K``, ``hidden × channels × k × k``, zero "same" padding;
``Wᵀ`` the transposed convolution, its exact adjoint) or a matrix, and ``σ̂`` a power-iteration
estimate of ``‖W‖₂``: one step per training step from a persistent vector ``u`` (carried over,
without gradient; ``σ̂ = ⟨W u, v⟩`` is differentiated), 100 steps from ``u`` in eval mode, cached
(``ε = 1e-6``; the eval normalisation adds ``1e-12``).  ``σ̂`` is the norm of the whole operator
at the layer's input size, so ``u`` has the input's shape.

Why the bound (LAYERS-COMPARED §1.2, §1.4).  For two inputs ``σ(a) − σ(a') = D(a − a')`` with
``D`` diagonal in ``[0, I]``, so ``l(x) − l(y) = J(x − y)`` with ``J = I − h WᵀDW``: symmetric,
eigenvalues in ``[1 − h‖W‖², 1]``, hence ``‖J‖ ≤ max(1, h‖W‖² − 1)``.  Power iteration
approaches ``‖W‖`` from *below*, so with ``h = 2/σ̂²`` the layer may be slightly expansive;
:func:`cpl_layer_bound` takes the ``h`` the layer applies and returns ``max(1, h·σ̄² − 1)`` with
``σ̄ ≥ ‖W‖`` verified.  The eval layer applies either the study's ``h`` (``eval_step="authors"``:
its outputs exactly, bound ``max(1, h·σ̄² − 1)``) or ``h`` just below ``2/σ̄²``
(``"verified"``, the default: bound 1, outputs a little more contractive than the study's).
Why the default: ``σ̄`` comes from a circular convolution on a torus that contains the
zero-padded image, which is loose for small images (measured, Xavier-normal 3×3 filters:
``σ̄/σ̂`` = 1.003 at 32×32 with 16 channels, 1.011 at 16×16, 1.024 at 8×8, 1.146 at 4×4 with 128
channels), and the authors' ``h`` then gives per-layer bounds ``h·σ̄² − 1`` of 1.01 to 1.63 that
multiply over the network; the verified step keeps every layer at 1.  ``σ̄``:
:func:`lipcli.numerics.conv_fourier.zero_padded_conv_norm_upper_bound` for the convolution
(exact per-frequency symbol on a torus that contains the zero-padded image, every rounding
accounted for), :func:`lipcli.numerics.spectral.spectral_norm_upper_bound` for a matrix.  The
product ``h·σ̄²`` is rounded up.  Rounding inside a forward pass is not part of any lipcli bound.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lipcli.numerics.conv_fourier import zero_padded_conv_norm_upper_bound
from lipcli.numerics.rounding import round_up
from lipcli.numerics.spectral import spectral_norm_upper_bound

__all__ = ["EPSILON", "EVAL_NORM_EPSILON", "TRAIN_STEPS", "EVAL_STEPS", "apply_w", "apply_wt",
           "power_steps", "rescaling", "verified_step", "EVAL_STEP_CHOICES", "cpl_residual", "operator_norm_upper_bound", "cpl_layer_bound"]

#: ``h = 2/(σ̂² + EPSILON)``; also the training normalisation's ``+ε`` (the study's ``1e-6``)
EPSILON = 1e-6
#: the eval normalisation's ``+ε`` (the study's ``1e-12``)
EVAL_NORM_EPSILON = 1e-12
#: the eval layer's step: ``"verified"`` (``h`` just below ``2/σ̄²``: bound 1) or ``"authors"``
#: (the study's ``2/(σ̂² + ε)`` from 100 power steps: its outputs, bound ``max(1, h·σ̄² − 1)``)
EVAL_STEP_CHOICES = ("verified", "authors")
#: relative margin below ``2/σ̄²`` of the verified step (covers its rounding to float32)
VERIFIED_MARGIN = 1e-6
#: power steps per training step and at evaluation (the study's ``val_niter``)
TRAIN_STEPS, EVAL_STEPS = 1, 100


def apply_w(x: Tensor, kernel: Tensor, bias: Tensor | None = None) -> Tensor:
    """``W x (+ b)``: a "same" convolution for a 4-D filter, a matrix product for a 2-D one."""
    if kernel.dim() == 2:
        return F.linear(x, kernel, bias)
    return F.conv2d(x, kernel, bias, padding=kernel.shape[-1] // 2)


def apply_wt(z: Tensor, kernel: Tensor) -> Tensor:
    """``Wᵀ z``: the transposed convolution with the same filter and padding (its adjoint)."""
    if kernel.dim() == 2:
        return z @ kernel
    return F.conv_transpose2d(z, kernel, padding=kernel.shape[-1] // 2)


@torch.no_grad()
def power_steps(u: Tensor, kernel: Tensor, steps: int, eps: float) -> tuple[Tensor, Tensor]:
    """``steps`` power steps ``v = Wu/(‖Wu‖ + eps)``, ``u = Wᵀv/(‖Wᵀv‖ + eps)`` from ``u``."""
    v = u
    for _ in range(max(1, int(steps))):
        v0 = apply_w(u, kernel)
        v = v0 / (torch.linalg.vector_norm(v0) + eps)
        u0 = apply_wt(v, kernel)
        u = u0 / (torch.linalg.vector_norm(u0) + eps)
    return u, v


def rescaling(u: Tensor, v: Tensor, kernel: Tensor) -> Tensor:
    """``h = 2/(⟨W u, v⟩² + ε)`` (differentiable in the filter; ``u``, ``v`` held fixed)."""
    return 2.0 / ((apply_w(u, kernel) * v).sum() ** 2 + EPSILON)


def cpl_residual(x: Tensor, kernel: Tensor, bias: Tensor, h: Tensor) -> Tensor:
    """``x − h·Wᵀ ReLU(W x + b)``."""
    return x - h * apply_wt(F.relu(apply_w(x, kernel, bias)), kernel)


def operator_norm_upper_bound(kernel: Tensor, size: tuple[int, int] | None) -> float:
    """Verified ``σ̄ ≥ ‖W‖₂``: the zero-padded convolution on ``size`` images (or smaller), or
    the matrix."""
    if kernel.dim() == 2:
        return spectral_norm_upper_bound(kernel.detach().double(), rtol=1e-6)
    if size is None:
        raise ValueError("the convolution's bound needs its image size")
    return zero_padded_conv_norm_upper_bound(kernel.detach(), size)


def verified_step(sigma_bar: float, dtype: torch.dtype, device: torch.device | str = "cpu") -> Tensor:
    """``h ≤ 2/σ̄²`` (a relative :data:`VERIFIED_MARGIN` below, in ``dtype``): any ``h`` up to
    ``2/‖W‖²`` makes the layer 1-Lipschitz (module docstring)."""
    if not (math.isfinite(sigma_bar) and sigma_bar > 0):
        return torch.zeros((), dtype=dtype, device=device)  # W = 0: the layer is the identity
    return torch.tensor(2.0 / (sigma_bar * sigma_bar) * (1.0 - VERIFIED_MARGIN), dtype=dtype, device=device)


def cpl_layer_bound(h: float, sigma_bar: float) -> float:
    """``max(1, h·σ̄² − 1)`` rounded up: the layer's Lipschitz bound for the step ``h`` it applies
    and a verified ``σ̄ ≥ ‖W‖`` (module docstring)."""
    if not (math.isfinite(h) and h >= 0 and math.isfinite(sigma_bar) and sigma_bar >= 0):
        raise ValueError(f"CPL bound needs a finite step and norm, got h={h!r}, sigma={sigma_bar!r}")
    product = round_up(round_up(h * round_up(sigma_bar * sigma_bar)))
    return max(1.0, round_up(product - 1.0))
