"""The ``cpl`` convolution component: a CPL layer (:mod:`lipcli_cpl.core`) with the channel
handling LipConvnet needs, and the persistent power-iteration state of the study's code.

``CPLConv(in, out, kernel_size, stride)`` computes, for ``x`` of shape ``(N, in, H, W)``:

1. stride 2: ``pixel_unshuffle(x, 2)`` (a permutation), giving ``c = 4·in`` channels;
2. ``c < out``: zero channels appended up to ``out`` (an isometric embedding);
3. the CPL map ``z − h·Wᵀ ReLU(W z + b)`` on ``m = max(c, out)`` channels, ``W`` the "same"
   convolution with the filter ``kernel`` (``hidden × m × k × k``; ``hidden = m`` by default,
   as every layer of the comparison study);
4. ``c > out``: the first ``out`` channels kept (a coordinate projection).

Steps 1, 2 and 4 have norm at most 1, so the layer's Lipschitz constant is at most the map's:
:meth:`CPLConv.lipschitz_upper_bound` is :func:`lipcli_cpl.core.cpl_layer_bound` of the step
``h`` the eval layer applies (cached) and a verified bound of ``‖W‖`` at the image size of ``u``.
The comparison study's convolution (``in = out``, stride 1) is steps 3 only, with the same
parameter names (``kernel``, ``bias``, buffer ``u``) and initialisation (Xavier-normal filter,
bias ``U(±1/√fan_in)``).

The vector ``u`` has the shape of the operator's input, ``(1, m, H, W)``, and is drawn at the
first forward pass (as in the study's code; a state dict brings its own).  The layer then
refuses larger images: its step and its bound are for that size (smaller ones are covered).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .core import (EPSILON, EVAL_NORM_EPSILON, EVAL_STEPS, EVAL_STEP_CHOICES, TRAIN_STEPS, cpl_layer_bound,
                   cpl_residual, operator_norm_upper_bound, power_steps, rescaling, verified_step)

__all__ = ["CPLBase", "CPLConv"]


class CPLBase(nn.Module):
    """The state shared by the convolution and the dense layer: ``kernel``, ``bias``, the
    persistent ``u``, the cached eval step ``h`` and the bound."""

    #: not an affine map: Lipschitz checks use Jacobians at several points
    lip_affine = False
    #: ``u`` is sized by the first input (:func:`lipcli.sdk.loading.adopt_lazy_buffers`)
    lip_lazy_buffers = ("u",)
    kernel: Tensor
    u: Tensor

    def _init_parameters(self, kernel_shape: tuple[int, ...], eval_step: str) -> None:
        if eval_step not in EVAL_STEP_CHOICES:
            raise ValueError(f"CPL eval_step must be one of {', '.join(EVAL_STEP_CHOICES)}, got {eval_step!r}")
        #: "verified": h = 2/σ̄² at evaluation (bound 1); "authors": the study's 100-step estimate
        self.eval_step = eval_step
        self.kernel = nn.Parameter(torch.empty(kernel_shape))
        self.bias = nn.Parameter(torch.empty(kernel_shape[0]))
        nn.init.xavier_normal_(self.kernel)
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.kernel)
        nn.init.uniform_(self.bias, -1.0 / fan_in**0.5, 1.0 / fan_in**0.5)
        self.register_buffer("u", torch.empty(self._u_shape(None)))
        self._cache: tuple[tuple, Tensor, Tensor, Tensor, float | None] | None = None

    # ------------------------------------------------------------------ shapes
    def _u_shape(self, size: tuple[int, ...] | None) -> tuple[int, ...]:
        raise NotImplementedError

    def _size(self) -> tuple[int, ...] | None:
        """The image size ``u`` was drawn for (``None``: not yet)."""
        raise NotImplementedError

    def _ensure_u(self, z: Tensor) -> None:
        if self.u.numel() == 0:
            with torch.no_grad():
                self.u = torch.randn(self._u_shape(tuple(z.shape[2:])), dtype=self.kernel.dtype,
                                     device=self.kernel.device)
            self._cache = None

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        saved = state_dict.get(prefix + "u")
        if saved is not None and tuple(saved.shape) != tuple(self.u.shape):
            self.u = torch.empty(saved.shape, dtype=self.u.dtype, device=self.u.device)
            self._cache = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ the eval step
    def _token(self) -> tuple:
        return tuple((t._version, t.data_ptr(), t.dtype, t.device, tuple(t.shape))
                     for t in (self.kernel, self.bias, self.u)) + (self.eval_step,)

    def invalidate(self) -> None:
        """Drop the cached eval step and bound (after writes that bypass version counters)."""
        self._cache = None

    def train(self, mode: bool = True) -> "CPLBase":
        self._cache = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "CPLBase":
        self._cache = None
        return super()._apply(fn, recurse)

    def eval_state(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(u, v, h)`` of the eval layer: :data:`~lipcli_cpl.core.EVAL_STEPS` power steps from
        ``u`` (``u`` itself is not changed, as in the study's code) and their step ``h``
        (``eval_step="authors"``), or ``h = 2/σ̄²`` just below, from the verified bound σ̄
        (``"verified"``: the layer is then 1-Lipschitz); cached."""
        if self.u.numel() == 0:
            raise ValueError(f"{type(self).__name__}: no power-iteration vector yet (run one forward pass "
                             "first: its size fixes the operator the step is computed for)")
        token = self._token()
        if self._cache is None or self._cache[0] != token:
            with torch.no_grad():
                u, v = power_steps(self.u, self.kernel, EVAL_STEPS, EVAL_NORM_EPSILON)
                h = rescaling(u, v, self.kernel)
                bound = None
                if self.eval_step == "verified":
                    sigma = operator_norm_upper_bound(self.kernel.detach(), self._size())
                    h = verified_step(sigma, self.kernel.dtype, self.kernel.device)
                    bound = cpl_layer_bound(float(h), sigma)
            self._cache = (token, u, v, h, bound)
        return self._cache[1], self._cache[2], self._cache[3]

    def step(self) -> Tensor:
        """The ``h`` of this forward pass (training: one power step, ``u`` updated)."""
        if self.training:
            u, v = power_steps(self.u, self.kernel, TRAIN_STEPS, EPSILON)
            with torch.no_grad():
                self.u.copy_(u)
            return rescaling(u, v, self.kernel)
        u, v, h = self.eval_state()
        if self.eval_step == "authors" and torch.is_grad_enabled() and self.kernel.requires_grad:
            return rescaling(u, v, self.kernel)  # same value, with a graph to the filter
        return h

    # ------------------------------------------------------------------ Lipschitz
    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on the l2 Lipschitz constant of the eval-mode layer:
        ``max(1, h·σ̄² − 1)`` (:func:`lipcli_cpl.core.cpl_layer_bound`), cached."""
        _u, _v, h = self.eval_state()
        assert self._cache is not None
        if self._cache[4] is None:
            sigma = operator_norm_upper_bound(self.kernel.detach(), self._size())
            self._cache = (*self._cache[:4], cpl_layer_bound(float(h), sigma))
        return float(self._cache[4])

    def _eval_forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def lipschitz_estimate(self, input_shape: tuple[int, ...], iters: int = 50) -> float:
        """LOWER estimate: power iteration on ``JᵀJ`` for the eval layer's Jacobian ``J`` at one
        seeded random input (any Jacobian norm is at most the Lipschitz constant)."""
        gen = torch.Generator(device="cpu").manual_seed(0)
        dtype, device = self.kernel.dtype, self.kernel.device
        x0 = torch.randn((1, *input_shape), generator=gen, dtype=dtype).to(device)
        v = torch.randn((1, *input_shape), generator=gen, dtype=dtype).to(device)
        estimate = 0.0
        with torch.enable_grad():
            for _ in range(max(1, iters)):
                v = v / torch.linalg.vector_norm(v)
                _, jv = torch.autograd.functional.jvp(self._eval_forward, x0, v)
                estimate = float(torch.linalg.vector_norm(jv))
                _, v = torch.autograd.functional.vjp(self._eval_forward, x0, jv)
        return estimate


class CPLConv(CPLBase):
    """CPL convolution ``(N, in, H, W) → (N, out, H/s, W/s)`` (module docstring).  ``hidden``
    (a count) replaces the default ``m`` hidden channels when positive; ``eval_step``: the
    step of the eval layer (:meth:`CPLBase.eval_state`)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 *, hidden: int = 0, eval_step: str = "verified") -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"CPLConv supports stride 1 or 2, got {stride}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"CPLConv needs an odd kernel size, got {kernel_size}")
        if int(in_channels) < 1 or int(out_channels) < 1 or int(hidden) < 0:
            raise ValueError("CPLConv: channel counts must be positive")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = int(kernel_size), int(stride)
        self.conv_in_channels = self.in_channels * self.stride**2
        self.channels = max(self.conv_in_channels, self.out_channels)
        hidden = int(hidden) or self.channels
        self._init_parameters((hidden, self.channels, self.kernel_size, self.kernel_size), eval_step)

    def _u_shape(self, size: tuple[int, ...] | None) -> tuple[int, ...]:
        return (1, self.channels, *(size if size is not None else (0, 0)))

    def _size(self) -> tuple[int, int] | None:
        return (int(self.u.shape[-2]), int(self.u.shape[-1])) if self.u.numel() else None

    def rearrange(self, x: Tensor) -> Tensor:
        """Shape check; ``pixel_unshuffle`` for stride 2; zero channels up to ``out``."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"CPLConv expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}")
        if self.stride == 2:
            if x.shape[-1] % 2 or x.shape[-2] % 2:
                raise ValueError(f"CPLConv with stride 2 needs even H and W, got {tuple(x.shape)}")
            x = F.pixel_unshuffle(x, 2)
        extra = self.channels - self.conv_in_channels
        return F.pad(x, (0, 0, 0, 0, 0, extra)) if extra else x

    def _checked(self, x: Tensor) -> Tensor:
        z = self.rearrange(x)
        self._ensure_u(z)
        size = self._size()
        assert size is not None
        if z.shape[-2] > size[0] or z.shape[-1] > size[1]:
            raise ValueError(f"CPLConv was sized for {size[0]}x{size[1]} images (after the rearrangement); "
                             f"got {z.shape[-2]}x{z.shape[-1]}: its step and bound do not cover them")
        return z

    def _finish(self, y: Tensor) -> Tensor:
        return y[:, : self.out_channels] if self.channels > self.out_channels else y

    def forward(self, x: Tensor) -> Tensor:
        z = self._checked(x)
        return self._finish(cpl_residual(z, self.kernel, self.bias, self.step()))

    def _eval_forward(self, x: Tensor) -> Tensor:
        z = self._checked(x)
        return self._finish(cpl_residual(z, self.kernel, self.bias, self.eval_state()[2]))

    def export_module(self) -> nn.Module:
        """``lip export``: the filter, bias and the cached eval step baked into plain torch
        operations (:class:`lipcli_cpl.export.ExportedCPL`)."""
        from .export import ExportedCPL

        with torch.no_grad():
            return ExportedCPL(self.kernel, self.bias, self.eval_state()[2], stride=self.stride,
                               extra_channels=self.channels - self.conv_in_channels,
                               out_channels=self.out_channels)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, hidden={self.kernel.shape[0]}, eval_step={self.eval_step}")
