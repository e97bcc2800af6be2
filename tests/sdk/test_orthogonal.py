"""lipcli.sdk.orthogonal: declaring parameters orthogonal / Stiefel."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.sdk.orthogonal import declare_orthogonal, orthogonal_parameters, orthogonality_defect, random_orthogonal


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.R = nn.Parameter(random_orthogonal(3, 4, 4))
        self.S = nn.Parameter(random_orthogonal(2, 5))
        self.b = nn.Parameter(torch.zeros(4))
        declare_orthogonal(self, "R")
        declare_orthogonal(self, "S", "stiefel")


def test_declared_parameters_are_found_with_full_names_and_manifolds():
    model = nn.Sequential(nn.Linear(2, 2), Two())
    found = [(p.name, p.manifold, tuple(p.param.shape)) for p in orthogonal_parameters(model)]
    assert found == [("1.R", "orthogonal", (3, 4, 4)), ("1.S", "stiefel", (2, 5))]
    assert orthogonal_parameters(nn.Linear(2, 2)) == []


def test_random_orthogonal_is_row_orthonormal_and_shapes_are_checked():
    X = random_orthogonal(3, 7, generator=torch.Generator().manual_seed(0))
    assert orthogonality_defect(X) < 1e-6
    assert orthogonality_defect(X * 1.01) == pytest.approx(1.01 ** 2 - 1, rel=1e-4)
    m = nn.Module()
    m.W = nn.Parameter(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="square"):
        declare_orthogonal(m, "W")
    m.T = nn.Parameter(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="rows <= columns"):
        declare_orthogonal(m, "T", "stiefel")
    with pytest.raises(ValueError, match="no parameter"):
        declare_orthogonal(m, "missing")
    with pytest.raises(ValueError, match="manifold"):
        declare_orthogonal(m, "W", "sphere")
