"""``lipcli.testing.check_conv_spec`` checks a ``"1-lipschitz"`` promise with every parameter
perturbed, not only as built: a learnable scale that starts at 1 passes as built and fails;
and a non-affine layer (``lip_affine = False``) against Jacobians at several points."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, ConvSpec
from lipcli.testing import check_conv_spec


class ScaledSubsample(nn.Module):
    """Every ``stride``-th pixel, channels cut or padded with zeros to ``out_channels``, times a
    learnable scale (a linear map with spectral norm ``|scale|``: 1 as built)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int,
                 bounded: bool = False) -> None:
        super().__init__()
        self.out_channels, self.stride, self.bounded = out_channels, stride, bounded
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x[:, :, :: self.stride, :: self.stride][:, : self.out_channels]
        y = nn.functional.pad(y, (0, 0, 0, 0, 0, self.out_channels - y.shape[1]))
        return y * (torch.tanh(self.scale) if self.bounded else self.scale)


def _spec(bounded: bool) -> ConvSpec:
    return ConvSpec(name="scaled-sub", promises=(ONE_LIPSCHITZ,),
                    factory=lambda cin, cout, k, s: ScaledSubsample(cin, cout, k, s, bounded),
                    description="strided subsampling times a learnable scale")


def test_a_conv_whose_learnable_scale_breaks_its_promise_fails():
    with pytest.raises(AssertionError, match=r"conv 'scaled-sub' .* with .*parameters.*promises "
                                             r"'1-lipschitz' but the Jacobian's spectral norm"):
        check_conv_spec(_spec(bounded=False))


def test_a_conv_that_keeps_its_promise_for_every_parameter_passes():
    reports = check_conv_spec(_spec(bounded=True))  # tanh(scale): |factor| < 1 for every scale
    assert reports and all(r.sigma_max <= 1 + 1e-12 for r in reports)


class KinkedSubsample(nn.Module):
    """A non-affine map ``x ↦ c · relu(s(x)) + (1 − c) · s(x)`` with the 1-Lipschitz
    subsampling ``s`` (zero channels / cut as above): Lipschitz constant ``max(1, |1 − c|)``
    (slopes ``1`` and ``1 − c``), declared as ``claimed``."""

    lip_affine = False

    def __init__(self, cin, cout, k, s, *, c: float, claimed: float, declare: bool = True) -> None:
        super().__init__()
        self.sub = ScaledSubsample(cin, cout, k, s, bounded=False)
        self.sub.scale.requires_grad_(False)
        self.c, self.claimed = c, claimed
        if not declare:
            self.lip_affine = True

    def forward(self, x):
        y = self.sub(x)
        return self.c * torch.relu(y) + (1 - self.c) * y

    def lipschitz_upper_bound(self) -> float:
        return self.claimed


def _nonlinear(c: float, claimed: float, declare: bool = True) -> ConvSpec:
    return ConvSpec(name="kinked", description="a piecewise-linear non-affine map",
                    factory=lambda cin, cout, k, s: KinkedSubsample(
                        cin, cout, k, s, c=c, claimed=claimed, declare=declare))


def test_a_non_affine_conv_is_checked_with_jacobians_at_several_points():
    """``lip_affine = False``: slopes 1 and -2 (c = 3) give Lipschitz constant 2 — a claimed
    bound of 2 passes, 1.5 is caught; undeclared, the layer is refused as not affine."""
    reports = check_conv_spec(_nonlinear(3.0, 2.0))
    assert all(1.99 < r.sigma_max <= 2.0 for r in reports)
    with pytest.raises(AssertionError, match="declared bound"):
        check_conv_spec(_nonlinear(3.0, 1.5))
    with pytest.raises(AssertionError, match="is not affine"):
        check_conv_spec(_nonlinear(3.0, 2.0, declare=False))
