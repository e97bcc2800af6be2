"""``lipcli_liresnet.free_conv.FreeConv``: its guaranteed bound covers the exact operator norm of the
convolution it computes and stays within 25 % of it (dense float64 matrices of tiny instances,
strides 1 and 2, kernels 1, 3, 5), the stride-2 rearrangement is the same operator, the bound
follows the filter, the training estimate is the authors' power iteration (below the bound,
close to it once converged, differentiable in the filter), and the export stand-in computes the
layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.numerics.conv import conv_spectral_norm_upper_bound
from lipcli.numerics.conv_fourier import zero_padded_conv_norm_upper_bound
from lipcli_liresnet.free_conv import AUTHORS_POWER_STEPS, FreeConv, stride2_filter


def _operator(layer: FreeConv) -> torch.Tensor:
    """The dense float64 matrix of ``x ↦ layer(x) − layer(0)`` on the layer's input size (the
    layer's own forward pass, on a float64 copy)."""
    copy = FreeConv(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride, layer.image_size).double()
    copy.load_state_dict(layer.state_dict())
    i, (h, w) = layer.in_channels, layer.image_size
    basis = torch.eye(i * h * w, dtype=torch.float64).reshape(-1, i, h, w)
    with torch.no_grad():
        out = copy(basis) - copy(torch.zeros(1, i, h, w, dtype=torch.float64))
    return out.reshape(i * h * w, -1).T


CASES = [(3, 4, 5, 2, (8, 8)), (4, 6, 3, 2, (6, 6)), (4, 4, 3, 1, (5, 7)), (6, 3, 1, 1, (4, 4)),
         (8, 5, 1, 1, (1, 1)), (2, 4, 5, 1, (12, 12))]


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
@pytest.mark.parametrize("scale", [1.0, 7.0])
def test_bound_covers_the_exact_norm(cin, cout, k, stride, size, scale):
    torch.manual_seed(cin * 100 + k * 10 + stride)
    layer = FreeConv(cin, cout, k, stride, size)
    with torch.no_grad():
        layer.weight.mul_(scale).add_(torch.randn_like(layer.weight) * 0.3)
    norm = float(torch.linalg.matrix_norm(_operator(layer), ord=2))
    bound = layer.lipschitz_upper_bound()
    assert norm <= bound <= 1.25 * norm, (norm, bound)


def test_bound_follows_the_filter():
    layer = FreeConv(3, 4, 5, 2, (8, 8))
    before = layer.lipschitz_upper_bound()
    with torch.no_grad():
        layer.weight.mul_(3.0)
    assert layer.lipschitz_upper_bound() == pytest.approx(3.0 * before, rel=1e-5)
    layer.weight.data.mul_(2.0)  # a write that autograd's version counter does not see
    assert layer.lipschitz_upper_bound() == pytest.approx(6.0 * before, rel=1e-5)


@pytest.mark.parametrize("k", [3, 5])
def test_each_stride2_bound_covers_the_norm(k):
    """The three bounds the stride-2 layer takes the minimum of, each at least the exact norm:
    the Fourier and Fantastic Four bounds of the rearranged filter on the half-size image and
    the Fantastic Four bound of the filter itself."""
    torch.manual_seed(k)
    layer = FreeConv(3, 4, k, 2, (8, 8)).double()
    with torch.no_grad():
        layer.weight.mul_(5.0).add_(torch.randn_like(layer.weight))
    exact = float(torch.linalg.matrix_norm(_operator(layer), ord=2))
    K = layer.weight.detach()
    R = stride2_filter(K)
    bounds = (zero_padded_conv_norm_upper_bound(R, (4, 4)), conv_spectral_norm_upper_bound(R),
              conv_spectral_norm_upper_bound(K))
    assert all(b >= exact for b in bounds), (exact, bounds)
    assert layer.lipschitz_upper_bound() == min(bounds)


def test_forward_refuses_another_dtype():
    layer = FreeConv(3, 4, 3, 1, (4, 4))
    with pytest.raises(ValueError, match="float32 filter"):
        layer(torch.zeros(1, 3, 4, 4, dtype=torch.float64))


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_stride2_is_a_stride1_conv_of_the_unshuffled_input(k):
    gen = torch.Generator().manual_seed(k)
    W = torch.randn(5, 3, k, k, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 3, 10, 12, generator=gen, dtype=torch.float64)
    R = stride2_filter(W)
    want = F.conv2d(x, W, stride=2, padding=k // 2)
    got = F.conv2d(F.pixel_unshuffle(x, 2), R, padding=R.shape[-1] // 2)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    # every tap moved once, none invented
    assert torch.equal(R[R != 0].sort().values, W.flatten().sort().values)


def test_free_conv_refuses_what_it_does_not_bound():
    with pytest.raises(ValueError, match="odd kernel"):
        FreeConv(2, 2, 4, 1, (8, 8))
    with pytest.raises(ValueError, match="even image sides"):
        FreeConv(2, 2, 3, 2, (7, 8))
    with pytest.raises(ValueError, match="built \\(and bounded\\) for 8x8"):
        FreeConv(2, 2, 3, 1, (8, 8))(torch.zeros(1, 2, 9, 9))


def test_training_estimate_is_the_power_iteration():
    """``power_steps`` steps per call from a kept vector (the authors' ``num_lc_iter`` = 10):
    below the guaranteed bound, within 10 % of it once refreshed, differentiable in the filter."""
    torch.manual_seed(3)
    layer = FreeConv(3, 6, 5, 2, (16, 16)).double()
    with torch.no_grad():
        layer.weight.mul_(2.0).add_(torch.randn_like(layer.weight))
    assert layer.power_steps == AUTHORS_POWER_STEPS == 10
    first = layer.lipschitz_training_estimate()
    layer.refresh(300)
    estimate = layer.lipschitz_training_estimate()
    exact = float(torch.linalg.matrix_norm(_operator(layer), ord=2))
    assert float(first.detach()) <= float(estimate.detach()) * (1 + 1e-9) <= exact * (1 + 1e-9)
    assert 0.9 * layer.lipschitz_upper_bound() <= float(estimate.detach())
    estimate.backward()
    assert layer.weight.grad is not None and float(layer.weight.grad.norm()) > 0
    assert "power_v" not in layer.state_dict()  # derivable state: not stored in model files
    with pytest.raises(ValueError, match="power_steps"):
        FreeConv(3, 6, 5, 2, (16, 16), power_steps=0)


@pytest.mark.parametrize("k, stride", [(5, 2), (1, 1)])
def test_export_stand_in_is_the_layer(k, stride):
    import lipcli.testing as checks

    layer = checks.randomise_parameters(FreeConv(4, 6, k, stride, (8, 8)).double().eval(), seed=k)
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    checks.check_export_module(layer, type(layer.export_module()), x)
    checks.check_export_follows(layer, lambda: layer.weight.mul_(2.0), x)
    checks.check_aten_program(layer.export_module().float(), x.float())
