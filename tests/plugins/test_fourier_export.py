"""``lip export`` of the Fourier-domain layers of every installed convolution built on
:class:`lipcli.sdk.fourier.FourierConvBase` (tests/plugin_tables.py; lipcli-cayley, -bro and
-lot today): the stand-in
(:class:`ExportedFourierConv`, the layer's per-frequency matrices baked) equals the eval-mode
layer in float64 for even and odd sizes, non-square images, stride 2 and ``1 × 1`` images, both
in its FFT form (pt2, TorchScript) and in its real-matrix form (ONNX); it follows parameter
changes only when re-exported; it survives ``torch.export`` as aten operations only; a layer that
has not seen an input says so (the ONNX program itself runs in test_zoo_export.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lipcli.testing as checks
from lipcli.sdk.errors import LipError
from lipcli.sdk.fourier_export import ExportedFourierConv
from plugin_tables import CONVS, FOURIER_CONVS, build_conv

#: (in, out, stride, H, W) before the rearrangement
CASES = [(4, 4, 1, 6, 6), (4, 4, 1, 4, 5), (3, 8, 2, 8, 6), (8, 4, 1, 5, 7), (4, 4, 1, 6, 1),
         (4, 6, 2, 2, 2), (4, 4, 1, 1, 1)]


@pytest.fixture(params=FOURIER_CONVS)
def conv(request):
    return request.param


def random_layer(conv, cin: int, cout: int, stride: int, size: tuple[int, int], seed: int = 0):
    return build_conv(conv, cin, cout, 3, stride, dtype=torch.float64, seed=seed, size=size)


def test_the_fourier_table_is_not_empty():
    assert FOURIER_CONVS, "no installed convolution is built on FourierConvBase"


@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_stand_in_equals_the_eval_layer(conv, cin, cout, stride, h, w):
    layer = random_layer(conv, cin, cout, stride, (h, w), seed=cin + 10 * cout + h + w)
    x = torch.randn(3, cin, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    standin = checks.check_export_module(layer, ExportedFourierConv, x)
    assert not any(b.is_complex() for b in standin.buffers())
    if h * w // stride**2 > 1:  # ONNX: real matrix products only
        with torch.no_grad():
            real = standin.real_products(F.pixel_unshuffle(x, stride)) + standin.bias.view(1, -1, 1, 1)
            assert checks.relative_error(real, layer(x)) <= 1e-12


def test_stand_in_is_baked_at_export(conv):
    layer = random_layer(conv, 4, 4, 1, (6, 6))
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    checks.check_export_follows(layer, lambda: [p.mul_(1.5).add_(0.3) for p in layer.parameters()], x)


def test_a_layer_that_has_not_seen_an_input_cannot_be_exported(conv):
    with pytest.raises(LipError, match="has not seen an input"):
        spec = CONVS[conv].spec
        spec.factory(4, 4, 3, 1, **spec.resolve_params(None)).eval().export_module()


@pytest.mark.parametrize("stride, size", [(1, 6), (2, 2)])
def test_stand_in_survives_torch_export(conv, stride, size):
    layer = random_layer(conv, 4, 8, stride, (size, size), seed=stride)
    program = checks.check_aten_program(layer.export_module(), torch.randn(2, 4, size, size, dtype=torch.float64))
    x = torch.randn(5, 4, size, size, dtype=torch.float64)
    with torch.no_grad():
        assert checks.relative_error(program(x), layer(x)) <= 1e-12
