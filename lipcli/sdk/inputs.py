"""What architectures share about their inputs: the input-size rule and the input normalisation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def doublings(image_size: Sequence[int], base: int, network: str) -> int:
    """``k`` for a square ``base · 2^k`` input (``base``: the smallest size ``network`` takes);
    ``ValueError`` naming ``network`` for any other size."""
    h, w = (int(v) for v in image_size)
    k = (h // base).bit_length() - 1
    if h != w or h < base or h != base << k:
        raise ValueError(f"{network} needs square inputs of {base}·2^k pixels "
                         f"({base}, {2 * base}, {4 * base}, ...); got {h}x{w}")
    return k


class Normalize(nn.Module):
    """Input normalisation ``(x - mean) / std`` per channel (SPEC §2), Lipschitz ``1/min(std)``.

    ``mean`` and ``std`` are buffers of shape ``(C,)`` (saved with the model).
    """

    lip_promises: tuple[str, ...] = ()

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(tuple(mean), dtype=torch.get_default_dtype()).flatten()
        std_t = torch.as_tensor(tuple(std), dtype=torch.get_default_dtype()).flatten()
        if mean_t.numel() != std_t.numel():
            raise ValueError(f"mean has {mean_t.numel()} entries but std has {std_t.numel()}")
        if not bool((std_t > 0).all()):
            raise ValueError(f"std must be positive, got {tuple(std_t.tolist())}")
        self.register_buffer("mean", mean_t)
        self.register_buffer("std", std_t)

    def _view(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return t.to(dtype=x.dtype).view(1, -1, *([1] * (x.dim() - 2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self._view(self.mean, x)) / self._view(self.std, x)

    def lipschitz_upper_bound(self) -> float:
        """``1 / min(std)``: the l2 operator norm of the diagonal map ``x -> x / std``."""
        return 1.0 / float(self.std.detach().double().min())

    def extra_repr(self) -> str:
        return f"mean={tuple(self.mean.tolist())}, std={tuple(self.std.tolist())}"

    def export_module(self) -> nn.Module:
        """``lip export``: the forward is plain torch operations already."""
        return self
