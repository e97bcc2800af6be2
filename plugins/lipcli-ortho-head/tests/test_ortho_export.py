"""``lip export`` of the ``ortho`` head and ``--certify`` with the ``margin`` certificate:
the head's stand-in is the applied matrix (float32 and float64), the exported certificate
gives lipcli's own predictions and radii, both survive ``torch.export`` as aten operations
only, and heads the protocol cannot lower (or without a bound) are refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.sdk.export import ExportError
from lipcli.sdk.errors import LipError
from lipcli_ortho_head import MarginCertifier, OrthoHead
from lipcli_ortho_head.margin import MarginRadius
from lipcli_ortho_head.ortho import ExportedOrtho

import lipcli.testing as checks


def trained_looking(d: int, c: int, seed: int = 0) -> OrthoHead:
    head = OrthoHead(d, c)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen))
        head.bias.copy_(torch.randn(head.bias.shape, generator=gen))
    return head.eval()


@pytest.mark.parametrize("d, c", [(16, 10), (4, 10)])  # orthonormal rows; columns (c > D)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_head_stand_in_is_the_applied_matrix(d, c, dtype):
    head = trained_looking(d, c).to(dtype)
    standin = head.export_module()
    assert isinstance(standin, ExportedOrtho) and not list(standin.parameters())
    assert torch.equal(standin.weight, head.normalized_weight().to(dtype))
    y = torch.randn(7, d, dtype=dtype)
    with torch.no_grad():
        ref = head(y)
        # float32: the same products, possibly summed in another order (memory layout)
        tol = float(ref.abs().max()) * (1e-12 if dtype == torch.float64 else 1e-6)
        torch.testing.assert_close(standin(y), ref, rtol=0, atol=tol)
        torch.testing.assert_close(checks.check_aten_program(standin, y[:2])(y), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("d, c", [(16, 10), (4, 10)])
def test_exported_margin_certificate_equals_lipcli(d, c):
    head = trained_looking(d, c, seed=d)
    certifier = MarginCertifier()
    exported = certifier.export_certificate(head)
    assert isinstance(exported.module, MarginRadius) and exported.kind == "margin"
    assert exported.record["head_lipschitz_bound"] == head.lipschitz_upper_bound()
    features = 3 * torch.randn(64, d, generator=torch.Generator().manual_seed(1))
    certifier.prepare(head)
    ref = certifier.certify(head, features)
    with torch.no_grad():
        pred, radius = exported.module(features)
        program_pred, program_radius = checks.check_aten_program(exported.module, features[:2])(features)
    assert radius.dtype == torch.float64 and (ref.radius > 0).any()
    for p, r in ((pred, radius), (program_pred, program_radius)):
        assert torch.equal(p, ref.predictions)
        torch.testing.assert_close(r, ref.radius, rtol=1e-12, atol=0)
    torch.testing.assert_close(exported.reference(features), ref.radius, rtol=0, atol=0)


class TanhHead(nn.Module):
    """A bounded third-party head without ``export_module()``: not plain ``torch.nn``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, y):
        return self.fc(torch.tanh(y))

    def lipschitz_upper_bound(self) -> float:
        return 10.0


def test_heads_the_protocol_cannot_lower_or_bound_are_refused():
    with pytest.raises(ExportError, match="TanhHead has no export_module"):
        MarginCertifier().export_certificate(TanhHead())
    with pytest.raises(LipError, match="needs a guaranteed Lipschitz bound"):
        MarginCertifier().export_certificate(nn.Linear(4, 3))
