"""The LiResNet residual block ``x ↦ x + W ∗ x + b`` (Hu et al., NeurIPS 2023, §4).

``W`` is a free 3×3 convolution from ``C`` to ``C`` channels (zero "same" padding, stride 1);
the block's linear part is the convolution with the filter ``W + I·δ₀`` (``δ₀`` the centre
tap), so ``Lip(block) = ‖I + W‖₂`` on the block's image size, and the bias does not change it.

Guaranteed bound (:meth:`ResidualConv.lipschitz_upper_bound`): the minimum of two proven
bounds, computed in float64 with every rounding accounted for:

* the Fourier bound of :func:`lipcli_liresnet.fourier.zero_padded_conv_norm_upper_bound` on
  the filter ``W + I·δ₀`` at the block's image size (the exact norm of the circular
  convolution on a torus two pixels larger, which dominates the zero-padded operator; tight to
  ``~1e-6`` relative of that);
* ``1 + ‖W‖₂`` with ``‖W‖₂`` from :func:`lipcli.numerics.gram_bounds.conv_gram_norm_upper_bound`
  (valid for any padding and size; loose, but cheap).

It is cached until a parameter changes (tensor version counters), as SOC caches its bound.

Training estimate (:meth:`ResidualConv.training_lipschitz`, what the EMMA loss uses, never a
certificate): ``‖(I + W) v‖`` with ``v`` the unit power-iteration vector kept in the buffer
``power_v`` (one step of ``v ← (I + W)ᵀ(I + W) v`` per call in training mode, as the LiResNet
authors do), differentiable in ``W``.  ``refresh(steps)`` runs more steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.gram_bounds import conv_gram_norm_upper_bound
from lipcli.numerics.rounding import round_up

from .fourier import zero_padded_conv_norm_upper_bound

#: most power-iteration steps one ``refresh`` call may run
MAX_REFRESH_STEPS = 10_000


class ResidualConv(nn.Module):
    """``(N, C, H, W) → (N, C, H, W)``: ``x + conv3x3(x; W) + b``; ``image_size`` is the size
    its bound is proven for (larger inputs are refused)."""

    lip_promises: tuple[str, ...] = ()
    no_weight_decay: tuple[str, ...] = ("bias",)

    def __init__(self, channels: int, image_size: tuple[int, int], *, init_scale: float = 1.0) -> None:
        super().__init__()
        if channels < 1:
            raise ValueError(f"channels must be positive, got {channels}")
        self.channels = int(channels)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        # the LiResNet initialisation: N(0, 1) / (9 C), so that ‖W‖ starts well below 1
        self.weight = nn.Parameter(torch.randn(channels, channels, 3, 3) * (init_scale / (9 * channels)))
        self.bias = nn.Parameter(torch.zeros(channels))
        v = torch.randn(1, channels, *self.image_size)
        self.register_buffer("power_v", v / v.norm())
        self._bound_cache: tuple[tuple, float] | None = None

    # ---------------------------------------------------------------- the map
    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) != self.image_size:
            raise ValueError(f"ResidualConv was built (and bounded) for {self.image_size[0]}x"
                             f"{self.image_size[1]} images, got {tuple(x.shape)}")
        return x + F.conv2d(x, self.weight.to(x.dtype), self.bias.to(x.dtype), padding=1)

    def _linear(self, v: Tensor, weight: Tensor) -> Tensor:
        return v + F.conv2d(v, weight, padding=1)

    def _linear_t(self, u: Tensor, weight: Tensor) -> Tensor:
        return u + F.conv_transpose2d(u, weight, padding=1)

    # ---------------------------------------------------------------- guaranteed bound
    def _token(self) -> tuple:
        return tuple((t._version, t.data_ptr(), t.dtype) for t in (self.weight,))

    def full_filter(self) -> Tensor:
        """``W + I·δ₀`` in float64: the filter of the block's linear part."""
        K = self.weight.detach().to(torch.float64).clone()
        K[:, :, 1, 1] += torch.eye(self.channels, dtype=torch.float64, device=K.device)
        return K.cpu()

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on ``‖I + W‖₂`` at :attr:`image_size` (module docstring); cached."""
        token = self._token()
        if self._bound_cache is not None and self._bound_cache[0] == token:
            return self._bound_cache[1]
        fourier = zero_padded_conv_norm_upper_bound(self.full_filter(), self.image_size)
        # exact float64 copy of the float32 filter, so the triangle inequality is exact up to round_up
        loose = round_up(1.0 + conv_gram_norm_upper_bound(self.weight.detach().to(torch.float64).cpu()))
        value = min(fourier, loose)
        self._bound_cache = (token, value)
        return value

    # ---------------------------------------------------------------- estimates
    @torch.no_grad()
    def _power_steps(self, v: Tensor, steps: int) -> Tensor:
        w = self.weight.detach().to(v.dtype)
        for _ in range(steps):
            v = self._linear_t(self._linear(v, w), w)
            v = v / v.norm().clamp_min(1e-30)
        return v

    def training_lipschitz(self) -> Tensor:
        """A differentiable ESTIMATE of ``‖I + W‖₂`` for training losses (module docstring)."""
        v = self.power_v
        if self.training:
            v = self._power_steps(v.detach().clone(), 1)
            with torch.no_grad():
                self.power_v.copy_(v)
        return self._linear(v.detach().clone(), self.weight).norm()

    @torch.no_grad()
    def refresh(self, steps: int = 50) -> None:
        """``steps`` more power-iteration steps on :attr:`power_v`."""
        steps = max(0, min(int(steps), MAX_REFRESH_STEPS))
        self.power_v.copy_(self._power_steps(self.power_v.clone(), steps))

    @torch.no_grad()
    def lipschitz_estimate(self, input_shape: tuple[int, ...] | None = None, iters: int = 50) -> float:
        """Power-method LOWER estimate of ``‖I + W‖₂`` (from a copy of :attr:`power_v`)."""
        v = self._power_steps(self.power_v.clone().double(), max(1, min(int(iters), MAX_REFRESH_STEPS)))
        value = float(self._linear(v, self.weight.double()).norm())
        return value if math.isfinite(value) else math.inf

    def export_module(self) -> nn.Module:
        """``lip export``: the forward is plain torch operations (a conv and an add)."""
        return _ExportedResidual(self.weight.detach().clone(), self.bias.detach().clone())

    def extra_repr(self) -> str:
        return f"channels={self.channels}, image_size={self.image_size}"


class _ExportedResidual(nn.Module):
    """``x + conv(x; W, b)`` with the weights as buffers (no shape check: the exported
    program fixes the shape)."""

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.conv2d(x, self.weight, self.bias, padding=1)
