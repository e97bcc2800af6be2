"""``lipcli.testing.check_conv_spec`` checks a ``"1-lipschitz"`` promise with every parameter
perturbed, not only as built: a learnable scale that starts at 1 passes as built and fails."""

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
