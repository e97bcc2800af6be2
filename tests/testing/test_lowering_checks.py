"""lipcli.testing.lowering: the reference maps in 80-bit precision are the maps they name
(against torch's circular convolution and FFTs), and the eval-lowering checks pass on a layer
that offers ``eval_linear_map`` (the built-in SOC) and FAIL on one whose matrix is wrong or
whose error bound is too small."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lipcli.builtins.soc.layer import SOC
from lipcli.testing import (
    LD,
    check_dense_bound,
    check_eval_error_covers,
    check_eval_linear_map,
    check_export_choice,
    circular_conv_reference,
    extended_spectral_norm,
    fourier_reference,
    reference_on_input,
)
from lipcli.testing.lowering import unshuffle_matrix

GEN = torch.Generator().manual_seed(0)


def test_circular_conv_reference_is_the_circular_convolution():
    K = torch.randn(3, 2, 3, 3, dtype=torch.float64, generator=GEN)
    x = torch.randn(2, 4, 5, dtype=torch.float64, generator=GEN)
    y = F.conv2d(F.pad(x[None], (1, 1, 1, 1), mode="circular"), K)[0]
    P = circular_conv_reference(K, (4, 5))
    got = (P @ x.flatten().numpy().astype(LD)).astype(np.float64)
    np.testing.assert_allclose(got, y.flatten().numpy(), rtol=0, atol=1e-12)


def test_fourier_reference_is_the_fft_product():
    H, W = 4, 6
    op = torch.randn(H * (W // 2 + 1), 2, 3, dtype=torch.complex128, generator=GEN)
    op[0] = op[0].real  # the DC and Nyquist frequencies of a real map are real
    x = torch.randn(3, H, W, dtype=torch.float64, generator=GEN)
    xf = torch.fft.rfft2(x).permute(1, 2, 0).reshape(-1, 3, 1)
    y = torch.fft.irfft2((op @ xf).reshape(H, W // 2 + 1, 2).permute(2, 0, 1), s=(H, W))
    got = (fourier_reference(op, (H, W)) @ x.flatten().numpy().astype(LD)).astype(np.float64)
    np.testing.assert_allclose(got, y.flatten().numpy(), rtol=0, atol=1e-12)


def test_unshuffle_matrix_is_pixel_unshuffle():
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64, generator=GEN)
    M = unshuffle_matrix(2, (4, 4), 2).astype(np.float64)
    np.testing.assert_array_equal(M @ x.flatten().numpy(), F.pixel_unshuffle(x, 2).flatten().numpy())
    assert reference_on_input(M, 2, (2, 4, 4), 1) is M


def soc(dtype=torch.float32) -> SOC:
    torch.manual_seed(3)  # SOC's own initialisation (its bound follows its power iteration)
    layer = SOC(4, 4).to(dtype).eval()
    with torch.no_grad():
        layer(torch.zeros(1, 4, 4, 4, dtype=dtype))
    return layer


def test_the_checks_pass_on_a_layer_that_offers_its_matrix():
    check_eval_linear_map(soc(torch.float64), (4, 4, 4), 1e-10)
    dense = check_dense_bound(soc(), (4, 4, 4))
    assert dense.matrix.shape == (64, 64)
    layer = soc()
    check_export_choice(layer, (4, 4, 4), type(layer.export_module()))
    exact = layer.eval_linear_map((4, 4, 4)).matrix.numpy().astype(LD)
    assert check_eval_error_covers(layer, (4, 4, 4), exact, at_most=1e-6) == 0.0
    assert extended_spectral_norm(np.eye(3, dtype=LD) * 2) == 2.0


class WrongMap:
    """A layer whose ``eval_linear_map`` reports ``matrix + delta`` with error ``error``."""

    def __init__(self, layer, delta: float, error: float | None = None) -> None:
        self.layer, self.delta, self.error = layer, delta, error
        self.bias = layer.bias

    def __call__(self, x):
        return self.layer(x)

    def eval_linear_map(self, shape):
        linear = self.layer.eval_linear_map(shape)
        error = linear.error if self.error is None else self.error
        return dataclasses.replace(linear, matrix=linear.matrix + self.delta, error=error)


def test_a_wrong_matrix_fails():
    with pytest.raises(AssertionError, match="differs from layer"):
        check_eval_linear_map(WrongMap(soc(torch.float64), 1e-3), (4, 4, 4), 1e-10)


def test_an_error_bound_below_the_distance_fails():
    layer = soc()
    exact = layer.eval_linear_map((4, 4, 4)).matrix.numpy().astype(LD)
    with pytest.raises(AssertionError, match="above its error"):
        check_eval_error_covers(WrongMap(layer, 1e-6, error=1e-9), (4, 4, 4), exact, at_most=1.0)
    with pytest.raises(AssertionError, match="is above"):
        check_eval_error_covers(WrongMap(layer, 1e-6, error=1.0), (4, 4, 4), exact, at_most=0.5)
