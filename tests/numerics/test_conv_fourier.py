"""``lipcli.numerics.conv_fourier``: the Fourier bound of a zero-padded convolution is at least
its norm (dense float64 Jacobians of tiny instances) and within 1e-5 of the norm of the circular
convolution on the torus it computes; it refuses filters it does not bound."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.numerics.conv_fourier import zero_padded_conv_norm_upper_bound


def dense_norm(fn, shape) -> float:
    """Spectral norm of the float64 Jacobian of ``fn`` at a random point (exact for linear maps)."""
    x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    J = torch.autograd.functional.jacobian(lambda v: fn(v.view(shape)).flatten(), x.flatten())
    return float(torch.linalg.matrix_norm(J, 2))


@pytest.mark.parametrize("o,i,k,n,m", [(3, 3, 3, 5, 5), (4, 2, 3, 6, 4), (2, 5, 3, 4, 4),
                                       (3, 3, 5, 6, 6), (3, 3, 1, 3, 3)])
def test_fourier_bound_dominates_and_is_the_circular_norm(o, i, k, n, m):
    gen = torch.Generator().manual_seed(o + 10 * i + n)
    K = torch.randn(o, i, k, k, generator=gen, dtype=torch.float64)
    p = k // 2
    bound = zero_padded_conv_norm_upper_bound(K, (n, m))
    exact = dense_norm(lambda x: F.conv2d(x, K, padding=p), (1, i, n, m))
    N, M = n + k - 1, m + k - 1
    circular = dense_norm(lambda x: F.conv2d(F.pad(x, (p, p, p, p), mode="circular"), K), (1, i, N, M))
    assert bound >= exact
    assert bound >= circular and bound <= circular * (1 + 1e-5)


def test_fourier_bound_refuses_bad_filters():
    with pytest.raises(ValueError):
        zero_padded_conv_norm_upper_bound(torch.ones(2, 2, 2, 2), (4, 4))
    with pytest.raises(ValueError):
        zero_padded_conv_norm_upper_bound(torch.full((2, 2, 3, 3), float("nan")), (4, 4))
