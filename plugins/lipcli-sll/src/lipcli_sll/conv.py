"""The ``sll`` convolution component: an SLL residual layer (:mod:`lipcli_sll.core`) with the
channel handling LipConvnet needs.

``SLLConv(in, out, kernel_size, stride)`` computes, for ``x`` of shape ``(N, in, H, W)``:

1. stride 2: ``pixel_unshuffle(x, 2)`` (a permutation of the coordinates), giving
   ``c = 4·in`` channels (``c = in`` for stride 1);
2. ``c < out``: zero channels appended up to ``out`` (an isometric embedding, the
   "padding channels" of the SLL authors' networks);
3. the SLL residual ``z − 2 Cᵀ T⁻¹ ReLU(C z + b)`` on ``m = max(c, out)`` channels with a
   ``hidden × m × k × k`` filter (``hidden`` given as a count, else ``inner_factor · m``;
   any count, smaller than ``m`` too: the proof does not depend on it);
4. ``c > out``: the first ``out`` channels are kept (a coordinate projection, norm 1).  SLL
   itself keeps the number of channels and has no channel *reduction*; this fallback is
   sound but discards part of the signal.  LipConvnet needs it only for a stem with fewer
   channels than the input (``--width`` below 3 on RGB images): its stride-2 convolutions
   map ``C → 4C``, i.e. ``4C → 4C`` after the rearrangement, and all others ``C → C``.

Steps 1, 2 and 4 have norm at most 1, so the layer's Lipschitz constant is at most the
residual's: :meth:`SLLConv.lipschitz_upper_bound` is the verified
:func:`lipcli_sll.core.sll_bound` of the filter and scales the eval-mode layer applies
(cached with them).  The layer is *not* affine (``lip_affine = False``): conformance checks
use Jacobians at several points.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .core import Q_INITS, initial_log_q, sll_bound, sll_residual, sll_scale

__all__ = ["SLLConv"]


class SLLConv(nn.Module):
    """SLL convolution ``(N, in, H, W) → (N, out, H/s, W/s)`` (module docstring).

    Parameters ``weight`` (``hidden × m × k × k``, ``m = max(in·s², out)``), ``bias``
    (``hidden``) and ``log_q`` (``hidden``, ``q = exp(log_q)``; ``q_init="ones"``: 0,
    ``"normal"``: ``N(0, 1)`` as the SLL authors').  ``kernel`` overrides the architecture's
    ``kernel_size`` when positive; ``hidden`` (a count) replaces ``inner_factor · m`` when
    positive (the authors' networks use 5 hidden channels on 45 to 120).
    """

    #: not an affine map: Lipschitz checks must use Jacobians at several points
    lip_affine = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 *, kernel: int = 0, inner_factor: int = 1, hidden: int = 0,
                 q_init: str = "ones") -> None:
        super().__init__()
        k = int(kernel) if kernel > 0 else int(kernel_size)
        if stride not in (1, 2):
            raise ValueError(f"SLLConv supports stride 1 or 2, got {stride}")
        if k < 1 or k % 2 == 0:
            raise ValueError(f"SLLConv needs an odd kernel size, got {k}")
        if int(inner_factor) < 1:
            raise ValueError(f"SLLConv needs inner_factor >= 1, got {inner_factor}")
        if int(hidden) < 0:
            raise ValueError(f"SLLConv needs hidden >= 0 (0: inner_factor times the channels), got {hidden}")
        if int(hidden) > 0 and int(inner_factor) != 1:
            raise ValueError("SLLConv: give hidden (a channel count) or inner_factor, not both")
        if q_init not in Q_INITS:
            raise ValueError(f"SLLConv q_init must be one of {', '.join(Q_INITS)}, got {q_init!r}")
        if int(in_channels) < 1 or int(out_channels) < 1:
            raise ValueError("SLLConv: channel counts must be positive")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = k, int(stride)
        #: channels after the stride-2 rearrangement, and those the residual acts on
        self.conv_in_channels = self.in_channels * self.stride**2
        self.channels = max(self.conv_in_channels, self.out_channels)
        hidden = int(hidden) if int(hidden) > 0 else int(inner_factor) * self.channels
        weight = torch.empty(hidden, self.channels, k, k)
        nn.init.xavier_normal_(weight)
        self.weight = nn.Parameter(weight)
        bound = 1.0 / (self.channels * k * k) ** 0.5
        self.bias = nn.Parameter(torch.empty(hidden).uniform_(-bound, bound))
        self.log_q = nn.Parameter(initial_log_q(hidden, q_init))
        self._cache: tuple[tuple, Tensor, float | None] | None = None

    # ------------------------------------------------------------------ parameters in use
    def _token(self) -> tuple:
        return tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in self.parameters())

    def eval_scale(self) -> Tensor:
        """``1/T`` of the current parameters, detached and cached (what eval mode applies and
        the bound is computed for)."""
        token = self._token()
        if self._cache is None or self._cache[0] != token:
            with torch.no_grad():
                scale = sll_scale(self.weight, self.log_q)
            self._cache = (token, scale, None)
        return self._cache[1]

    def invalidate(self) -> None:
        """Drop the cached scales and bound (after writes that bypass version counters, such
        as ``weight.data[...] = ...``)."""
        self._cache = None

    def train(self, mode: bool = True) -> "SLLConv":
        self._cache = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "SLLConv":
        self._cache = None
        return super()._apply(fn, recurse)

    # ------------------------------------------------------------------ forward
    def rearrange(self, x: Tensor) -> Tensor:
        """Check the shape; ``pixel_unshuffle`` for stride 2; zero channels up to ``out``
        (steps 1 and 2 of the module docstring)."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"SLLConv expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}")
        if self.stride == 2:
            if x.shape[-1] % 2 or x.shape[-2] % 2:
                raise ValueError(f"SLLConv with stride 2 needs even H and W, got {tuple(x.shape)}")
            x = F.pixel_unshuffle(x, 2)
        extra = self.channels - self.conv_in_channels
        if extra:
            x = F.pad(x, (0, 0, 0, 0, 0, extra))
        return x

    def forward(self, x: Tensor) -> Tensor:
        z = self.rearrange(x)
        needs_graph = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if self.training or needs_graph:
            scale = sll_scale(self.weight, self.log_q)
        else:
            scale = self.eval_scale()
        y = sll_residual(z, self.weight, self.bias, scale)
        return y[:, : self.out_channels] if self.channels > self.out_channels else y

    # ------------------------------------------------------------------ Lipschitz
    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on the l2 Lipschitz constant of the eval-mode layer (the verified
        :func:`lipcli_sll.core.sll_bound` of its filter and cached scales; cached)."""
        scale = self.eval_scale()
        assert self._cache is not None
        if self._cache[2] is None:
            value = sll_bound(self.weight.detach(), scale, self.log_q.detach())
            self._cache = (self._cache[0], scale, value)
        return float(self._cache[2])

    def lipschitz_estimate(self, input_shape: tuple[int, int, int], iters: int = 50) -> float:
        """LOWER estimate: power iteration on ``JᵀJ`` for the Jacobian ``J`` at one seeded
        random input (any Jacobian norm is at most the Lipschitz constant)."""
        param = self.weight
        gen = torch.Generator(device="cpu").manual_seed(0)
        x0 = torch.randn((1, *input_shape), generator=gen, dtype=param.dtype).to(param.device)
        v = torch.randn((1, *input_shape), generator=gen, dtype=param.dtype).to(param.device)
        fn = lambda t: self.forward(t)  # noqa: E731
        estimate = 0.0
        with torch.enable_grad():
            for _ in range(max(1, iters)):
                v = v / torch.linalg.vector_norm(v)
                _, jv = torch.autograd.functional.jvp(fn, x0, v)
                estimate = float(torch.linalg.vector_norm(jv))
                _, v = torch.autograd.functional.vjp(fn, x0, jv)
        return estimate

    def export_module(self) -> nn.Module:
        """``lip export`` (:mod:`lipcli.sdk.export`): the filter, bias and the cached eval
        scales baked into plain torch operations (:class:`lipcli_sll.export.ExportedSLL`)."""
        from .export import ExportedSLL

        with torch.no_grad():
            return ExportedSLL(self.weight, self.bias, self.eval_scale(), stride=self.stride,
                               extra_channels=self.channels - self.conv_in_channels,
                               out_channels=self.out_channels)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, hidden={self.weight.shape[0]}")
