"""Built-in channel-halving 1-Lipschitz pools: max pooling and projection pooling (SPEC §2).

Both take ``z`` of shape ``(N, C, ...)`` (``C`` even), pair channel ``k`` with channel
``k + C/2`` and return one value per pair, i.e. ``C/2`` channels at the same spatial size.

* ``max``:        ``max(z[:, :C/2], z[:, C/2:])``. 1-Lipschitz: ``|max(a,b) - max(a',b')|
  <= max(|a-a'|, |b-b'|) <= ||(a-a', b-b')||_2``.
* ``projection``: the signed l2 distance of the pair ``(x, y)`` to a learnable cone
  (paper §6, eq. 6; Theorem 2 and Corollary 1 give 1-Lipschitzness).
"""

from __future__ import annotations

import math

import torch
from torch import nn



def _halves(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = z.shape[1]
    if c % 2:
        raise ValueError(f"channel pooling needs an even number of channels, got {c}")
    return z[:, : c // 2], z[:, c // 2 :]


class _PairMax(torch.autograd.Function):
    """``max(a, b)`` of the channel halves of ``z``; the gradient goes to ``a`` where
    ``a ≥ b``, else to ``b``.  Backward writes ``∂a = g·m`` and ``∂b = g − ∂a`` (``m ∈ {0, 1}``:
    exact for finite gradients) straight into one gradient tensor of ``z``'s shape and
    memory format (``torch.maximum``'s own backward splits ties and recomputes
    comparisons; slicing's backward zero-fills two full-size tensors and adds them).  Under
    ``create_graph`` the backward is built from differentiable ops."""

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        a, b = _halves(z)
        ctx.save_for_backward(a >= b)
        ctx.channels_last = z.dim() == 4 and not z.is_contiguous() and z.is_contiguous(
            memory_format=torch.channels_last
        )
        return torch.maximum(a, b)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (take_a,) = ctx.saved_tensors
        h = take_a.shape[1]
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # create_graph / compiled: no out= views
            zero = torch.zeros((), dtype=g.dtype, device=g.device)
            return torch.cat((torch.where(take_a, g, zero), torch.where(take_a, zero, g)), dim=1)
        shape = (g.shape[0], 2 * h, *g.shape[2:])
        fmt = torch.channels_last if ctx.channels_last else torch.contiguous_format
        grad = torch.empty(shape, dtype=g.dtype, device=g.device, memory_format=fmt)
        torch.mul(g, take_a, out=grad[:, :h])
        torch.sub(g, grad[:, :h], out=grad[:, h:])
        return grad


class ChannelMaxPool(nn.Module):
    """Baseline pooling ``max(z[:, :C/2], z[:, C/2:])`` (SPEC §2, "Max pooling")."""

    def __init__(self, channels: int | None = None) -> None:
        super().__init__()
        if channels is not None and channels % 2:
            raise ValueError(f"ChannelMaxPool needs an even number of channels, got {channels}")
        self.channels = channels

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        _halves(z)  # checks the channel count
        return _PairMax.apply(z)

    def extra_repr(self) -> str:
        return "" if self.channels is None else f"channels={self.channels}"

    def export_module(self) -> nn.Module:
        """Plain-torch stand-in for ``lip export`` (:mod:`lipcli.sdk.export`)."""
        return PlainPairMax()


class PlainPairMax(nn.Module):
    """``max(z[:, :C/2], z[:, C/2:])`` in plain torch operations (``lip export``)."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        a, b = torch.chunk(z, 2, dim=1)
        return torch.maximum(a, b)


def cone_signed_distance(x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Signed l2 distance of ``(x, y)`` to the cone ``{r(cos a, sin a): r >= 0, |a| <= theta/2}``.

    SPEC §2 / paper eq. (6) with the paper's half-angle written ``theta/2``: with
    ``phi = atan2(y, x) mod 2 pi``,

    * ``-x sin(theta/2) + y cos(theta/2)``  if ``phi < (pi + theta)/2``,
    * ``sqrt(x^2 + y^2)``                   if ``(pi + theta)/2 <= phi < (3 pi - theta)/2``,
    * ``-x sin(theta/2) - y cos(theta/2)``  otherwise;

    positive outside the cone, negative inside. ``theta`` must lie in ``[0, pi]``.

    Branch-free evaluation. The cone is symmetric under ``y -> -y``, so fold ``y`` to
    ``|y|`` (cases 1 and 3 become one). Rotate the folded point into the frame of the upper
    boundary ray ``u = (c, s)``, ``c = cos(theta/2) >= 0``, ``s = sin(theta/2) >= 0``:
    ``a = x c + |y| s`` (along the ray) and ``b = -x s + |y| c`` (along its outward normal).
    Then the distance is ``b`` where ``a >= 0`` (the nearest point is on the ray, or the point
    is inside the cone and the upper ray is the nearer boundary) and ``||(x, y)||`` where
    ``a < 0`` (the apex is nearest). Numerical safety:

    * ``c`` is clamped at 0, because in floating point ``cos(fl(pi)/2)`` may be a tiny
      negative number; with ``c, s >= 0``, ``a < 0`` forces ``x < 0`` and therefore ``b >= 0``
      exactly, so the apex branch never flips the sign of a point inside the cone;
    * ``a = 0`` takes the linear branch, which is exact there also for ``theta = pi``
      (half plane) where ``b`` may be ``-||(x, y)||``;
    * the square root only sees strictly positive arguments (zeros are replaced before the
      root and the result masked), so no ``0/0`` reaches the gradient at the origin; the
      gradient of ``|y|`` at ``y = 0`` is 0 (a valid subgradient).

    Both branches have gradient norm exactly 1 in ``(x, y)`` and agree on ``a = 0`` (where
    ``b = ||(x, y)||`` when ``x < 0``), so the result is continuous and 1-Lipschitz.
    """
    half = theta * 0.5
    c = torch.cos(half).clamp_min(0.0)
    s = torch.sin(half).clamp_min(0.0)
    ay = y.abs()
    along = x * c + ay * s
    normal = ay * c - x * s
    sq = x * x + y * y
    positive = sq > 0
    radius = torch.where(positive, torch.sqrt(torch.where(positive, sq, torch.ones_like(sq))), 0.0)
    return torch.where(along >= 0, normal, radius)


class ProjectionPool(nn.Module):
    """Signed-distance projection pooling (paper §6, SPEC §2).

    Channel pairs ``(x, y) = (z[:, :C/2], z[:, C/2:])``; output channel ``k`` is the signed
    l2 distance of ``(x_k, y_k)`` to the cone of full opening angle ``theta_k`` about the
    positive x axis (see :func:`cone_signed_distance`). ``theta`` (one per output channel) is
    initialised ``pi * U(0, 1)`` and clamped to ``[0, pi]`` inside ``forward`` (so whatever an
    optimiser does to the raw parameter, the layer is always a distance to a valid cone and
    hence 1-Lipschitz). ``theta`` must be excluded from weight decay (SPEC §6).
    """

    #: parameter names (as in ``named_parameters()``) that must not get weight decay
    no_weight_decay: tuple[str, ...] = ("theta",)

    def __init__(self, channels: int) -> None:
        super().__init__()
        if channels % 2:
            raise ValueError(f"ProjectionPool needs an even number of channels, got {channels}")
        self.channels = channels
        self.theta = nn.Parameter(torch.empty(channels // 2))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.theta.uniform_(0.0, 1.0).mul_(math.pi)

    def angles(self) -> torch.Tensor:
        """The effective opening angles ``clamp(theta, 0, pi)``."""
        return self.theta.clamp(0.0, math.pi)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x, y = _halves(z)
        if x.shape[1] != self.theta.shape[0]:
            raise ValueError(
                f"ProjectionPool built for {self.channels} channels, got {z.shape[1]}"
            )
        theta = self.angles().to(dtype=z.dtype).view(1, -1, *([1] * (z.dim() - 2)))
        return cone_signed_distance(x, y, theta)

    def extra_repr(self) -> str:
        return f"channels={self.channels}"

    def export_module(self) -> nn.Module:
        """``lip export``: the forward is plain torch operations already (the clamp of
        ``theta`` and :func:`cone_signed_distance`), so the layer exports as it is."""
        return self
