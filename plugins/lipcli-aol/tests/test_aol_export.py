"""``lip export`` of the AOL layer: the stand-in (:class:`ExportedAOL`, one plain convolution
with the rescaled filter baked in) equals the eval-mode layer in float64 and survives
``torch.export`` as aten operations only."""

from __future__ import annotations

import pytest
import torch

from lipcli_aol import AOLConv, aol_rescale
from lipcli_aol.export import ExportedAOL

import lipcli.testing as checks

#: (in, out, kernel, stride, H, W): in = out, in < out, in > out, 5x5, stride 2 to 1x1, 1x1
CASES = [(4, 4, 3, 1, 6, 6), (3, 8, 3, 2, 8, 6), (8, 4, 3, 1, 5, 7), (4, 6, 5, 1, 7, 7),
         (4, 6, 3, 2, 2, 2), (4, 4, 3, 1, 1, 1), (4, 4, 1, 1, 3, 3)]


def random_layer(cin: int, cout: int, k: int, stride: int, seed: int = 0) -> AOLConv:
    """A float64 eval-mode layer with dense random filters and bias."""
    return checks.randomise_parameters(AOLConv(cin, cout, k, stride).double().eval(), seed)


@pytest.mark.parametrize("cin, cout, k, stride, h, w", CASES)
def test_stand_in_equals_the_eval_layer(cin, cout, k, stride, h, w):
    layer = random_layer(cin, cout, k, stride, seed=cin + 10 * cout + h)
    x = torch.randn(3, cin, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    checks.check_export_module(layer, ExportedAOL, x)


def test_the_baked_filter_is_the_rescaled_one():
    """The stand-in holds ``K·D``; the raw filter would be far off (the test above can fail)."""
    layer = random_layer(4, 4, 3, 1)
    assert torch.equal(layer.export_module().filter, aol_rescale(layer.weight.detach()))
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    unscaled = ExportedAOL(layer.weight.detach(), layer.bias.detach(), stride=1)
    with torch.no_grad():
        assert checks.relative_error(unscaled(x), layer(x)) > 1e-2


@pytest.mark.parametrize("stride, size", [(1, 6), (2, 2)])
def test_stand_in_survives_torch_export(stride, size):
    layer = random_layer(4, 8, 3, stride, seed=stride)
    program = checks.check_aten_program(layer.export_module(), torch.randn(2, 4, size, size, dtype=torch.float64))
    x = torch.randn(5, 4, size, size, dtype=torch.float64)
    with torch.no_grad():
        assert checks.relative_error(program(x), layer(x)) <= 1e-12
