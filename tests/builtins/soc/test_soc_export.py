"""The exported SOC layer (``lip export``'s lowering) computes the layer's eval operator: on
large images (convolutions + add with alpha) and on 1x1 images (the centre-tap matrix), for
both strides, with and without channel padding; in float64 to tight tolerance."""

from __future__ import annotations

import pytest
import torch

from lipcli.builtins.soc.export import ExportedSOC
from lipcli.builtins.soc.layer import SOC


@pytest.mark.parametrize("side", [1, 2, 5])
@pytest.mark.parametrize("cin,cout,stride", [(4, 4, 1), (3, 6, 1), (2, 8, 2), (4, 4, 2)])
def test_exported_layer_matches_eval_layer(side, cin, cout, stride):
    if stride == 2 and side % 2:
        side *= 2
    torch.manual_seed(0)
    layer = SOC(cin, cout, stride=stride).double().eval()
    exported = ExportedSOC.from_layer(layer).double()
    x = torch.randn(3, cin, side, side, dtype=torch.float64)
    with torch.no_grad():
        want, got = layer(x), exported(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_exported_layer_is_orthogonal_on_1x1_images():
    """The 1x1 path alone (no bias): the Jacobian is orthogonal (Q^T Q = I)."""
    torch.manual_seed(1)
    layer = SOC(6, 6).double().eval()
    with torch.no_grad():
        layer.bias.zero_()
    exported = ExportedSOC.from_layer(layer).double()
    J = torch.autograd.functional.jacobian(lambda v: exported(v.view(1, 6, 1, 1)).view(6),
                                           torch.randn(6, dtype=torch.float64))
    torch.testing.assert_close(J.T @ J, torch.eye(6, dtype=torch.float64), rtol=0, atol=1e-10)


# ------------------------------------------------------------------ dense lowering
from lipcli.builtins.soc.export import DenseSOC, conv_matrix, lower_soc, operator_matrix  # noqa: E402
from lipcli.sdk.lowering import LoweringContext  # noqa: E402


def _jacobian(layer: SOC, shape: tuple[int, int, int]) -> torch.Tensor:
    """Dense Jacobian (``(c_out·H'·W') × (c_in·H·W)``) of the eval-mode layer, by autograd."""
    def f(v: torch.Tensor) -> torch.Tensor:
        return layer(v.view(1, *shape)).flatten()

    x = torch.randn(int(torch.tensor(shape).prod()), dtype=torch.float64)
    return torch.autograd.functional.jacobian(f, x)


@pytest.mark.parametrize("cin,cout,stride,kernel,side", [
    (3, 5, 1, 3, 3),    # channel padding (C = 5)
    (6, 4, 1, 3, 2),    # truncation (C = 6, keep 4)
    (2, 8, 2, 3, 4),    # unshuffle to 2x2
    (3, 6, 2, 3, 2),    # unshuffle to 1x1, 3x3 filter (centre tap only), truncation
    (4, 16, 2, 1, 2),   # 1x1 filter on 1x1 images
    (2, 4, 1, 5, 4),    # 5x5 filter larger than the image
])
def test_operator_matrix_is_the_float64_jacobian_of_the_eval_layer(cin, cout, stride, kernel, side):
    torch.manual_seed(3)
    layer = SOC(cin, cout, kernel_size=kernel, stride=stride).double().eval()
    M = operator_matrix(layer, (cin, side, side))
    J = _jacobian(layer, (cin, side, side))
    assert M.dtype == torch.float64 and M.shape == J.shape
    torch.testing.assert_close(M, J, rtol=0, atol=1e-12)


def test_conv_matrix_is_the_convolution():
    torch.manual_seed(4)
    S = torch.randn(3, 3, 3, 3, dtype=torch.float64)
    u = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    want = torch.nn.functional.conv2d(u, S, padding=1).reshape(2, -1)
    torch.testing.assert_close(u.reshape(2, -1) @ conv_matrix(S, 4, 5).T, want, rtol=0, atol=1e-12)


def test_dense_lowering_equals_series_lowering_and_layer():
    """float32 layer: the dense stand-in's matrix is the float64 operator rounded once; its
    outputs equal the series stand-in's and the layer's to float32 rounding."""
    torch.manual_seed(5)
    layer = SOC(8, 32, stride=2).eval()
    shape = (8, 4, 4)
    dense = lower_soc(layer, LoweringContext(shape, 2**30))
    series = lower_soc(layer, LoweringContext(shape, 0))
    assert isinstance(dense, DenseSOC) and dense.export_lowering["lowering"] == "dense"
    assert isinstance(series, ExportedSOC) and series.export_lowering["lowering"] == "series"
    assert torch.equal(dense.matrix, operator_matrix(layer, shape).to(torch.float32))
    x = torch.randn(5, *shape)
    with torch.no_grad():
        want = layer(x)
        got_dense, got_series = dense(x), series(x)
    assert got_dense.shape == want.shape == (5, 32, 2, 2)
    scale = want.abs().max()
    assert (got_dense - want).abs().max() <= 1e-6 * scale
    assert (got_dense - got_series).abs().max() <= 1e-6 * scale


def test_dense_only_within_the_cap_and_when_cheaper():
    torch.manual_seed(6)
    layer = SOC(8, 32, stride=2).eval()      # (8, 4, 4) -> (32, 2, 2): a 128 x 128 matrix
    nbytes = 4 * 128 * 128
    assert isinstance(lower_soc(layer, LoweringContext((8, 4, 4), nbytes)), DenseSOC)
    assert isinstance(lower_soc(layer, LoweringContext((8, 4, 4), nbytes - 1)), ExportedSOC)
    assert isinstance(lower_soc(layer), ExportedSOC)                # no shape: series
    big = SOC(4, 4).double().eval()          # 16x16 images: the series is cheaper
    series = lower_soc(big, LoweringContext((4, 16, 16), 2**30))
    record = series.export_lowering
    assert record["lowering"] == "series" and record["channels_last"] is True
    assert record["dense_flops_per_image"] * 4 > record["series_flops_per_image"]
    x = torch.randn(2, 4, 16, 16, dtype=torch.float64)
    with torch.no_grad():  # channels-last series: a layout only
        torch.testing.assert_close(series(x), big(x), rtol=1e-12, atol=1e-12)
    small = lower_soc(SOC(4, 4).eval(), LoweringContext((4, 4, 4), 0))
    assert small.export_lowering["channels_last"] is False


def test_dense_stand_in_exports_to_aten():
    from lipcli.testing import check_aten_program

    torch.manual_seed(7)
    layer = SOC(8, 32, stride=2).double().eval()
    dense = lower_soc(layer, LoweringContext((8, 4, 4), 2**30))
    assert dense.matrix.dtype == torch.float64
    program = check_aten_program(dense, torch.randn(2, 8, 4, 4, dtype=torch.float64))
    x = torch.randn(3, 8, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(program(x), layer(x), rtol=1e-12, atol=1e-12)
