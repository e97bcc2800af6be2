"""``lip export`` of the BCOP layer: the stand-in (:class:`ExportedBCOP`, the converged
orthogonal filter baked into a circular convolution) equals the eval-mode layer in float64,
also where the filter is wider than the image, and survives ``torch.export`` as aten
operations only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lipcli_bcop.bcop as bcop_module
from lipcli_bcop.bcop import BCOPConv
from lipcli_bcop.export import ExportedBCOP

import lipcli.testing as checks

#: (in, out, kernel, stride, H, W): in = out, in < out, in > out, 5x5 filter on a 2x3 torus
#: (wraps more than once), stride 2 to 1x1, 1x1, 1x1 filter
CASES = [(4, 4, 3, 1, 6, 6), (3, 8, 3, 2, 8, 6), (8, 4, 3, 1, 5, 7), (4, 6, 5, 1, 2, 3),
         (4, 6, 3, 2, 2, 2), (4, 4, 3, 1, 1, 1), (4, 4, 1, 1, 3, 3)]


@pytest.mark.parametrize("cin, cout, k, stride, h, w", CASES)
def test_stand_in_equals_the_eval_layer(cin, cout, k, stride, h, w):
    """Random (non-orthogonal) parameters: the eval filter is Björck's converged one."""
    layer = checks.randomise_parameters(BCOPConv(cin, cout, k, stride).double().eval(), cin + 10 * cout + h)
    x = torch.randn(3, cin, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    checks.check_export_module(layer, ExportedBCOP, x)


def test_the_baked_filter_is_the_converged_one_with_circular_padding(monkeypatch):
    """The stand-in holds the eval (Björck-converged) filter, not a 1-step training one
    (training converges too; capped at one step here to tell them apart); zero padding
    would be far off at the borders (the test above can fail)."""
    monkeypatch.setattr(bcop_module, "TRAIN_MAX_ITERS", 1)
    layer = checks.randomise_parameters(BCOPConv(4, 4, 3, 1, bjorck_iters=1).double().eval(), 3)
    standin = layer.export_module()
    assert torch.equal(standin.filter, layer.eval_operator(None))
    assert not torch.allclose(standin.filter, layer.compute_operator(None).detach(), atol=1e-3)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        zero_padded = F.conv2d(x, standin.filter, standin.bias, padding=1)
        assert checks.relative_error(zero_padded, layer(x)) > 1e-2


@pytest.mark.parametrize("stride, size", [(1, 6), (2, 2)])
def test_stand_in_survives_torch_export(stride, size):
    layer = checks.randomise_parameters(BCOPConv(4, 8, 3, stride).double().eval(), stride)
    program = checks.check_aten_program(layer.export_module(), torch.randn(2, 4, size, size, dtype=torch.float64))
    x = torch.randn(5, 4, size, size, dtype=torch.float64)
    with torch.no_grad():
        assert checks.relative_error(program(x), layer(x)) <= 1e-12
