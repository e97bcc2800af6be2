"""A convolution with a free (unconstrained) filter and a proven bound on its operator norm: the
stem of the LiResNet and BRONet authors' networks (``hukkai/liresnet`` and
``ntuaislab/BRONet``, ``models/layers/conv.py``: a plain ``k×k`` stride-2 convolution with a
bias, orthogonally initialised, whose norm they only estimate by power iteration), and the
layers of imported networks kept as the float tensors their authors' code computed.

:class:`FreeConv` holds a filter ``W`` ``(out, in, k, k)`` (odd ``k``) and a bias and computes
``conv2d(x, W, b, stride, padding=k // 2)`` on ``image_size`` inputs.

Guaranteed bound (:meth:`FreeConv.lipschitz_upper_bound`; the bias does not change it):

* ``k = 1``: the convolution applies the matrix ``W[:, :, 0, 0]`` at every pixel (and stride 2
  keeps a subset of the pixels), so ``‖conv‖₂ ≤ ‖W₀‖₂``, bounded by
  :func:`lipcli.numerics.spectral.spectral_norm_upper_bound` (verified, rounding included);
* stride 1: the minimum of the Fourier bound
  (:func:`lipcli.numerics.conv_fourier.zero_padded_conv_norm_upper_bound`) and the *Fantastic
  Four* bound (:func:`lipcli.numerics.conv.conv_spectral_norm_upper_bound`), both proven for the
  zero-padded convolution;
* stride 2 (even image sides): ``conv_s2(x; W) = conv_s1(pixel_unshuffle(x, 2); R)`` exactly,
  with ``R`` the rearranged filter ``(out, 4·in, k', k')``, ``k' = 2⌈p/2⌉ + 1`` (``p = k // 2``;
  :func:`stride2_filter`): input tap ``t = 2a + b`` (``b ∈ {0, 1}``) of ``W`` becomes tap ``a``
  of channel ``(c, b_y, b_x)`` of ``R`` (pixel_unshuffle's channel order), and the zero padding
  corresponds exactly (an input pixel ``2(y + a) + b`` is inside the image iff ``y + a`` is
  inside the half-size image).  ``pixel_unshuffle`` is a permutation, so ``‖conv_s2‖₂ =
  ‖conv_s1(R)‖₂`` on the half-size images, bounded as for stride 1; a stride-2 convolution also
  keeps a subset of the outputs of the stride-1 one with ``W`` (a coordinate projection), so the
  Fantastic Four bound of ``W`` bounds it too.  The smallest of the three is used.  ``R`` holds
  the float filter's entries exactly.

Cached with a copy of the filter it is for: any change of its values recomputes it.

Training estimate (:meth:`FreeConv.lipschitz_training_estimate`): the authors' power iteration,
``power_steps`` steps (their ``num_lc_iter``: 10) per call from a kept vector (first all ones),
then ``‖conv(v)‖`` with ``v`` detached (differentiable in ``W``).  An ESTIMATE (it can be below
the norm): it feeds training losses only, never a certificate.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.conv import conv_spectral_norm_upper_bound
from lipcli.numerics.conv_fourier import zero_padded_conv_norm_upper_bound
from lipcli.numerics.spectral import spectral_norm_upper_bound

__all__ = ["AUTHORS_POWER_STEPS", "FreeConv", "stride2_filter"]

STRIDES = (1, 2)
#: tightness asked of the matrix bound (the authors' dense matrices have norms just below 1)
MATRIX_RTOL = 1e-6
#: power-iteration steps per training estimate (the authors' ``num_lc_iter``, configs/*.yaml)
AUTHORS_POWER_STEPS = 10


def stride2_filter(weight: Tensor) -> Tensor:
    """``R`` of the module docstring: the stride-1 filter on ``pixel_unshuffle(x, 2)`` that
    computes the stride-2 "same" convolution with ``weight`` (same dtype, entries copied)."""
    o, i, k, _ = weight.shape
    p = k // 2
    half = (p + 1) // 2
    R = weight.new_zeros(o, i, 2, 2, 2 * half + 1, 2 * half + 1)  # (o, c, b_y, b_x, a_y, a_x)
    for ty in range(-p, p + 1):
        for tx in range(-p, p + 1):
            R[:, :, ty % 2, tx % 2, ty // 2 + half, tx // 2 + half] = weight[:, :, ty + p, tx + p]
    return R.reshape(o, 4 * i, 2 * half + 1, 2 * half + 1)


class FreeConv(nn.Module):
    """``(N, in, H, W) → (N, out, H/stride, W/stride)``: ``conv2d(x, W, b, stride, padding=k//2)``
    with a free filter ``W``; ``image_size`` is the input size its bound is proven for."""

    lip_promises: tuple[str, ...] = ()

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int,
                 image_size: Sequence[int], power_steps: int = AUTHORS_POWER_STEPS) -> None:
        super().__init__()
        size = (int(image_size[0]), int(image_size[1]))
        if kernel_size < 1 or kernel_size % 2 == 0 or stride not in STRIDES:
            raise ValueError(f"FreeConv needs an odd kernel and stride 1 or 2, got {kernel_size}, {stride}")
        if stride == 2 and (size[0] % 2 or size[1] % 2):
            raise ValueError(f"a stride-2 FreeConv needs even image sides, got {size}")
        if not 1 <= power_steps <= 1000:
            raise ValueError(f"power_steps must be in 1..1000, got {power_steps}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.image_size, self.padding = int(stride), size, kernel_size // 2
        self.power_steps = int(power_steps)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        nn.init.orthogonal_(self.weight)  # as the authors' stem (models/layers/conv.py)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.register_buffer("power_v", torch.empty(0), persistent=False)
        self._bound_cache: tuple[Tensor, float] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) != self.image_size:
            raise ValueError(f"FreeConv was built (and bounded) for {self.image_size[0]}x"
                             f"{self.image_size[1]} inputs, got {tuple(x.shape)}")
        if x.dtype != self.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            # the bound is of this filter: a rounded copy would be another operator
            raise ValueError(f"FreeConv holds a {self.weight.dtype} filter and got {x.dtype} inputs: "
                             "convert the model or the inputs so that they agree")
        return F.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding)

    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on ``‖conv‖₂`` on :attr:`image_size` inputs (module docstring);
        cached with a copy of the filter it is for, so any change of the filter's values
        (in-place writes through ``.data`` included) recomputes it."""
        w = self.weight.detach()
        cached = self._bound_cache
        if (cached is not None and cached[0].dtype == w.dtype and cached[0].device == w.device
                and torch.equal(cached[0], w)):
            return cached[1]
        K = w.to(torch.float64).cpu()
        if K.shape[-1] == 1:
            value = spectral_norm_upper_bound(K[:, :, 0, 0], rtol=MATRIX_RTOL)
        elif self.stride == 2:
            R, half = stride2_filter(K), (self.image_size[0] // 2, self.image_size[1] // 2)
            value = min(zero_padded_conv_norm_upper_bound(R, half), conv_spectral_norm_upper_bound(R),
                        conv_spectral_norm_upper_bound(K))
        else:
            value = min(zero_padded_conv_norm_upper_bound(K, self.image_size), conv_spectral_norm_upper_bound(K))
        self._bound_cache = (w.clone(), value)
        return value

    def power_step(self, v: Tensor) -> Tensor:
        """One step ``v ← normalise(Cᵀ C v)`` of the authors' power iteration (``(1, in, H, W)``)."""
        u = F.conv2d(v, self.weight, stride=self.stride, padding=self.padding)
        extra = [s - ((o - 1) * self.stride - 2 * self.padding + self.kernel_size)
                 for s, o in zip(self.image_size, u.shape[-2:])]
        back = F.conv_transpose2d(u, self.weight, stride=self.stride, padding=self.padding,
                                  output_padding=tuple(extra))
        return F.normalize(back, dim=(1, 2, 3))

    def lipschitz_training_estimate(self) -> Tensor:
        """The authors' estimate (module docstring): ``power_steps`` power steps from the kept
        vector, then ``‖conv(v)‖`` (differentiable in ``W``).  Never a certificate."""
        v = self.power_v
        if v.shape != (1, self.in_channels, *self.image_size) or v.device != self.weight.device:
            v = torch.ones(1, self.in_channels, *self.image_size, dtype=self.weight.dtype,
                           device=self.weight.device)
        with torch.no_grad():
            for _ in range(self.power_steps):
                v = self.power_step(v.to(self.weight.dtype))
        self.power_v = v
        return F.conv2d(v, self.weight, stride=self.stride, padding=self.padding).norm()

    @torch.no_grad()
    def power_estimate(self, steps: int) -> float:
        """The authors' evaluation estimate: ``steps`` power steps from the all-ones vector
        (their ``init_x`` before training), then ``‖C v‖``; the kept vector is left alone.  An
        ESTIMATE, used only to reproduce a source's own certificates."""
        v = torch.ones(1, self.in_channels, *self.image_size, dtype=self.weight.dtype, device=self.weight.device)
        for _ in range(steps):
            v = self.power_step(v)
        return float(F.conv2d(v, self.weight, stride=self.stride, padding=self.padding).norm())

    @torch.no_grad()
    def refresh(self, steps: int) -> None:
        """Advance the kept power vector by ``steps`` power steps (lipcli's refreshes)."""
        for _ in range(max(1, steps // self.power_steps)):
            self.lipschitz_training_estimate()

    def export_module(self) -> nn.Module:
        """``lip export``: the convolution with the weights as buffers (plain torch)."""
        return _ExportedConv(self.weight.detach().clone(), self.bias.detach().clone(), self.stride, self.padding)

    def extra_repr(self) -> str:
        o, i, k, _ = self.weight.shape
        return f"{i}, {o}, kernel_size={k}, stride={self.stride}, image_size={self.image_size}"


class _ExportedConv(nn.Module):
    """``conv2d(x, W, b)`` with the weights as buffers (``lip export``)."""

    def __init__(self, weight: Tensor, bias: Tensor, stride: int, padding: int) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.stride, self.padding = stride, padding

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding)
