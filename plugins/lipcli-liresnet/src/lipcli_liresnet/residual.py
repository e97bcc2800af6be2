"""The LiResNet residual block ``x ↦ x + W ∗ x + b`` (Hu et al., NeurIPS 2023, §4).

Options of the authors' block (hukkai/liresnet ``models/blocks.py``, ``LiResConv``), each off
by default: a learnable per-output-channel scale ``γ`` (``gamma=True``, initialised to 1) and
a fixed factor ``s`` (``scale``, ``depth^-1/2`` in the authors' network) make the branch's
filter ``W_eff = (W · γ_o) · s`` (:meth:`ResidualConv.effective_weight`, the float tensor the
forward uses and the bound is computed from, so ``γ`` enters the Fourier bound per channel,
exactly); ``centering=True`` subtracts the branch's per-channel mean over the batch and the
pixels in training (with gradient), keeping a running mean (momentum 0.1) that evaluation
subtracts instead::

    training:    y = x + W_eff ∗ x − mean_{n,h,w}(W_eff ∗ x) + b
    evaluation:  y = x + W_eff ∗ x + (b − running_mean)

Bound with centring.  Evaluation: ``b − running_mean`` is a constant, so the block's
Lipschitz constant is ``‖I + W_eff‖₂ ≤ L`` as without centring.  Training: the block is a map
of the whole batch ``X`` (``N`` images), ``Y = X + (I − P) W_b X + b`` with ``W_b`` the
convolution applied to each image (``‖I + W_b‖₂ = ‖I + W_eff‖₂ ≤ L``) and ``P`` the per-channel
average over batch and pixels broadcast back, an orthogonal projection.  Writing
``I + (I − P)W_b = (I − P)(I + W_b) + P``, the two terms have orthogonal ranges, so
``‖J v‖² = ‖(I − P)(I + W_b) v‖² + ‖P v‖² ≤ (L² + 1)‖v‖²``; also ``‖J‖ ≤ 1 + ‖W_eff‖₂``.  So
in training mode :meth:`ResidualConv.lipschitz_upper_bound` is ``min(√(L² + 1), 1 + ‖W_eff‖₂)``,
a bound on the batch map in the Frobenius norm of batches: changing one image by ``δ``
(the others fixed) moves the outputs of the whole batch, that image's included, by at most
that bound times ``‖δ‖``.  (It can exceed ``L``: the mean couples the images.)
Certificates are computed in evaluation mode.

``W`` is a free 3×3 convolution from ``C`` to ``C`` channels (zero "same" padding, stride 1);
the block's linear part is the convolution with the filter ``W + I·δ₀`` (``δ₀`` the centre
tap), so ``Lip(block) = ‖I + W‖₂`` on the block's image size, and the bias does not change it.

Guaranteed bound (:meth:`ResidualConv.lipschitz_upper_bound`): the minimum of two proven
bounds, computed in float64 with every rounding accounted for:

* the Fourier bound of :func:`lipcli.numerics.conv_fourier.zero_padded_conv_norm_upper_bound` on
  the filter ``W + I·δ₀`` at the block's image size (the exact norm of the circular
  convolution on a torus two pixels larger, which dominates the zero-padded operator; tight to
  ``~1e-6`` relative of that);
* ``1 + ‖W‖₂`` with ``‖W‖₂`` from :func:`lipcli.numerics.gram_bounds.conv_gram_norm_upper_bound`
  (valid for any padding and size; loose, but cheap).

It is cached until a parameter changes (tensor version counters of ``W`` and ``γ``) or the
mode changes, as SOC caches its bound.

Training estimate (:meth:`ResidualConv.training_lipschitz`, what the EMMA loss uses, never a
certificate): ``‖(I + W) v‖`` with ``v`` the unit power-iteration vector kept in the buffer
``power_v`` (``power_steps`` steps of ``v ← normalise((I + W)ᵀ(I + W) v)`` per call in training
mode: the LiResNet authors' ``num_lc_iter``, 10, in ``LiResConv.lipschitz``), differentiable in
``W`` (and ``γ``); like the authors' estimate it ignores the centring.  ``refresh(steps)`` runs
more steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.conv_fourier import zero_padded_conv_norm_upper_bound
from lipcli.numerics.gram_bounds import conv_gram_norm_upper_bound
from lipcli.numerics.rounding import round_up
from .free_conv import AUTHORS_POWER_STEPS

#: most power-iteration steps one ``refresh`` call may run
MAX_REFRESH_STEPS = 10_000
#: the running mean's update rate (the authors' 0.1)
MOMENTUM = 0.1


class ResidualConv(nn.Module):
    """``(N, C, H, W) → (N, C, H, W)``: ``x + conv3x3(x; W) + b``; ``image_size`` is the size
    its bound is proven for (larger inputs are refused)."""

    lip_promises: tuple[str, ...] = ()
    no_weight_decay: tuple[str, ...] = ("bias",)

    def __init__(self, channels: int, image_size: tuple[int, int], *, init_scale: float = 1.0,
                 gamma: bool = False, scale: float = 1.0, centering: bool = False,
                 power_steps: int = AUTHORS_POWER_STEPS) -> None:
        super().__init__()
        if channels < 1:
            raise ValueError(f"channels must be positive, got {channels}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive number, got {scale}")
        self.channels = int(channels)
        self.image_size = (int(image_size[0]), int(image_size[1]))
        # the LiResNet initialisation: N(0, 1) / (9 C), so that ‖W‖ starts well below 1
        self.weight = nn.Parameter(torch.randn(channels, channels, 3, 3) * (init_scale / (9 * channels)))
        self.bias = nn.Parameter(torch.zeros(channels))
        v = torch.randn(1, channels, *self.image_size)
        self.register_buffer("power_v", v / v.norm())
        self.scale, self.centering = float(scale), bool(centering)
        if not 1 <= power_steps <= MAX_REFRESH_STEPS:
            raise ValueError(f"power_steps must be in 1..{MAX_REFRESH_STEPS}, got {power_steps}")
        self.power_steps = int(power_steps)
        self.gamma: nn.Parameter | None = nn.Parameter(torch.ones(channels)) if gamma else None
        if centering:
            self.register_buffer("running_mean", torch.zeros(channels))
        self._bound_cache: tuple[tuple, Tensor, float] | None = None

    # ---------------------------------------------------------------- the map
    def effective_weight(self) -> Tensor:
        """``W_eff = (W · γ_o) · s``, the branch's filter (``W`` itself without ``γ`` and ``s``)."""
        w = self.weight
        if self.gamma is not None:
            w = w * self.gamma.view(-1, 1, 1, 1)
        if self.scale != 1.0:
            w = w * self.scale
        return w

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) != self.image_size:
            raise ValueError(f"ResidualConv was built (and bounded) for {self.image_size[0]}x"
                             f"{self.image_size[1]} images, got {tuple(x.shape)}")
        w = self.effective_weight().to(x.dtype)
        if not self.centering:
            return x + F.conv2d(x, w, self.bias.to(x.dtype), padding=1)
        if not self.training:
            return x + F.conv2d(x, w, self.eval_bias().to(x.dtype), padding=1)
        out = F.conv2d(x, w, padding=1)
        mean = out.mean(dim=(0, 2, 3))
        with torch.no_grad():
            self.running_mean.add_((mean.detach().to(self.running_mean.dtype) - self.running_mean) * MOMENTUM)
        return x + out + (self.bias.to(x.dtype) - mean).view(1, -1, 1, 1)

    def eval_bias(self) -> Tensor:
        """The evaluation-mode bias: ``b − running_mean`` with centring, else ``b``."""
        return self.bias - self.running_mean if self.centering else self.bias

    def _linear(self, v: Tensor, weight: Tensor) -> Tensor:
        return v + F.conv2d(v, weight, padding=1)

    def _linear_t(self, u: Tensor, weight: Tensor) -> Tensor:
        return u + F.conv_transpose2d(u, weight, padding=1)

    # ---------------------------------------------------------------- guaranteed bound
    def _token(self) -> tuple:
        tensors = (self.weight,) if self.gamma is None else (self.weight, self.gamma)
        train_map = self.centering and self.training
        return (train_map, *((t._version, t.data_ptr(), t.dtype) for t in tensors))

    def full_filter(self) -> Tensor:
        """``W_eff + I·δ₀`` in float64: the filter of the block's linear part."""
        K = self.effective_weight().detach().to(torch.float64).clone()
        K[:, :, 1, 1] += torch.eye(self.channels, dtype=torch.float64, device=K.device)
        return K.cpu()

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on the block's Lipschitz constant at :attr:`image_size`: ``‖I +
        W_eff‖₂``, and in training mode with centring the batch map's (module docstring);
        cached with a copy of the filter it is for, until the filter's values (in-place writes
        through ``.data`` included) or the mode change."""
        token = self._token()
        current = self.effective_weight().detach()
        cached = self._bound_cache
        if (cached is not None and cached[0] == token and cached[1].dtype == current.dtype
                and cached[1].device == current.device and torch.equal(cached[1], current)):
            return cached[2]
        fourier = zero_padded_conv_norm_upper_bound(self.full_filter(), self.image_size)
        # exact float64 copy of the float filter, so the triangle inequality is exact up to round_up
        loose = round_up(1.0 + conv_gram_norm_upper_bound(self.effective_weight().detach().to(torch.float64).cpu()))
        value = min(fourier, loose)
        if token[0]:  # the batch-centred training map: min(√(L² + 1), 1 + ‖W_eff‖)
            value = min(round_up(math.sqrt(round_up(value * value + 1.0))), loose)
        self._bound_cache = (token, current.clone(), value)
        return value

    # ---------------------------------------------------------------- estimates
    @torch.no_grad()
    def _power_steps(self, v: Tensor, steps: int) -> Tensor:
        w = self.effective_weight().detach().to(v.dtype)
        for _ in range(steps):
            v = self._linear_t(self._linear(v, w), w)
            v = v / v.norm().clamp_min(1e-30)
        return v

    def training_lipschitz(self) -> Tensor:
        """A differentiable ESTIMATE of ``‖I + W‖₂`` for training losses (module docstring)."""
        v = self.power_v
        if self.training:
            v = self._power_steps(v.detach().clone(), self.power_steps)
            with torch.no_grad():
                self.power_v.copy_(v)
        return self._linear(v.detach().clone(), self.effective_weight()).norm()

    @torch.no_grad()
    def refresh(self, steps: int = 50) -> None:
        """``steps`` more power-iteration steps on :attr:`power_v`."""
        steps = max(0, min(int(steps), MAX_REFRESH_STEPS))
        self.power_v.copy_(self._power_steps(self.power_v.clone(), steps))

    @torch.no_grad()
    def lipschitz_estimate(self, input_shape: tuple[int, ...] | None = None, iters: int = 50) -> float:
        """Power-method LOWER estimate of ``‖I + W‖₂`` (from a copy of :attr:`power_v`)."""
        v = self._power_steps(self.power_v.clone().double(), max(1, min(int(iters), MAX_REFRESH_STEPS)))
        value = float(self._linear(v, self.effective_weight().detach().double()).norm())
        return value if math.isfinite(value) else math.inf

    def export_module(self) -> nn.Module:
        """``lip export``: the forward is plain torch operations (a conv and an add) with the
        evaluation-mode filter and bias."""
        return _ExportedResidual(self.effective_weight().detach().clone(), self.eval_bias().detach().clone())

    def extra_repr(self) -> str:
        extra = "".join((", gamma=True" if self.gamma is not None else "",
                         f", scale={self.scale:g}" if self.scale != 1.0 else "",
                         ", centering=True" if self.centering else ""))
        return f"channels={self.channels}, image_size={self.image_size}{extra}"


class _ExportedResidual(nn.Module):
    """``x + conv(x; W, b)`` with the weights as buffers (no shape check: the exported
    program fixes the shape)."""

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.conv2d(x, self.weight, self.bias, padding=1)
