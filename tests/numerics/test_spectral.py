"""Guaranteed spectral-norm bounds (lipcli.numerics.spectral): never below the exact value (SVD /
eigvalsh in float64), and within the promised tightness."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lipcli.numerics import spectral
from lipcli.numerics.spectral import (
    conv_reshape,
    conv_reshape_matvec,
    conv_reshape_rmatvec,
    conv_reshape_shape,
    conv_spectral_norm_upper_bound,
    psd_lambda_max_upper_bound,
    spectral_norm_upper_bound,
    symmetric_lambda_max_upper_bound,
)

RTOL = 1e-3


def exact_norm(M: torch.Tensor) -> float:
    """‖M‖₂ in float64 via the eigenvalues of the smaller Gram matrix of M/max|M|
    (relative error ~1e-15, far below the margins tested here)."""
    M = M.double()
    s = float(M.abs().max())
    if s == 0.0:
        return 0.0
    M = M / s
    G = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    return s * math.sqrt(float(torch.linalg.eigvalsh(G)[-1]))


@pytest.mark.parametrize("shape", [(40, 70), (70, 40), (1, 9), (9, 1), (128, 128), (3, 3)])
@pytest.mark.parametrize("scale", [1.0, 1e-150, 1e150])
def test_spectral_norm_bound_sound_and_tight(shape, scale):
    gen = torch.Generator().manual_seed(1)
    M = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    true = exact_norm(M)
    bound = spectral_norm_upper_bound(M, rtol=RTOL)
    assert bound >= true
    assert bound <= true * (1 + 3 * RTOL)


def test_spectral_norm_bound_float32_input_and_structured_spectra():
    gen = torch.Generator().manual_seed(2)
    Q1, _ = torch.linalg.qr(torch.randn(60, 60, generator=gen, dtype=torch.float64))
    Q2, _ = torch.linalg.qr(torch.randn(60, 60, generator=gen, dtype=torch.float64))
    # clustered top singular values, a rank-deficient and an exactly orthogonal matrix
    for sv in (
        torch.cat([torch.full((5,), 2.0), torch.linspace(1.99, 0.1, 55)]),
        torch.cat([torch.tensor([3.0, 3.0 - 1e-9]), torch.zeros(58)]),
        torch.ones(60),
    ):
        M = (Q1 * sv) @ Q2.T
        assert spectral_norm_upper_bound(M) >= exact_norm(M)
        assert spectral_norm_upper_bound(M) <= exact_norm(M) * (1 + 3 * RTOL)
    M32 = torch.randn(50, 30, generator=gen)
    assert spectral_norm_upper_bound(M32) >= exact_norm(M32)


def test_blocked_gram_path_large_matrix():
    """p ≥ 512 takes the lower-block Gram product; still sound and tight."""
    gen = torch.Generator().manual_seed(11)
    for shape in ((600, 700), (700, 600)):
        M = torch.randn(shape, generator=gen, dtype=torch.float64)
        true = exact_norm(M)
        bound = spectral_norm_upper_bound(M, rtol=RTOL)
        assert true <= bound <= true * (1 + 3 * RTOL)
    G = spectral._gram_lower(M.T)
    full = M.T @ M
    assert torch.allclose(torch.tril(G), torch.tril(full), rtol=1e-12, atol=1e-9)


def test_zero_and_invalid_matrices():
    assert spectral_norm_upper_bound(torch.zeros(5, 7)) == 0.0
    assert psd_lambda_max_upper_bound(torch.zeros(4, 4)) == 0.0
    with pytest.raises(ValueError):
        spectral_norm_upper_bound(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError):
        spectral_norm_upper_bound(torch.ones(2, 2, 2))
    with pytest.raises(ValueError):
        psd_lambda_max_upper_bound(torch.ones(2, 3))


def test_bad_start_vector_still_sound():
    """Lanczos started orthogonally to the top eigenvector sees only the rest of the
    spectrum; the certificate must fail for low candidates and retry upwards."""
    M = torch.diag(torch.tensor([10.0, 1.0, 1.0, 0.5], dtype=torch.float64))
    start = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    bound = spectral_norm_upper_bound(M, start=start)
    assert bound >= 10.0


def test_frobenius_fallback(monkeypatch):
    monkeypatch.setattr(spectral, "_MAX_CERT_ATTEMPTS", 0)
    M = torch.randn(20, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    bound = spectral_norm_upper_bound(M)
    assert bound >= float(torch.linalg.matrix_norm(M, "fro"))
    assert bound <= float(torch.linalg.matrix_norm(M, "fro")) * (1 + 1e-9)


def test_psd_lambda_max_bound():
    gen = torch.Generator().manual_seed(4)
    W = torch.randn(300, 80, generator=gen, dtype=torch.float64)
    d = torch.rand(300, generator=gen, dtype=torch.float64)
    B = W.T @ (d[:, None] * W)
    true = float(torch.linalg.eigvalsh(B)[-1])
    bound = psd_lambda_max_upper_bound(B)
    assert true <= bound <= true * (1 + 2 * RTOL)
    assert isinstance(bound, float)


def test_symmetric_bound_indefinite_and_nonsymmetric():
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(50, 50, generator=gen, dtype=torch.float64)
    for B in (X + X.T, -(X @ X.T) - torch.eye(50, dtype=torch.float64), X):
        sym = 0.5 * (B + B.T)
        true = float(torch.linalg.eigvalsh(sym)[-1])
        bound = symmetric_lambda_max_upper_bound(B)
        assert bound >= true
        assert bound <= true + 2 * RTOL * float(torch.linalg.matrix_norm(sym, 2))


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
