"""LipNeXt's layers on dense float64 Jacobians of tiny inputs: the shift is a permutation,
β-Abs and L2 pooling are 1-Lipschitz (L2 pooling also at 0), a block is orthogonal and its
bound, computed from the stored matrices, covers its Jacobian also off the manifold."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.functional import jacobian

import lipcli.testing as checks
from lipcli.sdk.orthogonal import orthogonal_parameters
from lipcli_lipnext.export import ExportedBlock, ExportedStem
from lipcli_lipnext.fastexp import polar
from lipcli_lipnext.layers import BetaAbs, Block, L2Pool, Stem, spatial_shift

D = torch.float64


def dense(f, x):
    y = f(x)
    return jacobian(f, x).reshape(y.numel(), x.numel())


def spectral(J):
    return float(torch.linalg.matrix_norm(J, ord=2))


def test_spatial_shift_is_a_circular_permutation_with_five_groups():
    x = torch.randn(1, 3, 4, 10, dtype=D)
    J = dense(lambda t: spatial_shift(t, 2), x)
    assert torch.equal(J.abs().sum(0), torch.ones(J.shape[1], dtype=D))  # one 1 per column...
    assert torch.equal(J.sum(1), torch.ones(J.shape[0], dtype=D))  # ...and per row
    y = spatial_shift(x, 2)
    assert torch.equal(y[0, :, :, 0:2], torch.roll(x[0, :, :, 0:2], -1, 0))  # up, wrapping
    assert torch.equal(y[0, :, :, 6:8], torch.roll(x[0, :, :, 6:8], 1, 1))  # right
    assert torch.equal(y[..., 8:], x[..., 8:])  # the fifth group stays


def test_beta_abs_is_one_lipschitz_and_keeps_norms():
    act = BetaAbs(6, 0.5)
    assert act.k == 3
    x = torch.randn(2, 2, 2, 6, dtype=D)
    assert torch.allclose(torch.linalg.vector_norm(act(x)), torch.linalg.vector_norm(x))
    J = dense(act, x[:1])
    assert torch.equal(J.abs(), torch.eye(J.shape[0], dtype=D))  # diag(±1)
    checks.check_one_lipschitz(act, (2, 2, 6))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_l2_pool_is_one_lipschitz_also_at_zero(eps):
    pool = L2Pool(eps)
    x = torch.randn(1, 3, 3, 4, dtype=D)
    x[..., 1] = 0.0  # a channel whose square root is taken at 0
    J = dense(pool, x)
    assert torch.isfinite(J).all() and spectral(J) <= 1 + 1e-12
    assert spectral(dense(pool, torch.zeros(1, 3, 3, 4, dtype=D))) <= 1 + 1e-12
    if eps == 0:
        assert torch.allclose(torch.linalg.vector_norm(pool(x)), torch.linalg.vector_norm(x))
    checks.check_one_lipschitz(pool, (3, 3, 4))


def _block64(width=6, grid=(3, 3), seed=0):
    torch.manual_seed(seed)
    block = Block(width, grid, 1 / 6).double()
    with torch.no_grad():
        block.pos.normal_()
        block.bias.normal_()
        block.R.copy_(polar(block.R))
        block.M.copy_(polar(block.M))
    return block


def test_block_is_orthogonal_and_declares_its_matrices():
    block = _block64()
    assert [p.name for p in orthogonal_parameters(block)] == ["R", "M"]
    J = dense(block, torch.randn(1, 3, 3, 6, dtype=D))
    s = torch.linalg.svdvals(J)
    assert float((s - 1).abs().max()) < 1e-12
    assert 1.0 <= block.lipschitz_upper_bound() < 1 + 1e-9


@pytest.mark.parametrize("scale", [1.001, 1.1])
def test_block_bound_is_computed_from_the_stored_matrices(scale):
    block = _block64(seed=1)
    with torch.no_grad():
        block.R.mul_(scale)
        block.M.add_(0.01 * torch.randn_like(block.M))
    J = dense(block, torch.randn(1, 3, 3, 6, dtype=D))
    bound = block.lipschitz_upper_bound()
    assert bound >= spectral(J) > scale ** 2 * 0.99  # not assumed 1


@pytest.mark.parametrize("in_channels,patch,width", [(3, 2, 16), (3, 2, 8)])
def test_stem_bound_covers_its_jacobian_tall_and_wide(in_channels, patch, width):
    stem = Stem(in_channels, width, patch).double()
    assert stem.tall == (in_channels * patch * patch <= width)
    with torch.no_grad():
        stem.weight.add_(0.01 * torch.randn_like(stem.weight))
    J = dense(stem, torch.randn(1, in_channels, 4, 4, dtype=D))
    assert stem.lipschitz_upper_bound() >= spectral(J)


def test_export_stand_ins_are_baked_plain_modules():
    block = _block64(seed=2)
    x = torch.randn(2, 3, 3, 6, dtype=D)
    checks.check_export_module(block, ExportedBlock, x)
    checks.check_export_follows(block, lambda: block.M.mul_(2.0), x)
    stem = Stem(3, 8, 2).double()
    checks.check_export_module(stem, ExportedStem, torch.randn(2, 3, 4, 4, dtype=D))
