"""``lip export`` stand-ins of LipNeXt's parameterised layers: the same plain torch
operations with the parameters baked as buffers (the parameter-free ones are their own)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import spatial_shift


class ExportedStem(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor, patch: int, tall: bool) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone())
        self.register_buffer("bias", bias.detach().clone())
        self.patch, self.tall = patch, tall

    def forward(self, x: Tensor) -> Tensor:
        t = F.pixel_unshuffle(x, self.patch) if self.patch > 1 else x
        t = t.permute(0, 2, 3, 1)
        return (t @ self.weight if self.tall else t @ self.weight.mT) + self.bias


class ExportedBlock(nn.Module):
    def __init__(self, pos: Tensor, R: Tensor, M: Tensor, bias: Tensor, g: int) -> None:
        super().__init__()
        for name, value in (("pos", pos), ("R", R), ("M", M), ("bias", bias)):
            self.register_buffer(name, value.detach().clone())
        self.g = g

    def forward(self, x: Tensor) -> Tensor:
        y = (x + self.pos.unsqueeze(-1)) @ self.R.mT
        y = spatial_shift(y, self.g) @ self.R
        return y @ self.M.mT + self.bias


def export_stem(stem: nn.Module) -> nn.Module:
    return ExportedStem(stem.weight, stem.bias, stem.patch, stem.tall)


def export_block(block: nn.Module) -> nn.Module:
    with torch.no_grad():
        return ExportedBlock(block.pos, block.R, block.M, block.bias, block.g)
