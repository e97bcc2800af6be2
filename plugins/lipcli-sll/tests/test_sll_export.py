"""``lip export`` of the SLL layer: the stand-in (:class:`ExportedSLL`: conv2d, relu,
conv_transpose2d with the filter, bias and cached scales baked in) equals the eval-mode layer
in float64, follows parameter changes only when re-exported, and survives ``torch.export`` as
aten operations only."""

from __future__ import annotations

import pytest
import torch

from lipcli_sll import SLLConv
from lipcli_sll.export import ExportedSLL

import lipcli.testing as checks

#: (in, out, kernel, stride, H, W): in = out, stem in < out, stride 2 C -> 4C, in > out
#: (projection fallback), 5x5, stride 2 to 1x1, 1x1 on 1x1
CASES = [(4, 4, 3, 1, 6, 6), (3, 8, 3, 1, 5, 7), (4, 16, 3, 2, 8, 6), (8, 4, 3, 1, 5, 5),
         (4, 4, 5, 1, 7, 7), (4, 16, 3, 2, 2, 2), (8, 8, 1, 1, 1, 1)]


def random_layer(cin: int, cout: int, k: int, stride: int, seed: int = 0) -> SLLConv:
    return checks.randomise_parameters(SLLConv(cin, cout, k, stride).double().eval(), seed)


@pytest.mark.parametrize("cin, cout, k, stride, h, w", CASES)
def test_stand_in_equals_the_eval_layer(cin, cout, k, stride, h, w):
    layer = random_layer(cin, cout, k, stride, seed=cin + 10 * cout + h)
    x = torch.randn(3, cin, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    standin = checks.check_export_module(layer, ExportedSLL, x)
    assert torch.equal(standin.scale2.reshape(-1), 2 * layer.eval_scale())


def test_stand_in_is_baked():
    layer = random_layer(4, 4, 3, 1)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    checks.check_export_follows(layer, lambda: layer.weight.mul_(1.5), x)


@pytest.mark.parametrize("stride, size", [(1, 6), (2, 2)])
def test_stand_in_survives_torch_export(stride, size):
    layer = random_layer(4, 4 * stride**2, 3, stride, seed=stride)
    program = checks.check_aten_program(layer.export_module(), torch.randn(2, 4, size, size, dtype=torch.float64))
    x = torch.randn(5, 4, size, size, dtype=torch.float64)
    with torch.no_grad():
        assert checks.relative_error(program(x), layer(x)) <= 1e-12
