"""The BCOP layer's eval lowering (``eval_linear_map``): its matrix is the eval layer (float64),
it equals the circular convolution with the cached eval filter exactly when no taps alias
and within its guaranteed error when they do (80-bit reference, lipcli.testing),
and the dense stand-in's bound covers its float32 matrix, for stride 2, ``in ≠ out``,
filters wider than the image and ``1 × 1`` images."""

from __future__ import annotations

import pytest
import torch

from lipcli_bcop import BCOPConv
from lipcli_bcop.export import ExportedBCOP

import lipcli.testing as checks

#: (in, out, k, stride, H, W) before the rearrangement
CASES = [(4, 4, 3, 1, 5, 4), (2, 6, 3, 2, 4, 6), (6, 3, 3, 1, 2, 2), (2, 4, 3, 2, 2, 2), (4, 4, 5, 1, 3, 1),
         (4, 4, 3, 1, 1, 1)]


def layer_for(cin, cout, k, stride, dtype=torch.float32):
    return checks.randomise_parameters(BCOPConv(cin, cout, k, stride).to(dtype).eval(), cin + 10 * k + stride)


@pytest.mark.parametrize("cin, cout, k, stride, h, w", CASES)
def test_matrix_is_the_eval_layer(cin, cout, k, stride, h, w):
    checks.check_eval_linear_map(layer_for(cin, cout, k, stride, torch.float64), (cin, h, w), 1e-13)


@pytest.mark.parametrize("cin, cout, k, stride, h, w", CASES)
def test_error_covers_the_exact_map_and_dense_bound_covers_the_matrix(cin, cout, k, stride, h, w):
    layer = layer_for(cin, cout, k, stride)
    size = (h // stride, w // stride)
    P = checks.reference_on_input(checks.circular_conv_reference(layer.eval_operator(None), size),
                                  cin, (cin, h, w), stride)
    filt, bias = layer.eval_operator(None).double(), layer.bias.double()  # exact casts
    checks.check_reference_is_the_layer(P, ExportedBCOP(filt, bias, stride=stride), (cin, h, w))
    observed = checks.check_eval_error_covers(layer, (cin, h, w), P, at_most=1e-12)
    if k <= size[0] and k <= size[1]:  # no taps alias: the matrix copies the filter exactly
        assert observed == 0.0 and layer.eval_linear_map((cin, h, w)).error == 0.0
    checks.check_dense_bound(layer, (cin, h, w))


@pytest.mark.parametrize("cin, cout, k, stride, h, w", [(4, 4, 3, 1, 6, 6), (8, 8, 3, 1, 2, 2), (4, 8, 3, 2, 2, 2)])
def test_export_goes_dense_where_it_fits_and_pays(cin, cout, k, stride, h, w):
    checks.check_export_choice(layer_for(cin, cout, k, stride), (cin, h, w), ExportedBCOP)
