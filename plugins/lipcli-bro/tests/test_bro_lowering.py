"""The BRO layer's eval lowering (``eval_linear_map``, the SDK's Fourier base): its matrix is
the eval layer (float64), its guaranteed error covers the distance to the exact map of the
float32 matrices ``Q̂(f)`` (80-bit reference, tests/plugin_lowering.py), and the dense
stand-in's bound covers its float32 matrix, for even and odd sizes, stride 2, ``in ≠ out``
and ``1 × 1`` images."""

from __future__ import annotations

import pytest
import torch

from lipcli_bro import BROConv

checks = pytest.importorskip("plugin_lowering", reason="run from lipcli's root (tests/plugin_lowering.py)")
export_checks = pytest.importorskip("plugin_export", reason="run from lipcli's root (tests/plugin_export.py)")

#: (in, out, stride, H, W) before the rearrangement
CASES = [(4, 4, 1, 4, 4), (3, 5, 1, 3, 5), (2, 6, 2, 4, 6), (6, 3, 1, 2, 2), (2, 4, 2, 2, 2), (4, 4, 1, 1, 1)]


def layer_for(cin, cout, stride, h, w, dtype=torch.float32):
    layer = export_checks.randomise_(BROConv(cin, cout, 3, stride, init="random").to(dtype).eval(), cin + 7 * h + w)
    with torch.no_grad():
        layer(torch.zeros(1, cin, h, w, dtype=dtype))
    return layer


@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_matrix_is_the_eval_layer(cin, cout, stride, h, w):
    # float64 layer: its FFTs round at ~1e-16 relative per stage
    checks.check_map_is_the_layer(layer_for(cin, cout, stride, h, w, torch.float64), (cin, h, w), 1e-12)


@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_error_covers_the_exact_map_and_dense_bound_covers_the_matrix(cin, cout, stride, h, w):
    checks.check_fourier_layer(layer_for(cin, cout, stride, h, w), (cin, h, w))


@pytest.mark.parametrize("cin, cout, stride, h, w", [(4, 4, 1, 6, 6), (8, 8, 1, 2, 2), (4, 8, 2, 2, 2)])
def test_export_goes_dense_where_it_fits_and_pays(cin, cout, stride, h, w):
    from lipcli.sdk.fourier_export import ExportedFourierConv

    checks.check_export_choice(layer_for(cin, cout, stride, h, w), (cin, h, w), ExportedFourierConv)
