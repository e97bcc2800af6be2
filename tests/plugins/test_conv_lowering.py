"""The eval lowering with every installed convolution whose layer offers ``eval_linear_map``
(tests/plugin_tables.py; lipcli-cayley, -bro, -lot, -bcop today).

* Every such layer: the matrix is the eval layer (float64), the dense operator's bound covers
  its float32 matrix, and ``export_module(context)`` goes dense exactly where the matrix fits
  and pays.
* The Fourier-domain layers (``lipcli.sdk.fourier.FourierConvBase``: Cayley, BRO, LOT), for
  even and odd sizes, stride 2, ``in ≠ out`` and ``1 × 1`` images: the matrix is the eval
  layer (float64), its guaranteed error covers the distance to an 80-bit reference of the
  exact map of the float32 matrices ``Q̂(f)`` (:mod:`lipcli.testing.lowering`) (a layer whose
  exact map is not a Fourier product, as BCOP's, checks its error in its own distribution).
* A tiny LipConvnet-5 with each: some layers run as dense matrices, the certified
  radii through the lowered path equal the literal path's, and the guaranteed bound of the
  lowered operator covers the float64 Jacobian norm of the lowered feature map."""

from __future__ import annotations

import pytest
import torch

import lipcli.testing as checks
from lipcli.lipschitz.bound import lowered_upper_bound
from lipcli.lowering.network import lower_body, lowered_network
from lipcli.sdk.fourier_export import ExportedFourierConv
from lipcli.testing import create_model, guaranteed_upper_bound, plugin_registry
from plugin_tables import FOURIER_CONVS, LOWERING_CONVS, build_conv

#: (in, out, stride, H, W) before the rearrangement
CASES = [(4, 4, 1, 4, 4), (3, 5, 1, 3, 5), (2, 6, 2, 4, 6), (6, 3, 1, 2, 2), (2, 4, 2, 2, 2), (4, 4, 1, 1, 1)]
SHAPE = (3, 32, 32)
CAP_MIB = 64.0


def fourier_layer(name, cin, cout, stride, h, w, dtype=torch.float32):
    return build_conv(name, cin, cout, 3, stride, dtype=dtype, seed=cin + 7 * h + w, size=(h, w))


def test_the_tables_are_not_empty():
    assert LOWERING_CONVS and FOURIER_CONVS and set(FOURIER_CONVS) <= set(LOWERING_CONVS)


@pytest.mark.parametrize("name", LOWERING_CONVS)
@pytest.mark.parametrize("cin, cout, stride, h, w", [(4, 4, 1, 4, 4), (2, 6, 2, 4, 6), (4, 4, 1, 1, 1)])
def test_matrix_is_the_eval_layer_and_dense_bound_covers_it(name, cin, cout, stride, h, w):
    layer = build_conv(name, cin, cout, 3, stride, dtype=torch.float64, seed=cin + h, size=(h, w))
    checks.check_eval_linear_map(layer, (cin, h, w), 1e-12)
    checks.check_dense_bound(build_conv(name, cin, cout, 3, stride, seed=cin + h, size=(h, w)), (cin, h, w))


@pytest.mark.parametrize("name", LOWERING_CONVS)
def test_export_goes_dense_where_it_fits_and_pays(name):
    layer = build_conv(name, 4, 4, 3, 1, size=(6, 6))
    checks.check_export_choice(layer, (4, 6, 6), type(layer.export_module()))


@pytest.mark.parametrize("name", FOURIER_CONVS)
@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_fourier_matrix_is_the_eval_layer(name, cin, cout, stride, h, w):
    # float64 layer: its FFTs round at ~1e-16 relative per stage
    layer = fourier_layer(name, cin, cout, stride, h, w, torch.float64)
    checks.check_eval_linear_map(layer, (cin, h, w), 1e-12)


@pytest.mark.parametrize("name", FOURIER_CONVS)
@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_fourier_error_covers_the_exact_map_and_dense_bound_the_matrix(name, cin, cout, stride, h, w):
    checks.check_fourier_layer(fourier_layer(name, cin, cout, stride, h, w), (cin, h, w))


@pytest.mark.parametrize("name", FOURIER_CONVS)
@pytest.mark.parametrize("cin, cout, stride, h, w", [(4, 4, 1, 6, 6), (8, 8, 1, 2, 2), (4, 8, 2, 2, 2)])
def test_fourier_export_goes_dense_where_it_fits_and_pays(name, cin, cout, stride, h, w):
    checks.check_export_choice(fourier_layer(name, cin, cout, stride, h, w), (cin, h, w), ExportedFourierConv)


def _model(name: str, seed: int = 0) -> torch.nn.Module:
    registry = plugin_registry(autoload=True)
    torch.manual_seed(seed)
    model = create_model("lipconvnet-5", conv=name, width=4, num_classes=10, registry=registry)
    with torch.no_grad():
        for p in model.head.parameters():
            p.mul_(4.0)
        model.eval()(torch.rand(2, *SHAPE))  # Fourier layers record their image sizes
    model.certifier = registry.component("certificate", "lln").build()
    return model


def _radii(model, network, lipschitz: float, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = network.features(x)
    return model.certifier.certify(model.head, y).radius.double() / lipschitz


@pytest.mark.parametrize("name", LOWERING_CONVS)
def test_lowered_radii_equal_the_literal_radii(name):
    model = _model(name)
    lowered = lowered_network(model, dense_max_mib=CAP_MIB)
    assert lowered.dense_layers, "the small-image layers should run as matrices"
    literal = lowered_network(model, series=True)
    l_literal = guaranteed_upper_bound(model)[0]
    l_lowered = lowered_upper_bound(model, lowered)[0]
    assert l_literal <= l_lowered <= l_literal * (1 + 1e-5)
    x = torch.rand(16, *SHAPE, generator=torch.Generator().manual_seed(1))
    r_literal = _radii(model, literal, l_literal, x)
    r_lowered = _radii(model, lowered, l_lowered, x)
    scale = float(r_literal.abs().max())
    assert scale > 0
    assert float((r_lowered - r_literal).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize("name", LOWERING_CONVS)
def test_lowered_bound_covers_the_float64_jacobian(name):
    """The plain stand-ins in float64 (every baked matrix cast exactly) are the lowered
    operator; its Jacobian norm at random inputs is at most the lowered guaranteed bound."""
    model = _model(name, seed=1)
    lowered = lowered_network(model, dense_max_mib=CAP_MIB)
    bound = lowered_upper_bound(model, lowered)[0]
    body, lowering = lower_body(model, SHAPE, int(CAP_MIB * 2**20), plain=True)
    assert sorted(d["layer"] for d in lowering if d.get("lowering") == "dense") == lowered.dense_layers
    body = body.double()
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):
        x = torch.rand(1, *SHAPE, dtype=torch.float64, generator=gen)
        jac = torch.autograd.functional.jacobian(lambda v: body(v.view(1, *SHAPE)).flatten(), x.flatten())
        norm = float(torch.linalg.matrix_norm(jac, ord=2))
        assert 0 < norm <= bound
