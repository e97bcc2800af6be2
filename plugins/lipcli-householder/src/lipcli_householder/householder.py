"""HouseHolder activations of order 1 and 2 (Singla, Singla & Feizi, ICLR 2022, §5).

Both act on channel pairs: for ``z`` of shape ``(N, C, ...)`` with ``C`` even, pair ``k`` is
``(x_k, y_k) = (z[:, k], z[:, k + C/2])`` (the channel halves, as MaxMin pairs them), and each
pair has its own learnable angles.  Each maps the plane ``R²`` onto itself by a continuous
function that is an orthogonal linear map on each of finitely many closed cones (sectors)
through the origin.

Why that is 1-Lipschitz and gradient-norm preserving:

* On each sector the Jacobian is the sector's orthogonal matrix, so the Jacobian is
  orthogonal wherever it exists (everywhere but on the sector boundaries, a null set):
  ``||J^T g|| = ||g||`` -- gradient-norm preserving.
* For any two points ``a, b`` the segment ``[a, b]`` crosses the sectors in finitely many
  pieces; on each piece ``f`` is an isometry, so the image of the segment is a continuous
  path (``f`` is continuous) of length ``||a - b||``, and ``||f(a) - f(b)|| <= ||a - b||``.
  Pairs are disjoint coordinates, so the whole layer is 1-Lipschitz in l2.

**Order 1** (``hh1`` in the paper's code), one angle ``θ`` per pair, ``v = (sin θ/2,
-cos θ/2)``::

    f(z) = z                  if vᵀz <= 0
         = (I - 2vvᵀ) z       if vᵀz > 0          i.e.  f(z) = z - 2 max(0, vᵀz) v

the reflection folds the half plane ``vᵀz > 0`` onto ``vᵀz <= 0``; on the line ``vᵀz = 0``
both pieces agree.  ``I - 2vvᵀ = [[cos θ, sin θ], [sin θ, -cos θ]]``.  Initialisation
``θ = π/2`` (as in the paper's code) gives ``f(x, y) = (min(x, y), max(x, y))``: MaxMin with
the two outputs swapped.

**Order 2** (``hh2``), angles ``θ0, θ1, θ2`` per pair (``θ1, θ2`` clamped to ``[0, 2π]``).
With ``u = (atan2(y, x) - θ0/2) mod 2π`` the plane is cut into four sectors at
``u = 0 ≤ a1 = θ1/2 ≤ a2 = (θ1 + θ2)/2 ≤ a3 = π + θ2/2 ≤ 2π``::

    sector [0, a1):    identity
    sector [a1, a2):   reflection   [[cos(θ0+θ1), sin(θ0+θ1)], [sin(θ0+θ1), -cos(θ0+θ1)]]
    sector [a2, a3):   rotation by -θ2   [[cos θ2, sin θ2], [-sin θ2, cos θ2]]
    sector [a3, 2π]:   reflection   [[cos θ0, sin θ0], [sin θ0, -cos θ0]]

In the angle ``u`` the pieces are ``u``, ``2a1 - u``, ``u - θ2`` and ``-u``; they agree at
``a1`` (``a1``), at ``a2`` (``2a1 - a2``) and at ``a3`` (``a3 - θ2 = π + ... ≡ -a3`` since
``2a3 = 2π + θ2`` and ``2a1 - 2a2 = -θ2``), and at ``u = 0 ≡ 2π`` (``0``): the map is
continuous.  With ``θ2 = 0`` it is order 1 with ``θ = θ0``.  Initialisation as in the paper's
code: every angle uniform in ``[0, π)`` (torch's global generator, i.e. ``--seed``).

Floating point: the sector (or the side of the line) is decided on the computed angle; a
point within rounding distance of a boundary may take the neighbouring piece, which by
continuity changes the output by at most a few ulps of ``||(x, y)||``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: the orders implemented (``order`` parameter)
ORDERS = (1, 2)
_TWO_PI = 2.0 * math.pi


def _pairs(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    channels = z.shape[1]
    if z.dim() < 2 or channels % 2:
        raise ValueError(f"HouseHolder activations need an even number of channels, got {channels}")
    half = channels // 2
    return z[:, :half], z[:, half:]


def _per_pair(value: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``(C/2,)`` per-pair values as ``(1, C/2, 1, ..., 1)``, broadcasting over ``z``."""
    return value.view(1, -1, *([1] * (z.dim() - 2)))


def order1_constants(theta: torch.Tensor) -> dict[str, torch.Tensor]:
    """``sin, cos`` of ``θ/2`` per pair (``v = (s, -c)``): all that order 1 needs of ``θ``."""
    half_angle = 0.5 * theta
    return {"s": torch.sin(half_angle), "c": torch.cos(half_angle)}


def apply_order1(z: torch.Tensor, k: dict[str, torch.Tensor]) -> torch.Tensor:
    """``z - 2 max(0, vᵀz) v`` per channel pair with the constants of :func:`order1_constants`."""
    x, y = _pairs(z)
    s, c = _per_pair(k["s"], z), _per_pair(k["c"], z)
    fold = 2.0 * torch.relu(x * s - y * c)  # 2 max(0, vᵀz), v = (s, -c)
    return torch.cat((x - fold * s, y + fold * c), dim=1)


