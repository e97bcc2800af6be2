"""A base class for convolution components with a guaranteed Lipschitz bound.

:class:`LipConvBase` does what every LipConvnet convolution needs, so that a plugin only
writes its maths:

* the factory signature of a ``conv`` spec, ``(in_channels, out_channels, kernel_size,
  stride)`` (odd kernel, stride 1 or 2), checked once;
* stride 2 as in SOC (SPEC §1.3): the invertible rearrangement ``pixel_unshuffle(x, 2)``
  (a permutation of the coordinates, norm 1) first, then a stride-1 operator with
  ``4·in_channels`` input channels (:attr:`conv_in_channels`);
* the bias (does not change the Lipschitz constant);
* the eval-mode operator cached: :meth:`eval_operator` is recomputed only when a parameter
  or buffer changed (tensor version counters and storage) or a setting named by
  :meth:`operator_settings`, on a mode change by ``train()``/``eval()``, on ``.to()`` and
  after :meth:`invalidate`; when gradients to the parameters are requested in eval mode the
  operator is recomputed with a graph (same values) unless :attr:`eval_grad_to_params` is
  false;
* :meth:`lipschitz_upper_bound` = the subclass's *guaranteed* :meth:`operator_bound` of the
  cached eval operator (cached too), and :meth:`lipschitz_estimate`, a power-method lower
  estimate.

Subclasses implement ``compute_operator(size)`` (differentiable; ``size`` is the spatial
size ``(H, W)`` after the rearrangement, which operators acting in the Fourier domain need;
optionally ``compute_eval_operator(size)`` when evaluation uses another one),
``apply_operator(x, op)`` (the linear map without bias on the rearranged input) and
``operator_bound(op, size)`` (a guaranteed bound on its l2 operator norm; ``size`` is
:meth:`bound_size`, ``None`` unless the subclass needs one).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LipConvBase"]


class LipConvBase(nn.Module):
    """``(N, in, H, W) → (N, out, H/s, W/s)``: rearrangement, a linear operator, bias."""

    bias: Tensor
    #: in eval mode with gradients enabled, recompute the operator so that parameter
    #: gradients flow (same values as the cache); ``False``: always use the cached operator
    eval_grad_to_params: bool = True

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int, *, bias: bool = True
    ) -> None:
        """``bias=False``: the subclass registers the parameter ``bias`` (``out_channels``
        entries) itself, e.g. after its weight to keep its parameters' order and random
        initialisation."""
        super().__init__()
        name = type(self).__name__
        if int(in_channels) < 1 or int(out_channels) < 1:
            raise ValueError(f"{name}: channel counts must be positive")
        if stride not in (1, 2):
            raise ValueError(f"{name} supports stride 1 or 2, got {stride}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"{name} needs an odd kernel size, got {kernel_size}")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = int(kernel_size)
        self.stride = int(stride)
        #: input channels of the operator (after ``pixel_unshuffle`` for stride 2)
        self.conv_in_channels = self.in_channels * self.stride**2
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.out_channels))
        self._op_cache: tuple[tuple, Any] | None = None
        self._bound_cache: tuple[tuple, float] | None = None

    # ------------------------------------------------------------------ subclass API
    def compute_operator(self, size: tuple[int, int] | None) -> Any:
        raise NotImplementedError

    def compute_eval_operator(self, size: tuple[int, int] | None) -> Any:
        """The operator used in eval mode (called without gradients, then cached); by
        default :meth:`compute_operator`."""
        return self.compute_operator(size)

    def apply_operator(self, x: Tensor, op: Any) -> Tensor:
        raise NotImplementedError

    def operator_bound(self, op: Any, size: tuple[int, int] | None) -> float:
        raise NotImplementedError

    def bound_size(self) -> tuple[int, int] | None:
        """Spatial size the bound is computed for (``None``: the operator does not depend on
        it)."""
        return None

    def operator_size(self, size: tuple[int, int]) -> tuple[int, int] | None:
        """The part of the input size the operator depends on (``None``: none)."""
        return None

    def operator_settings(self) -> tuple:
        """Plain attributes (not parameters or buffers) that the eval operator or its bound
        depend on; the caches are recomputed when they change (default: none)."""
        return ()

    # ------------------------------------------------------------------ cache
    def _token(self) -> tuple:
        token: list = []
        for t in (*self.parameters(), *self.buffers()):
            token += [t._version, t.data_ptr(), t.dtype, t.device]
        return (*token, *self.operator_settings())

    def invalidate(self) -> None:
        """Drop the cached eval operator and bound (call after writes that bypass version
        counters, such as ``weight.data[...] = ...``)."""
        self._op_cache = None
        self._bound_cache = None

    def eval_operator(self, size: tuple[int, int] | None = None) -> Any:
        """The detached operator used in eval mode, cached (per operator size)."""
        key = (self._token(), size)
        if self._op_cache is None or self._op_cache[0] != key:
            with torch.no_grad():
                op = self.compute_eval_operator(size)
            self._op_cache = ((self._token(), size), op)
        return self._op_cache[1]

    def train(self, mode: bool = True) -> "LipConvBase":
        # a mode change drops the caches; .eval() on an eval layer keeps them, so the eval
        # lowering's matrix and the bound it adds to are made from ONE computed operator
        if bool(mode) != self.training:
            self.invalidate()
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "LipConvBase":  # .to(), .double()
        self.invalidate()
        return super()._apply(fn, recurse)

    # ------------------------------------------------------------------ forward
    def rearrange(self, x: Tensor) -> Tensor:
        """Check the shape, ``pixel_unshuffle`` for stride 2."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{type(self).__name__} expected input (N, {self.in_channels}, H, W), got "
                f"{tuple(x.shape)}"
            )
        if self.stride == 2:
            if x.shape[-1] % 2 or x.shape[-2] % 2:
                raise ValueError(
                    f"{type(self).__name__} with stride 2 needs even H and W, got {tuple(x.shape)}"
                )
            x = F.pixel_unshuffle(x, 2)
        return x

    def linear(self, x: Tensor) -> Tensor:
        """The layer without its bias (the operator the Lipschitz bound is about)."""
        z = self.rearrange(x)
        size = self.operator_size((int(z.shape[-2]), int(z.shape[-1])))
        needs_graph = (
            self.eval_grad_to_params
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in self.parameters())
        )
        if self.training or needs_graph:
            op = self.compute_operator(size)
        else:
            op = self.eval_operator(size)
        return self.apply_operator(z, op)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x) + self.bias.view(1, -1, 1, 1)

    # ------------------------------------------------------------------ Lipschitz
    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on the l2 Lipschitz constant of the eval-mode layer: the
        rearrangement is a permutation and the bias a translation, so this is the
        subclass's :meth:`operator_bound` of the cached eval operator.  Cached."""
        size = self.bound_size()
        key = (self._token(), size)
        if self._bound_cache is not None and self._bound_cache[0] == key:
            return self._bound_cache[1]
        value = float(self.operator_bound(self.eval_operator(size), size))
        self._bound_cache = (key, value)
        return value

    @torch.no_grad()
    def lipschitz_estimate(self, input_shape: tuple[int, int, int], iters: int = 50) -> float:
        """Power-method estimate (a lower estimate) of the operator norm of
        ``x ↦ layer(x) − bias`` for inputs of shape ``(in, H, W)``."""
        param = next(self.parameters())
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn((1, *input_shape), generator=gen, dtype=param.dtype).to(param.device)
        z = self.rearrange(x)
        op = self.eval_operator(self.operator_size((int(z.shape[-2]), int(z.shape[-1]))))
        estimate = 0.0
        with torch.enable_grad():
            for _ in range(max(1, iters)):
                x = (x / torch.linalg.vector_norm(x)).detach().requires_grad_(True)
                y = self.apply_operator(self.rearrange(x), op)
                estimate = float(torch.linalg.vector_norm(y.detach()))
                (x,) = torch.autograd.grad(y, x, y.detach())
        return estimate

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
