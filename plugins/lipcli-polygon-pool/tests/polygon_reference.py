"""Brute-force float64 numpy reference for the signed distance to a polygon.

Independent of the plugin's algorithm: exact point-segment distances over *all* edges and
an even-odd crossing-number point-in-polygon test (no star-shape assumption, no sectors).
"""

from __future__ import annotations

import numpy as np


def segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact distance from points ``p`` (M, 2) to the segment ``[a, b]``."""
    e = b - a
    t = np.clip(((p - a) @ e) / (e @ e), 0.0, 1.0)
    foot = a + t[:, None] * e
    return np.hypot(*(p - foot).T)


def inside_crossing_number(p: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Even-odd rule: a ray towards +x crosses the boundary an odd number of times."""
    inside = np.zeros(len(p), dtype=bool)
    n = len(poly)
    for i in range(n):
        a, b = poly[i], poly[(i + 1) % n]
        straddles = (a[1] > p[:, 1]) != (b[1] > p[:, 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            x_cross = a[0] + (p[:, 1] - a[1]) * (b[0] - a[0]) / (b[1] - a[1])
        inside ^= straddles & (p[:, 0] < x_cross)
    return inside


def signed_distance(p: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Signed distance of points ``p`` (M, 2) to the closed polygon ``poly`` (n, 2)."""
    n = len(poly)
    dist = np.min([segment_distance(p, poly[i], poly[(i + 1) % n]) for i in range(n)], axis=0)
    return np.where(inside_crossing_number(p, poly), -dist, dist)


def dense_boundary(poly: np.ndarray, per_edge: int) -> np.ndarray:
    """``per_edge`` evenly spaced samples on every edge (start vertex included)."""
    n = len(poly)
    t = np.arange(per_edge)[:, None] / per_edge
    return np.concatenate([poly[i] + t * (poly[(i + 1) % n] - poly[i]) for i in range(n)])


def segments_intersect(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> bool:
    """Proper or touching intersection of the closed segments ``[a, b]`` and ``[c, d]``."""

    def orient(p, q, r):
        return np.sign((q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0]))

    def on_segment(p, q, r):
        return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(p[1], q[1])

    o1, o2, o3, o4 = orient(a, b, c), orient(a, b, d), orient(c, d, a), orient(c, d, b)
    if o1 != o2 and o3 != o4:
        return True
    return bool(
        (o1 == 0 and on_segment(a, b, c)) or (o2 == 0 and on_segment(a, b, d))
        or (o3 == 0 and on_segment(c, d, a)) or (o4 == 0 and on_segment(c, d, b))
    )
