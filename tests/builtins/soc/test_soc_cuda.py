"""SOC on CUDA (``cuda`` marker; skipped without a GPU): ``soc-fast`` and ``soc`` compute the
same forward bit for bit and the same input gradient, and the fast weight gradient points the
way of the exact one, for every layer shape LipConvnet uses (3×3 and 1×1, stride 1 and 2)."""

from __future__ import annotations

import pytest
import torch

from lipcli.builtins.soc.layer import SOC
from lipcli.numerics.precision import full_float32_precision

SHAPES = [(32, 32, 3, 1, 32), (64, 256, 3, 2, 16), (256, 1024, 3, 2, 4), (512, 2048, 1, 2, 2),
          (2048, 2048, 1, 1, 1)]


def check_fast_matches_exact(device: torch.device, c_in: int, c_out: int, k: int, s: int,
                             hw: int) -> None:
    torch.manual_seed(0)
    fast = SOC(c_in, c_out, k, s, fast_grad=True).to(device)
    exact = SOC(c_in, c_out, k, s, fast_grad=False).to(device)
    exact.load_state_dict(fast.state_dict())
    x = torch.randn(16, c_in, hw, hw, device=device)
    g = torch.randn(16, c_out, hw // s, hw // s, device=device)
    outs = []
    with full_float32_precision():
        for layer in (fast, exact):
            xr = x.clone().requires_grad_(True)
            z = layer(xr)
            (z * g).sum().backward()
            outs.append((z.detach(), xr.grad, layer.weight.grad))
    (zf, gxf, gwf), (ze, gxe, gwe) = outs
    assert torch.equal(zf, ze), "soc-fast and soc forwards differ"
    err = float((gxf - gxe).norm() / gxe.norm())
    assert err < 1e-5, f"input gradients differ: relative error {err:.2e}"
    cos = float(torch.nn.functional.cosine_similarity(gwf.double().flatten(),
                                                      gwe.double().flatten(), dim=0))
    assert cos > 0.99, f"filter gradient cosine fast/exact {cos:.6f}"


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "{}-{}-k{}-s{}-{}px".format(*s))
def test_soc_fast_matches_exact_on_cuda(shape):
    check_fast_matches_exact(torch.device("cuda"), *shape)
