"""The closed-form CRC-Lip radius (lipcli.builtins.crc.closed_form, SPEC §4) on hand-computed
values, including the degenerate cases."""

from __future__ import annotations

import math

import pytest
import torch

from lipcli.builtins.crc.closed_form import closed_form_radius


def test_closed_form_formula():
    g = torch.tensor([1.0, 1.0, 0.0, -1.0, 2.0], dtype=torch.float64)
    gn = torch.tensor([2.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    k = torch.tensor([0.0, 3.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    r = closed_form_radius(g, gn, k)
    assert r[0].item() == pytest.approx(0.5)
    assert r[1].item() == pytest.approx((math.sqrt(4 + 6) - 2) / 3)
    assert r[2].item() == 0.0 and r[3].item() == 0.0
    assert math.isinf(r[4].item())
    # exactly the root of g - ‖∇g‖ρ - Kρ²/2 = 0
    rho = r[1].item()
    assert 1.0 - 2.0 * rho - 1.5 * rho**2 == pytest.approx(0.0, abs=1e-12)
