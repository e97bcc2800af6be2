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
