"""Polygon projection pooling: signed l2 distance of channel pairs to a learnable polygon.

This is the open direction of the paper's §6 ("Projection pooling layers"): a 2-D
projection pool whose manifold is a *closed piecewise-linear curve* instead of the
two-ray cone of the built-in ``projection`` pool.  Each output channel ``k`` owns a simple
closed polygon ``P_k`` and maps the channel pair ``(x, y) = (z[:, k], z[:, k + C/2])`` to

    d_k(x, y) = +dist((x, y), ∂P_k)   if (x, y) is outside P_k,
                -dist((x, y), ∂P_k)   if (x, y) is inside P_k,

the signed l2 distance to the boundary ``∂P_k``.

Why it is 1-Lipschitz
---------------------
Theorem 2 of the paper: the distance to any set ``M`` is 1-Lipschitz (triangle inequality).
Corollary 1: if ``M`` separates the plane into two sets ``A`` (outside) and ``B`` (inside)
such that every path from ``A`` to ``B`` meets ``M``, the signed distance (``+`` on ``A``,
``-`` on ``B``) is still 1-Lipschitz: for ``a ∈ A``, ``b ∈ B`` the segment ``[a, b]``
meets ``M`` at some ``p``, so ``|d(a) - d(b)| = |d(a)| + |d(b)| <= |a - p| + |p - b| = |a - b|``.
The boundary of a simple polygon is such a curve (Jordan curve theorem).  Output channel
``k`` depends only on its own pair, so for whole tensors
``||f(z) - f(z')||² = Σ_k |d_k(p_k) - d_k(p'_k)|² <= Σ_k ||p_k - p'_k||² <= ||z - z'||²``.

Parametrisation (always a simple polygon)
-----------------------------------------
``n`` vertices in polar form about a learnable centre ``c_k``:
``v_{k,i} = c_k + r_{k,i} (cos α_i, sin α_i)`` with *fixed* angles ``α_i = 2π i / n`` and
radii ``r_{k,i} = softplus(ρ_{k,i}) + r_min > 0``.  Because the angles increase and every
angular gap ``2π/n`` is below ``π`` (``n >= 3``), the polygon is star-shaped about ``c_k``:
the ray from ``c_k`` at angle ``φ`` meets the boundary exactly once, in the edge of the
sector ``α_i <= φ < α_{i+1}``.  Hence it is simple for *every* value of the parameters, so
no optimiser step can break the 1-Lipschitz guarantee.  ``r_min`` keeps edges away from
zero length (``|v_{i+1} - v_i| >= r_min sin(min(2π/n, π/2)) > 0``).

Computation (vectorised over batch x channels x pixels x segments)
-------------------------------------------------------------------
1. *Selection* (no autograd graph): for every point and every edge ``[a, b]`` compute the
   exact point-segment distance² ``|p - a - t e|²``, ``e = b - a``,
   ``t = clamp(<p - a, e>/|e|², 0, 1)``, and take the nearest edge (``argmin``).
2. *Inside test*, polar form (exact for star-shaped polygons): with ``q = p - c`` and
   ``s_i = cross(u_i, q)`` (``u_i`` the unit vector at ``α_i``), ``q`` lies in sector ``i``
   iff ``s_i >= 0 > s_{i+1}``; there ``p`` is inside iff it is strictly left of edge ``i``
   (the polygon is counter-clockwise).  The same computed ``s_i`` decides both neighbouring
   sectors, so every ``q != 0`` gets exactly one sector even under rounding; a point on
   the common ray of two sectors gets the same answer from both edges (they meet at the
   ray's vertex).  ``q = 0`` (the centre, always strictly inside) is inside.
   This is preferred over a crossing-number test: there is no ray-vertex degeneracy and
   no dependence on an arbitrary ray direction.
3. *Value* (with gradients), on the chosen edge only: if its projection is interior
   (``0 < t < 1``) the value is the signed distance to the edge's *line*
   ``(e_y (x - a_x) - e_x (y - a_y)) / |e|`` (positive on the right = outside), which is
   smooth across the boundary and has the unit normal as gradient even exactly on it;
   its sign is reconciled with the inside test (they agree mathematically: the open segment
   from ``p`` to its nearest boundary point does not cross the boundary).  Otherwise the
   nearest point is a vertex ``w`` and the value is ``±|p - w|`` with the inside test's
   sign, the root taken only of strictly positive numbers (gradient 0, a valid
   subgradient, exactly at a vertex), so no NaN reaches the backward pass.
Autograd memory is O(batch x channels x pixels), independent of the number of vertices.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: allowed number of polygon vertices (``Param vertices``)
MIN_VERTICES = 3
MAX_VERTICES = 16
#: every radius is ``softplus(rho) + MIN_RADIUS`` (keeps edges of positive length)
MIN_RADIUS = 1e-2
#: largest initial circumradius (features are normalised: a far larger polygon is a typo, and
#: its squared radii would leave float32)
MAX_RADIUS = 1e4
#: relative std of the multiplicative noise on the initial radii
INIT_NOISE = 0.05


def polygon_angles(vertices: int, *, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """The fixed vertex angles ``α_i = 2π i / n``, ``i = 0 … n-1`` (counter-clockwise)."""
    if not MIN_VERTICES <= vertices <= MAX_VERTICES:
        raise ValueError(
            f"a polygon needs {MIN_VERTICES} to {MAX_VERTICES} vertices, got {vertices}"
        )
    return torch.arange(vertices, dtype=dtype or torch.get_default_dtype(), device=device) * (
        2.0 * math.pi / vertices
    )


def star_polygon_vertices(
    radii: torch.Tensor, angles: torch.Tensor, center: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vertex coordinates ``v_{k,i} = c_k + r_{k,i} (cos α_i, sin α_i)``, each ``(K, n)``."""
    vx = center[:, :1] + radii * torch.cos(angles)
    vy = center[:, 1:2] + radii * torch.sin(angles)
    return vx, vy


