"""Input-size rules that architectures share (torch-free)."""

from __future__ import annotations

from collections.abc import Sequence


def doublings(image_size: Sequence[int], base: int, network: str) -> int:
    """``k`` for a square ``base · 2^k`` input (``base``: the smallest size ``network`` takes);
    ``ValueError`` naming ``network`` for any other size."""
    h, w = (int(v) for v in image_size)
    k = (h // base).bit_length() - 1
    if h != w or h < base or h != base << k:
        raise ValueError(f"{network} needs square inputs of {base}·2^k pixels "
                         f"({base}, {2 * base}, {4 * base}, ...); got {h}x{w}")
    return k
