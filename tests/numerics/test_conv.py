"""Convolution reshapes and the guaranteed conv operator-norm bound (lipcli.numerics.conv):
the matrix-free products match the materialised reshapes, and the bound dominates the dense
operator norm of the zero-padded convolution and is tight to the best reshape."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lipcli.numerics.conv import (
    conv_reshape,
    conv_reshape_matvec,
    conv_reshape_rmatvec,
    conv_reshape_shape,
    conv_spectral_norm_upper_bound,
)

RTOL = 1e-3


def exact_norm(M: torch.Tensor) -> float:
    """‖M‖₂ in float64 (SVD)."""
    return float(torch.linalg.matrix_norm(M.double(), 2))


def dense_conv_operator(kernel: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """Matrix of x ↦ conv2d(x, kernel, padding=k//2) on (in, H, W) inputs."""
    o, i, kh, _ = kernel.shape
    n = i * H * W
    basis = torch.eye(n, dtype=kernel.dtype).view(n, i, H, W)
    return F.conv2d(basis, kernel, padding=kh // 2).reshape(n, -1).T


def test_conv_reshape_matvecs_match_materialised():
    gen = torch.Generator().manual_seed(6)
    K = torch.randn(5, 3, 3, 3, generator=gen, dtype=torch.float64)
    for r in range(4):
        M = conv_reshape(K, r)
        assert tuple(M.shape) == conv_reshape_shape(K.shape, r)
        v = torch.randn(M.shape[1], generator=gen, dtype=torch.float64)
        u = torch.randn(M.shape[0], generator=gen, dtype=torch.float64)
        torch.testing.assert_close(conv_reshape_matvec(K, r, v), M @ v)
        torch.testing.assert_close(conv_reshape_rmatvec(K, r, u), M.T @ u)
    # the four reshapes are the ones of SPEC §1.2
    assert torch.equal(conv_reshape(K, 0)[1 * 3 + 2, 0 * 3 + 1], K[1, 0, 2, 1])  # (o,a)x(i,b)
    assert torch.equal(conv_reshape(K, 1)[1 * 3 + 2, 0 * 3 + 1], K[1, 0, 1, 2])  # (o,b)x(i,a)
    assert torch.equal(conv_reshape(K, 2)[1, 2 * 9 + 1 * 3 + 0], K[1, 2, 1, 0])  # o x (i,a,b)
    assert torch.equal(conv_reshape(K, 3)[4 * 9 + 2 * 3 + 1, 2], K[4, 2, 2, 1])  # (o,a,b) x i


@pytest.mark.parametrize("shape", [(6, 6, 3, 3), (4, 7, 3, 3), (8, 8, 1, 1), (3, 5, 5, 5)])
def test_conv_bound_dominates_dense_operator_norm(shape):
    gen = torch.Generator().manual_seed(7)
    K = torch.randn(shape, generator=gen, dtype=torch.float64)
    bound = conv_spectral_norm_upper_bound(K, rtol=RTOL)
    dense = exact_norm(dense_conv_operator(K, 7, 7))
    assert bound >= dense
    kh, kw = shape[2:]
    best_exact = math.sqrt(kh * kw) * min(exact_norm(conv_reshape(K, r)) for r in range(4))
    assert best_exact <= bound <= best_exact * (1 + 3 * RTOL)


def test_conv_bound_with_start_vectors_float32():
    gen = torch.Generator().manual_seed(8)
    K = torch.randn(16, 16, 3, 3, generator=gen)
    starts = [torch.randn(conv_reshape_shape(K.shape, r)[1], generator=gen) for r in range(4)]
    bound = conv_spectral_norm_upper_bound(K, start_vectors=starts)
    best_exact = 3 * min(exact_norm(conv_reshape(K.double(), r)) for r in range(4))
    assert best_exact <= bound <= best_exact * (1 + 3 * RTOL)


def test_conv_bound_skew_and_invalid():
    gen = torch.Generator().manual_seed(9)
    A = torch.randn(6, 6, 3, 3, generator=gen, dtype=torch.float64)
    S = A - A.transpose(0, 1).flip(2, 3)  # T(S) = -S exactly
    bound = conv_spectral_norm_upper_bound(S, skew=True)
    best_exact = 3 * min(exact_norm(conv_reshape(S, r)) for r in range(4))
    assert best_exact <= bound <= best_exact * (1 + 3 * RTOL)
    with pytest.raises(ValueError):
        conv_spectral_norm_upper_bound(A, skew=True)
    with pytest.raises(ValueError):
        conv_spectral_norm_upper_bound(torch.ones(3, 3))
    with pytest.raises(ValueError):
        conv_reshape(A, 4)