def _nearest_edge_and_inside(
    x: torch.Tensor,
    y: torch.Tensor,
    vx: torch.Tensor,
    vy: torch.Tensor,
    angles: torch.Tensor,
    center: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of the nearest edge and the inside mask, both of the shape of ``x`` (no grad).

    Vectorised over a trailing segment axis of length ``n`` (steps 1 and 2 of the module
    docstring).
    """
    k, n = vx.shape
    extra = x.dim() - 2
    seg_shape = (1, k, *([1] * extra), n)
    ax, ay = vx.reshape(seg_shape), vy.reshape(seg_shape)
    ex = vx.roll(-1, dims=1).reshape(seg_shape) - ax
    ey = vy.roll(-1, dims=1).reshape(seg_shape) - ay
    px, py = x.unsqueeze(-1), y.unsqueeze(-1)
    dx, dy = px - ax, py - ay
    t = ((dx * ex + dy * ey) / (ex * ex + ey * ey)).clamp(0.0, 1.0)
    rx, ry = dx - t * ex, dy - t * ey
    nearest = (rx * rx + ry * ry).argmin(dim=-1)

    ch_shape = (1, k, *([1] * extra))
    qx = x - center[:, 0].reshape(ch_shape)
    qy = y - center[:, 1].reshape(ch_shape)
    # s_i = cross(u_i, q) = cos(α_i) q_y - sin(α_i) q_x
    s = qy.unsqueeze(-1) * torch.cos(angles) - qx.unsqueeze(-1) * torch.sin(angles)
    in_sector = (s >= 0) & (s.roll(-1, dims=-1) < 0)
    left_of_edge = (ex * dy - ey * dx) > 0
    inside = (in_sector & left_of_edge).any(dim=-1) | ((qx == 0) & (qy == 0))
    return nearest, inside


def _take_vertices(v: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``v[k, index[b, k, ...]]`` for per-channel vertex coordinates ``v`` of shape ``(K, n)``
    and an index of shape ``(N, K, *spatial)``.

    A ``gather`` along the vertex axis: the same values as advanced indexing, but its
    backward (one scatter-add per channel row) gives the same gradient on every run, where
    the backward of advanced indexing (``index_put_`` with accumulation) varies from run to
    run on multi-threaded CPUs.
    """
    k = v.shape[0]
    moved = index.transpose(0, 1)  # (K, N, *spatial)
    taken = torch.gather(v, 1, moved.reshape(k, -1))
    return taken.reshape(moved.shape).transpose(0, 1)


def _safe_norm(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``sqrt(u² + v²)`` whose gradient is finite everywhere (0 at the origin)."""
    sq = u * u + v * v
    positive = sq > 0
    root = torch.sqrt(torch.where(positive, sq, torch.ones_like(sq)))
    return torch.where(positive, root, torch.zeros_like(sq))


def star_polygon_signed_distance(
    x: torch.Tensor,
    y: torch.Tensor,
    radii: torch.Tensor,
    angles: torch.Tensor,
    center: torch.Tensor,
) -> torch.Tensor:
    """Signed l2 distance of the points ``(x, y)`` to star-shaped polygons (+ outside).

    Args:
        x, y: point coordinates, shape ``(N, K, *spatial)``.
        radii: ``(K, n)`` strictly positive vertex radii.
        angles: ``(n,)`` vertex angles, strictly increasing within one turn, every cyclic
            gap (including ``α_0 + 2π - α_{n-1}``) below ``π``; then polygon ``k`` with
            vertices ``c_k + r_{k,i}(cos α_i, sin α_i)`` is simple and star-shaped about
            ``c_k``.
        center: ``(K, 2)`` polygon centres.

    Returns:
        ``(N, K, *spatial)``: ``-dist`` inside, ``+dist`` outside (module docstring, steps
        1-3). 1-Lipschitz in ``(x, y)`` per channel (paper Theorem 2, Corollary 1).
    """
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dim() < 2:
        raise ValueError("points need shape (N, K, ...)")
    k, n = radii.shape
    if x.shape[1] != k:
        raise ValueError(f"points have {x.shape[1]} channels but there are {k} polygons")
    if angles.shape != (n,) or center.shape != (k, 2):
        raise ValueError("angles must be (n,) and center (K, 2) for radii (K, n)")
    dtype = x.dtype
    radii, angles, center = radii.to(dtype), angles.to(dtype), center.to(dtype)
    vx, vy = star_polygon_vertices(radii, angles, center)
    return polygon_signed_distance(x, y, vx, vy, angles, center)


def polygon_signed_distance(
    x: torch.Tensor,
    y: torch.Tensor,
    vx: torch.Tensor,
    vy: torch.Tensor,
    angles: torch.Tensor,
    center: torch.Tensor,
) -> torch.Tensor:
    """:func:`star_polygon_signed_distance` from the vertex coordinates ``vx, vy``
    ``(K, n)`` (:func:`star_polygon_vertices`), all in ``x``'s dtype (shapes not checked)."""
    n = vx.shape[1]
    with torch.no_grad():
        nearest, inside = _nearest_edge_and_inside(x, y, vx, vy, angles, center)

    following = (nearest + 1) % n
    ax, ay = _take_vertices(vx, nearest), _take_vertices(vy, nearest)
    bx, by = _take_vertices(vx, following), _take_vertices(vy, following)

    ex, ey = bx - ax, by - ay
    dx, dy = x - ax, y - ay
    ee = ex * ex + ey * ey
    t = (dx * ex + dy * ey) / ee
    interior = (t > 0) & (t < 1)
    sign = torch.where(inside, -torch.ones_like(x), torch.ones_like(x))

    # Edge branch: signed distance to the edge's line, + on the right (outside for CCW).
    line = (ey * dx - ex * dy) / torch.sqrt(ee)
    edge_value = torch.where(line * sign >= 0, line, -line)
    # Vertex branch: the nearest boundary point is the start (t <= 0) or end (t >= 1) vertex.
    before = t <= 0
    wx = torch.where(before, dx, x - bx)
    wy = torch.where(before, dy, y - by)
    vertex_value = sign * _safe_norm(wx, wy)
    return torch.where(interior, edge_value, vertex_value)


def inverse_softplus(value: torch.Tensor) -> torch.Tensor:
    """``ρ`` with ``softplus(ρ) = value`` (``value > 0``): ``log(expm1(value))``, stable."""
    return value + torch.log(-torch.expm1(-value))


class PolygonPool(nn.Module):
    """Channel-halving pool: signed distance of ``(z[:, :C/2], z[:, C/2:])`` to polygons.

    One learnable star-shaped ``vertices``-gon per output channel (see the module
    docstring for the maths).  Parameters (excluded from weight decay, SPEC §6 treats the
    projection pool's angle the same way):

    * ``rho`` ``(C/2, vertices)``: radii ``softplus(rho) + MIN_RADIUS``; initialised to a
      regular polygon of circumradius ``radius`` with ``INIT_NOISE`` relative noise;
    * ``center`` ``(C/2, 2)``: polygon centres, initialised at the origin (frozen when
      ``learn_center=False``; it stays in the state dict either way).

    Maps ``(N, C, *spatial)`` to ``(N, C/2, *spatial)`` and is 1-Lipschitz for every value
    of its parameters.
    """

    #: parameter names (as in ``named_parameters()``) that must not get weight decay
    no_weight_decay: tuple[str, ...] = ("rho", "center")

    def __init__(
        self, channels: int, vertices: int = 6, radius: float = 1.0, learn_center: bool = True
    ) -> None:
        super().__init__()
        if channels < 2 or channels % 2:
            raise ValueError(f"PolygonPool needs a positive even number of channels, got {channels}")
        polygon_angles(vertices)  # validates the vertex count
        if not math.isfinite(radius) or not MIN_RADIUS < radius <= MAX_RADIUS:
            raise ValueError(f"radius must be a finite number above {MIN_RADIUS} and at most "
                             f"{MAX_RADIUS:g}, got {radius}")
        self.channels = channels
        self.vertices = vertices
        self.radius = float(radius)
        self.rho = nn.Parameter(torch.empty(channels // 2, vertices))
        self.center = nn.Parameter(torch.zeros(channels // 2, 2), requires_grad=learn_center)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Regular ``radius``-gon about the origin with small multiplicative noise on radii."""
        with torch.no_grad():
            noise = torch.randn_like(self.rho).mul_(INIT_NOISE).exp_()
            radii = (self.radius * noise).clamp_min(2 * MIN_RADIUS)
            self.rho.copy_(inverse_softplus(radii - MIN_RADIUS))
            self.center.zero_()

    def radii(self) -> torch.Tensor:
        """Vertex radii ``softplus(rho) + MIN_RADIUS`` ``(C/2, vertices)``, always positive."""
        return F.softplus(self.rho) + MIN_RADIUS

    def angles(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The fixed vertex angles ``2π i / vertices``."""
        return polygon_angles(self.vertices, dtype=dtype or self.rho.dtype, device=self.rho.device)

    @torch.no_grad()
    def polygons(self) -> torch.Tensor:
        """Vertex coordinates ``(C/2, vertices, 2)``, counter-clockwise (for plots and tests)."""
        vx, vy = star_polygon_vertices(self.radii(), self.angles(), self.center)
        return torch.stack((vx, vy), dim=-1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z.shape[1]
        if c != self.channels:
            raise ValueError(f"PolygonPool built for {self.channels} channels, got {c}")
        half = c // 2
        x, y = z[:, :half], z[:, half:]
        return star_polygon_signed_distance(
            x, y, self.radii(), self.angles(z.dtype), self.center
        )

    def extra_repr(self) -> str:
        return f"channels={self.channels}, vertices={self.vertices}, radius={self.radius}"

    def export_module(self) -> nn.Module:
        """``lip export`` (:mod:`lipcli.sdk.export`): the vertices computed once from
        the current radii and centres, the distance by the same plain torch code as the
        forward pass."""
        with torch.no_grad():
            angles = self.angles()
            vx, vy = star_polygon_vertices(self.radii(), angles, self.center)
        return ExportedPolygonPool(vx, vy, angles, self.center)


class ExportedPolygonPool(nn.Module):
    """:class:`PolygonPool` with its vertices stored as buffers (what ``lip export`` writes;
    same values as the pool in its parameters' dtype)."""

    def __init__(self, vx: torch.Tensor, vy: torch.Tensor, angles: torch.Tensor,
                 center: torch.Tensor) -> None:
        super().__init__()
        for name, value in (("vx", vx), ("vy", vy), ("angles", angles), ("center", center)):
            self.register_buffer(name, value.detach().clone().contiguous())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        half = self.vx.shape[0]
        return polygon_signed_distance(z[:, :half], z[:, half:], self.vx, self.vy, self.angles,
                                       self.center)

    def extra_repr(self) -> str:
        return f"channels={2 * self.vx.shape[0]}, vertices={self.vx.shape[1]}"
