"""lipcli.numerics.gram_bounds: verified norm bounds from Gram matrices are >= the true norms
(dense matrices of convolutions with zero and circular padding) and tight for isometries."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.numerics.gram_bounds import conv_gram_filter, conv_gram_norm_upper_bound, isometry_norm_upper_bound


def conv_matrix(kernel: torch.Tensor, size: int, circular: bool) -> torch.Tensor:
    o, i, k, _ = kernel.shape
    n = i * size * size
    basis = torch.eye(n, dtype=torch.float64).view(n, i, size, size)
    if circular:
        out = F.conv2d(F.pad(basis, (k // 2,) * 4, mode="circular"), kernel)
    else:
        out = F.conv2d(basis, kernel, padding=k // 2)
    return out.reshape(n, -1).T


def paraunitary_kernel(c: int, seed: int) -> torch.Tensor:
    """A 3x3 orthogonal (paraunitary) filter: H (P + (I-P) z1)(Q + (I-Q) z2), exact projectors."""
    gen = torch.Generator().manual_seed(seed)
    H = torch.linalg.qr(torch.randn(c, c, generator=gen, dtype=torch.float64))[0]
    K = H.view(c, c, 1, 1)
    for axis in (3, 2, 3, 2):
        V = torch.linalg.qr(torch.randn(c, c // 2, generator=gen, dtype=torch.float64))[0]
        P = V @ V.T
        a = torch.einsum("oiab,ij->ojab", K, P)
        b = K - a
        pad_a = (0, 1, 0, 0) if axis == 3 else (0, 0, 0, 1)
        pad_b = (1, 0, 0, 0) if axis == 3 else (0, 0, 1, 0)
        K = F.pad(a, pad_a) + F.pad(b, pad_b)
    return K[:, :, :3, :3] if K.shape[-1] > 3 else K


def test_gram_filter_matches_the_definition():
    gen = torch.Generator().manual_seed(0)
    K = torch.randn(3, 2, 3, 3, generator=gen, dtype=torch.float64)
    G = conv_gram_filter(K)
    for i in range(2):
        for j in range(2):
            for dy in range(-2, 3):
                for dx in range(-2, 3):
                    s = sum(float(K[o, i, a, b] * K[o, j, a + dy, b + dx]) for o in range(3)
                            for a in range(3) for b in range(3) if 0 <= a + dy < 3 and 0 <= b + dx < 3)
                    assert abs(float(G[i, j, dy + 2, dx + 2]) - s) < 1e-12


@pytest.mark.parametrize("shape", [(4, 4, 3, 3), (6, 3, 3, 3), (3, 6, 3, 3), (5, 5, 1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bound_covers_random_filters_with_both_paddings(shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    K = torch.randn(shape, generator=gen).to(dtype)
    bound = conv_gram_norm_upper_bound(K)
    for size in (1, 2, 5, 8):
        for circular in (False, True):
            norm = float(torch.linalg.matrix_norm(conv_matrix(K.double(), size, circular), ord=2))
            assert norm <= bound


@pytest.mark.parametrize("c", [4, 8])
def test_bound_is_tight_for_orthogonal_filters(c):
    K = paraunitary_kernel(c, seed=c)
    norm = float(torch.linalg.matrix_norm(conv_matrix(K, 6, circular=True), ord=2))
    assert abs(norm - 1) < 1e-12
    assert 1.0 <= conv_gram_norm_upper_bound(K) < 1 + 1e-10
    bound32 = conv_gram_norm_upper_bound(K.float())
    assert float(torch.linalg.matrix_norm(conv_matrix(K.float().double(), 6, True), ord=2)) <= bound32
    assert bound32 < 1 + 1e-5


def test_isometry_bound_covers_and_is_tight():
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(7, 6, 4, generator=gen, dtype=torch.complex128)
    Q = torch.linalg.qr(Z)[0]  # (7, 6, 4) with orthonormal columns
    bound = isometry_norm_upper_bound(Q)
    assert 1.0 <= bound < 1 + 1e-10
    bound32 = isometry_norm_upper_bound(Q.to(torch.complex64))
    norms = torch.linalg.matrix_norm(Q.to(torch.complex64).to(torch.complex128), ord=2)
    assert float(norms.max()) <= bound32 < 1 + 1e-5
    wide = Q.mH  # co-isometries
    assert isometry_norm_upper_bound(wide) < 1 + 1e-10
    scaled = Q * 1.5  # far from an isometry: still a valid (loose) bound
    assert isometry_norm_upper_bound(scaled) >= 1.5


def test_weights_fingerprint_accepts_scalar_parameters():
    """A 0-dim parameter (e.g. the Cayley plugin's learned scale) can be fingerprinted."""
    from lipcli.lipschitz.bound import weights_fingerprint

    m = torch.nn.Module()
    m.alpha = torch.nn.Parameter(torch.tensor(2.0))
    first = weights_fingerprint(m)
    with torch.no_grad():
        m.alpha.fill_(3.0)
    assert weights_fingerprint(m) != first
