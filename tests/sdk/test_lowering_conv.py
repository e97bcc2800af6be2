"""lipcli.sdk.lowering_conv: the dense matrices of circular convolutions and of Fourier-domain
maps, against independent constructions in 80-bit extended precision (:mod:`lipcli.testing.lowering`):
the guaranteed error covers the observed distance (and is not vacuous), the matrices are the
maps torch computes, the cos/sin table is correctly rounded, and a FourierConvBase subclass
with arbitrary (not Hermitian-consistent) per-frequency matrices is lowered soundly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lipcli.testing as checks
from lipcli.numerics.rounding import UNIT_ROUNDOFF
from lipcli.sdk.fourier import FourierConvBase
from lipcli.sdk.fourier_export import ExportedFourierConv
from lipcli.sdk.lowering_conv import (
    TRIG_ERROR, circular_conv_kernel, circular_conv_matrix, fourier_matrix, trig_table,
)


@pytest.mark.parametrize("n", [1, 2, 3, 6, 8, 35, 64])
def test_trig_table_is_correctly_rounded(n):
    cos, sin = trig_table(n)
    angle = 2 * np.arccos(checks.LD(-1)) * np.arange(n).astype(checks.LD) / n
    assert np.abs(cos.numpy().astype(checks.LD) - np.cos(angle)).max() <= TRIG_ERROR
    assert np.abs(sin.numpy().astype(checks.LD) - np.sin(angle)).max() <= TRIG_ERROR
    assert float(cos[0]) == 1.0 and float(sin[0]) == 0.0


class RandomFourier(FourierConvBase):
    """Arbitrary per-frequency matrices (no symmetry between ``f`` and ``−f``)."""

    def __init__(self, cin, cout, stride, seed):
        super().__init__(cin, cout, 3, stride)
        self.seed = seed

    def compute_operator(self, size):
        gen = torch.Generator().manual_seed(self.seed)
        H, W = size
        if (H, W) == (1, 1):
            return torch.randn(1, self.out_channels, self.conv_in_channels, generator=gen)
        shape = (H * (W // 2 + 1), self.out_channels, self.conv_in_channels)
        return torch.complex(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))

    def operator_bound(self, op, size):
        return float(torch.linalg.matrix_norm(op.to(torch.complex128), ord=2).max()) * (1 + 1e-9)


#: (in, out, stride, H, W) before the rearrangement
CASES = [(2, 3, 1, 4, 4), (2, 2, 1, 3, 5), (1, 2, 2, 4, 6), (3, 2, 1, 6, 1), (2, 3, 2, 2, 2), (2, 2, 1, 1, 1)]


@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_fourier_matrix_error_covers_the_exact_map(cin, cout, stride, h, w):
    layer = RandomFourier(cin, cout, stride, seed=h * w + cin).eval()
    with torch.no_grad():
        layer(torch.zeros(1, cin, h, w))
    size = (h // stride, w // stride)
    op = layer.eval_operator(size)
    if size == (1, 1):
        P = op[0].double().numpy().astype(checks.LD)
    else:
        P = checks.fourier_reference(op, size)
    P = checks.reference_on_input(P, cin, (cin, h, w), stride)
    # the reference is the map torch's FFTs compute (float64, the float32 matrices cast exactly)
    checks.check_reference_is_the_layer(P, ExportedFourierConv(op, layer.bias, size=size, stride=stride).double(),
                            (cin, h, w))
    observed = checks.check_eval_error_covers(layer, (cin, h, w), P, at_most=1e-11)
    matrix, error = fourier_matrix(op, size, cin, stride)
    assert error == layer.eval_linear_map((cin, h, w)).error
    if size == (1, 1):
        assert error == 0.0 and observed == 0.0
    else:
        assert observed <= 64 * UNIT_ROUNDOFF * float(np.abs(P).max()) * P.shape[1]


def test_fourier_map_needs_the_recorded_size():
    layer = RandomFourier(2, 2, 1, seed=0).eval()
    assert layer.eval_linear_map((2, 4, 4)) is None  # nothing recorded: no bound exists
    with torch.no_grad():
        layer(torch.zeros(1, 2, 4, 4))
    assert layer.eval_linear_map((2, 4, 4)) is not None
    assert layer.eval_linear_map((2, 6, 6)) is None
    assert layer.eval_linear_map((3, 4, 4)) is None


@pytest.mark.parametrize("k, h, w", [(3, 5, 4), (3, 2, 2), (5, 3, 1), (7, 3, 3), (3, 1, 1)])
def test_circular_conv_matrix_error_covers_the_exact_map(k, h, w):
    gen = torch.Generator().manual_seed(k * h + w)
    K = torch.randn(3, 2, k, k, generator=gen)
    P = checks.circular_conv_reference(K, (h, w))
    matrix, error = circular_conv_matrix(K, (h, w), 2, 1)
    observed = checks.extended_spectral_norm(matrix.numpy().astype(checks.LD) - P)
    assert observed <= error <= 1e-12
    if k <= h and k <= w:  # no taps alias: exact copies
        assert error == 0.0 and observed == 0.0
    _, kernel_error = circular_conv_kernel(K, (h, w))
    assert kernel_error == error
