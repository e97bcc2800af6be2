"""``--arch liresnet:layers=free``: :class:`FreeConv`'s guaranteed bound covers the exact
operator norm of the convolution it computes (dense float64 matrices of tiny instances,
strides 1 and 2, kernels 1, 3, 5), the stride-2 rearrangement is the same operator, and the
option changes nothing when off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli_liresnet.free import FreeConv, stride2_filter


def _operator(layer: FreeConv) -> torch.Tensor:
    """The dense float64 matrix of ``x ↦ conv(x) − conv(0)`` on the layer's input size."""
    o, i, _k, _ = layer.weight.shape
    h, w = layer.image_size
    basis = torch.eye(i * h * w, dtype=torch.float64).reshape(-1, i, h, w)
    W = layer.weight.detach().double()
    out = F.conv2d(basis, W, stride=layer.stride, padding=layer.padding)
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


def _network(**options):
    from lipcli.testing import create_model

    return create_model("liresnet", depth=2, width=4, dense=1, dense_width=16, neck="patch", features="act",
                        num_classes=10, **options)


def test_layers_free_replaces_exactly_the_conv_layers():
    torch.manual_seed(0)
    default, free = _network(), _network(layers="free", stem_kernel=5)
    names = dict(default.body.named_children())
    frees = {n for n, m in free.body.named_children() if isinstance(m, FreeConv)}
    assert frees == {"stem_conv", "neck_conv", "neck_dense", "dense1"}
    assert list(names) == [n for n, _ in free.body.named_children()]
    assert not any(isinstance(m, FreeConv) for m in default.modules())
    assert free.body.stem_conv.weight.shape == (4, 3, 5, 5) and free.body.stem_conv.stride == 2
    # the training estimate counts a free layer by its guaranteed bound
    with torch.no_grad():
        free.body.dense1.weight.mul_(10.0)
    free.eval()
    est = float(free.lipschitz_training_estimate().detach())
    assert est >= free.body.dense1.lipschitz_upper_bound() * free.body.stem_conv.lipschitz_upper_bound() * 0.99


@pytest.mark.parametrize("k, stride", [(5, 2), (1, 1)])
def test_export_stand_in_is_the_layer(k, stride):
    import lipcli.testing as checks

    layer = checks.randomise_parameters(FreeConv(4, 6, k, stride, (8, 8)).double().eval(), seed=k)
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    checks.check_export_module(layer, type(layer.export_module()), x)
    checks.check_export_follows(layer, lambda: layer.weight.mul_(2.0), x)
    checks.check_aten_program(layer.export_module().float(), x.float())
