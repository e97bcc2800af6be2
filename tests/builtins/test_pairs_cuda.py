"""MaxMin and channel-pair max pooling on CUDA (``cuda`` marker; skipped without a GPU): on a
channels-last input (the SOC series' CUDA layout) the outputs and the routed gradients equal
those of the explicit ``where`` formula exactly."""

from __future__ import annotations

import pytest
import torch

from lipcli.builtins.activations import max_min
from lipcli.builtins.pooling import ChannelMaxPool


def check_pair_routing(device: torch.device, layer_name: str) -> None:
    torch.manual_seed(0)
    layer = max_min if layer_name == "maxmin" else ChannelMaxPool(64).to(device)
    z = torch.randn(32, 64, 8, 8, device=device).contiguous(memory_format=torch.channels_last)
    zr = z.clone().requires_grad_(True)
    out = layer(zr)
    gout = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, zr, gout)
    zz = z.clone().requires_grad_(True)
    a, b = zz[:, :32], zz[:, 32:]
    ref = torch.where(a >= b, a, b)
    if layer_name == "maxmin":
        ref = torch.cat((ref, torch.where(a >= b, b, a)), 1)
    (want,) = torch.autograd.grad(ref, zz, gout)
    assert torch.equal(out, ref.detach()), f"{layer_name}: outputs differ"
    assert torch.equal(got, want), f"{layer_name}: gradients are routed differently"


@pytest.mark.cuda
@pytest.mark.parametrize("layer_name", ["maxmin", "max"])
def test_pair_gradients_route_exactly_on_cuda(layer_name):
    check_pair_routing(torch.device("cuda"), layer_name)