def householder_order1(z: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Order-1 HouseHolder activation ``z - 2 max(0, vᵀz) v`` per channel pair (module doc)."""
    return apply_order1(z, order1_constants(theta.to(z.dtype)))


def order2_constants(
    theta0: torch.Tensor, theta1: torch.Tensor, theta2: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per pair: the sector limits (in ``u``) and the matrices' cosines and sines, all that
    order 2 needs of the angles (``θ1, θ2`` clamped to ``[0, 2π]``)."""
    t0 = theta0
    t1 = theta1.clamp(0.0, _TWO_PI)
    t2 = theta2.clamp(0.0, _TWO_PI)
    return {
        "offset": 0.5 * t0,  # u = (atan2(y, x) - θ0/2) mod 2π
        "limit1": 0.5 * t1,
        "limit2": 0.5 * (t1 + t2),
        "limit3": math.pi + 0.5 * t2,
        # sector 1: reflection at angle θ0 + θ1
        "c1": torch.cos(t0 + t1), "s1": torch.sin(t0 + t1),
        # sector 2: rotation by -θ2
        "c2": torch.cos(t2), "s2": torch.sin(t2),
        # sector 3: reflection at angle θ0
        "c3": torch.cos(t0), "s3": torch.sin(t0),
    }


def apply_order2(z: torch.Tensor, k: dict[str, torch.Tensor]) -> torch.Tensor:
    """Order 2 with the constants of :func:`order2_constants`: four sectors per pair."""
    x, y = _pairs(z)
    k = {name: _per_pair(value, z) for name, value in k.items()}
    with torch.no_grad():  # the sector choice is piecewise constant: no gradient
        u = torch.remainder(torch.atan2(y, x) - k["offset"], _TWO_PI)
        sector = (
            (u >= k["limit1"]).to(torch.uint8)
            + (u >= k["limit2"]).to(torch.uint8)
            + (u >= k["limit3"]).to(torch.uint8)
        )
    c1, s1, c2, s2, c3, s3 = (k[name] for name in ("c1", "s1", "c2", "s2", "c3", "s3"))
    a = torch.where(
        sector == 0, x,
        torch.where(sector == 1, x * c1 + y * s1, torch.where(sector == 2, x * c2 + y * s2, x * c3 + y * s3)),
    )
    b = torch.where(
        sector == 0, y,
        torch.where(sector == 1, x * s1 - y * c1, torch.where(sector == 2, y * c2 - x * s2, x * s3 - y * c3)),
    )
    return torch.cat((a, b), dim=1)


def householder_order2(
    z: torch.Tensor, theta0: torch.Tensor, theta1: torch.Tensor, theta2: torch.Tensor
) -> torch.Tensor:
    """Order-2 HouseHolder activation: four sectors per channel pair (module doc)."""
    return apply_order2(z, order2_constants(*(t.to(z.dtype) for t in (theta0, theta1, theta2))))


class HouseHolder(nn.Module):
    """HouseHolder activation of order 1 or 2 on ``channels`` channels (module docstring).

    Parameters (one entry per channel pair, shape ``(channels/2,)``): ``theta`` (order 1) or
    ``theta0``, ``theta1``, ``theta2`` (order 2).  They are 1-D, so lipcli's trainer applies
    no weight decay to them (they are also listed in ``no_weight_decay``).
    """

    def __init__(self, channels: int, order: int = 1) -> None:
        super().__init__()
        if channels < 2 or channels % 2:
            raise ValueError(f"HouseHolder needs a positive even number of channels, got {channels}")
        if order not in ORDERS:
            raise ValueError(f"HouseHolder order must be one of {ORDERS}, got {order}")
        self.channels = channels
        self.order = order
        half = channels // 2
        if order == 1:
            self.theta = nn.Parameter(torch.full((half,), 0.5 * math.pi))
            self.no_weight_decay: tuple[str, ...] = ("theta",)
        else:
            self.theta0 = nn.Parameter(math.pi * torch.rand(half))
            self.theta1 = nn.Parameter(math.pi * torch.rand(half))
            self.theta2 = nn.Parameter(math.pi * torch.rand(half))
            self.no_weight_decay = ("theta0", "theta1", "theta2")

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.shape[1] != self.channels:
            raise ValueError(f"HouseHolder built for {self.channels} channels got {z.shape[1]}")
        if self.order == 1:
            return householder_order1(z, self.theta)
        return householder_order2(z, self.theta0, self.theta1, self.theta2)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, order={self.order}"

    def export_module(self) -> nn.Module:
        """``lip export`` (:mod:`lipcli.sdk.export`): the per-pair constants (sines,
        cosines, sector limits) computed once from the current angles, applied by the same
        plain torch code as the forward pass."""
        with torch.no_grad():
            if self.order == 1:
                constants = order1_constants(self.theta)
            else:
                constants = order2_constants(self.theta0, self.theta1, self.theta2)
        return ExportedHouseHolder(self.order, constants)


class ExportedHouseHolder(nn.Module):
    """A HouseHolder activation with its per-pair constants stored as buffers (what
    ``lip export`` writes; same values as :class:`HouseHolder`)."""

    def __init__(self, order: int, constants: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.order = int(order)
        self.names = tuple(constants)
        for name, value in constants.items():
            self.register_buffer(name, value.detach().clone().contiguous())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        constants = {name: getattr(self, name) for name in self.names}
        return apply_order1(z, constants) if self.order == 1 else apply_order2(z, constants)

    def extra_repr(self) -> str:
        return f"channels={2 * getattr(self, self.names[0]).numel()}, order={self.order}"
