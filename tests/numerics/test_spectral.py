"""Guaranteed spectral-norm and weighted-Gram bounds (lipcli.numerics.spectral): never below
the exact value (SVD / eigvalsh in float64, exact rational arithmetic for the Gram rounding),
and within the promised tightness."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from lipcli.numerics import eigen, spectral
from lipcli.numerics.spectral import (
    spectral_norm_upper_bound,
    weighted_gram,
    weighted_gram_lambda_max_upper_bound,
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
@pytest.mark.parametrize("scale", [1.0, 1e-150, 1e150, 2.0**-600, 2.0**-1000])
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
    G = spectral.gram_lower(M.T)
    full = M.T @ M
    assert torch.allclose(torch.tril(G), torch.tril(full), rtol=1e-12, atol=1e-9)


def test_zero_and_invalid_matrices():
    assert spectral_norm_upper_bound(torch.zeros(5, 7)) == 0.0
    with pytest.raises(ValueError):
        spectral_norm_upper_bound(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError):
        spectral_norm_upper_bound(torch.ones(2, 2, 2))


def test_bad_start_vector_still_sound():
    """Lanczos started orthogonally to the top eigenvector sees only the rest of the
    spectrum; the certificate must fail for low candidates and retry upwards."""
    M = torch.diag(torch.tensor([10.0, 1.0, 1.0, 0.5], dtype=torch.float64))
    start = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    bound = spectral_norm_upper_bound(M, start=start)
    assert bound >= 10.0


def test_frobenius_fallback(monkeypatch):
    monkeypatch.setattr(eigen, "MAX_CERT_ATTEMPTS", 0)
    M = torch.randn(20, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    bound = spectral_norm_upper_bound(M)
    assert bound >= float(torch.linalg.matrix_norm(M, "fro"))
    assert bound <= float(torch.linalg.matrix_norm(M, "fro")) * (1 + 1e-9)


def test_weighted_gram_error_bound_covers_rounding():
    """‖Ĝ − Rᵀdiag(w)R‖_F (exact rational reference) <= the returned bound, which is not
    vacuous; rows of very different magnitudes so that the rounding is real."""
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    rows = rows * torch.logspace(-3, 3, 30, dtype=torch.float64).unsqueeze(1)
    wts = (torch.rand(30, generator=gen, dtype=torch.float64) - 0.3).clamp_min(0)
    gram, err = weighted_gram(rows, wts)
    R = [[Fraction(float(x)) for x in r] for r in rows.tolist()]
    W = [Fraction(float(x)) for x in wts.tolist()]
    diff_sq = 0.0
    for i in range(5):
        for j in range(5):
            exact = sum(W[k] * R[k][i] * R[k][j] for k in range(30))
            diff_sq += float(Fraction(float(gram[i, j])) - exact) ** 2
    assert diff_sq > 0.0  # rounding happened
    exact_top = float(torch.linalg.eigvalsh((rows.T * wts) @ rows)[-1])
    assert math.sqrt(diff_sq) <= err < 1e-10 * exact_top


@pytest.mark.parametrize("k", [0, -1000, -1060, 800])
def test_weighted_gram_bound_tiny_and_huge_rows(k):
    """Rows scaled (exactly) by 2^(k/2): λ_max scales by 2ᵏ exactly.  At k = -1060 the
    products are subnormal; the bound must still cover the rounded Gram (underflow term)."""
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(40, 6, generator=gen, dtype=torch.float64)
    wts = torch.rand(40, generator=gen, dtype=torch.float64)
    true = float(torch.linalg.eigvalsh((rows.T * wts) @ rows)[-1])
    bound = weighted_gram_lambda_max_upper_bound(rows * 2.0 ** (k // 2), wts)
    assert math.ldexp(bound, -k) >= true
    if k >= -1000:  # normal range: tight
        assert math.ldexp(bound, -k) <= true * (1 + 1e-5)


def test_weighted_gram_bound_is_exact_zero_without_weights():
    rows = torch.randn(5, 3, dtype=torch.float64)
    assert weighted_gram_lambda_max_upper_bound(rows, torch.zeros(5, dtype=torch.float64)) == 0.0
