"""BRO's zero border (``border="zero"``, the authors' pad-and-crop form) and the authors'
LipConvNet rank rule (``rank_rule="lipconvnet"``).

Zero border: the layer equals the paper's reflector formula applied to the dense matrix of
the low-rank convolution on the *padded* torus, restricted to the interior (an independent
spatial-domain computation, no FFT or QR); its dense float64 Jacobian has norm at most its
bound (itself at most ``1 + 1e-10``) and is NOT orthogonal (smallest singular value below
``0.99`` on these layers: the crop discards the border); gradients match finite differences;
the eval lowering's matrix and the export stand-in equal the layer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lipcli_bro.plugin as plugin
from lipcli.sdk.specs import Component, replace
from lipcli.testing import affine_matrix, check_conv_spec, randomise_parameters, singular_values
from lipcli.testing.lowering import check_eval_linear_map
from lipcli_bro import BROConv
from lipcli_bro.border import mask_mapping

#: (in, out, kernel, stride, image size)
CASES = [(4, 4, 3, 1, 5), (3, 6, 3, 1, 4), (6, 3, 3, 1, 4), (2, 8, 3, 2, 4), (4, 8, 3, 2, 2),
         (4, 4, 5, 1, 3)]


def zero_layer(cin, cout, k, stride, seed, **params):
    layer = BROConv(cin, cout, k, stride, border="zero", init="random", **params).double()
    return randomise_parameters(layer, seed=seed).eval()


def padded_reflector_matrix(layer: BROConv, size: int) -> torch.Tensor:
    """``I − 2V(VᵀV)⁻¹Vᵀ`` of the dense low-rank convolution on the padded torus, restricted
    to the interior pixels of the first ``out`` rows and ``in·s²`` columns (channel-major)."""
    p, c = layer.pad, layer.channels
    n = size + 2 * p
    kernel = layer.weight.detach()

    def conv(z):
        return F.conv2d(F.pad(z, (p, p, p, p), mode="circular"), kernel)

    V = affine_matrix(conv, (kernel.shape[1], n, n))  # (c·n², r·n²)
    W = torch.eye(V.shape[0], dtype=torch.float64) - 2 * V @ torch.linalg.solve(V.T @ V, V.T)
    inner = (torch.arange(p, p + size)[:, None] * n + torch.arange(p, p + size)[None, :]).reshape(-1)
    rows = (torch.arange(layer.out_channels)[:, None] * n * n + inner).reshape(-1)
    cols = (torch.arange(layer.conv_in_channels)[:, None] * n * n + inner).reshape(-1)
    assert V.shape[0] == c * n * n
    return W[rows][:, cols]


@pytest.mark.parametrize("cin, cout, k, stride, size", [c for c in CASES if c[3] == 1])
def test_zero_border_is_the_reflector_of_the_padded_image_cropped(cin, cout, k, stride, size):
    layer = zero_layer(cin, cout, k, stride, seed=cin + cout)
    torch.testing.assert_close(affine_matrix(layer, (cin, size, size)),
                               padded_reflector_matrix(layer, size), rtol=0, atol=1e-10)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
def test_zero_border_jacobian_is_within_the_bound_and_not_orthogonal(cin, cout, k, stride, size):
    layer = zero_layer(cin, cout, k, stride, seed=10 * cin + cout)
    s = singular_values(layer, (cin, size, size))
    bound = layer.lipschitz_upper_bound()
    assert float(s.max()) <= bound <= 1.0 + 1e-10
    assert float(s.min()) < 0.99  # a crop of an orthogonal map: not orthogonal
    assert layer.spatial_size.tolist() == [size // stride + 2 * (k // 2)] * 2


def test_zero_border_after_training_steps_stays_within_the_bound():
    torch.manual_seed(0)
    layer = BROConv(4, 4, 3, 1, border="zero").double()
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    target = torch.nn.Conv2d(4, 4, 3, 1, 1).double()
    for _ in range(5):
        opt.zero_grad()
        x = torch.randn(4, 4, 5, 5, dtype=torch.float64)
        ((layer(x) - 3 * target(x).detach()) ** 2).mean().backward()
        opt.step()
    layer.eval()
    assert float(singular_values(layer, (4, 5, 5)).max()) <= layer.lipschitz_upper_bound() <= 1 + 1e-10


@pytest.mark.parametrize("stride, size", [(1, 3), (2, 4)])
def test_zero_border_gradients_match_finite_differences(stride, size):
    layer = randomise_parameters(BROConv(2, 4, 3, stride, rank=2, border="zero").double(), seed=5).train()
    x = torch.randn(1, 2, size, size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, z: torch.func.functional_call(
        layer, {"weight": w, "bias": layer.bias}, (z,)), (layer.weight.detach().requires_grad_(), x),
        fast_mode=True)


def test_zero_border_factored_training_route_equals_the_dense_route():
    """CPU training with ``factor=auto`` from 128 channels applies the reflector factored;
    with the zero border it crops too: the same map as the Householder route."""
    torch.manual_seed(1)
    auto = BROConv(32, 32, 3, 2, border="zero", init="random").double().train()
    qr = BROConv(32, 32, 3, 2, border="zero", init="random", factor="qr").double().train()
    qr.load_state_dict(auto.state_dict())
    assert auto.channels >= auto.cholesky_min_channels
    x = torch.randn(2, 32, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(auto(x), qr(x), rtol=0, atol=1e-9)


@pytest.mark.parametrize("cin, cout, k, stride, size", [(4, 4, 3, 1, 5), (2, 8, 3, 2, 4)])
def test_zero_border_eval_lowering_and_export_equal_the_layer(cin, cout, k, stride, size):
    layer = zero_layer(cin, cout, k, stride, seed=3)
    x = torch.randn(3, cin, size, size, dtype=torch.float64)
    want = layer(x)
    check_eval_linear_map(layer, (cin, size, size), rtol=1e-12)
    linear = layer.eval_linear_map((cin, size, size))
    assert linear.output_shape == (cout, size // stride, size // stride) and linear.error < 1e-12
    stand_in = layer.export_module()
    torch.testing.assert_close(stand_in(x), want, rtol=0, atol=1e-12)
    assert layer.eval_linear_map((cin, size + 2 * stride, size + 2 * stride)) is None  # another size


def test_zero_border_layer_drops_the_orthogonal_promise_and_passes_conformance():
    spec = plugin.bro_spec()
    circular = Component(spec, {}).build(4, 4, 3, 1)
    zero = Component(spec, {"border": "zero"}).build(4, 4, 3, 1)
    assert "orthogonal" in circular.lip_promises and "orthogonal" not in zero.lip_promises
    reports = check_conv_spec(replace(spec, promises=()), params={"border": "zero", "init": "random"})
    assert reports and all(r.sigma_max <= 1 + 1e-9 for r in reports)


def test_defaults_stay_circular_with_the_ratio_rule():
    layer = BROConv(3, 64, 3, 2)
    assert layer.border == "circular" and layer.pad == 0 and layer.rank == 32
    assert "border" not in repr(layer)
    with pytest.raises(ValueError, match="border"):
        BROConv(4, 4, border="reflect")
    with pytest.raises(ValueError, match="rank_rule"):
        BROConv(4, 4, rank_rule="authors")


def test_lipconvnet_rank_rule_is_the_authors():
    """``lipconvnet/models/layers/bro.py``: ``min(in·s², out)`` where the channels differ,
    ``mask_mapping(c, rank_ratio)`` where they agree (LipConvNet passes 0.125)."""
    rule = {"rank_rule": "lipconvnet", "rank_ratio": 0.125}
    assert BROConv(3, 64, 3, 2, **rule).rank == 12  # the stem of their LipConvNet: 3 -> 64, stride 2
    assert BROConv(64, 64, 3, 1, **rule).rank == 8
    assert BROConv(64, 128, 3, 2, **rule).rank == 128  # 256 -> 128: min(in*s^2, out)
    assert BROConv(32, 128, 3, 2, **rule).rank == 16  # 128 = 128: floor(0.125 * 128)
    assert BROConv(1024, 10, 1, 1, **rule).rank == 10
    assert BROConv(10, 10, rank_rule="lipconvnet", rank_ratio=1.0).rank == 9  # mask_mapping: c - 1
    assert BROConv(10, 10, rank_rule="lipconvnet", rank_ratio=0.75).rank == 6  # (c // 4) * 3
    assert BROConv(10, 10, rank_ratio=0.75).rank == 7 and BROConv(10, 10, rank_ratio=1.0).rank == 10
    assert BROConv(3, 64, 3, 2, rank=5, **rule).rank == 5  # an explicit rank wins
    assert [mask_mapping(64, v) for v in (0.25, 0.5, 0.125)] == [16, 32, 8]
