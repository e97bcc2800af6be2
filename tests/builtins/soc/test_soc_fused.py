"""lipcli.builtins.soc.fused: the fused filter-gradient kernel's reference form equals the
layer's gradient, the CPU path never uses it, and a failing compiler falls back to eager."""

from __future__ import annotations

import pytest
import torch

from lipcli.builtins.soc import filters
from lipcli.builtins.soc import fused as soc_fused
from lipcli.builtins.soc import power as soc_power
from lipcli.builtins.soc.layer import SOC


def _layer_gradient(C: int, k: int, fused: bool, device: str = "cpu", dtype=torch.float64):
    torch.manual_seed(0)
    layer = SOC(C, C, k).to(device=device, dtype=dtype).train()
    G = torch.randn(C, C, k, k, dtype=dtype, device=device)
    old = soc_fused.FUSED_FILTER
    soc_fused.FUSED_FILTER = fused
    try:
        S = layer._compute_S(1)
        (S * G).sum().backward()
    finally:
        soc_fused.FUSED_FILTER = old
    return layer, S.detach(), G, layer.weight.grad


@pytest.mark.parametrize("C,k", [(8, 3), (12, 1), (6, 5)])
def test_reference_form_is_the_layer_gradient(C, k):
    layer, S, G, grad = _layer_gradient(C, k, fused=False)
    # the same quantities as _NormalisedSkew.backward sees, through the reference form
    torch.manual_seed(0)
    twin = SOC(C, C, k).double().train()
    with torch.no_grad():
        D = filters._skew_difference(twin.weight)
        q = twin._power_iterate(D, 1)
        r = int(torch.argmin(torch.stack([x[0] for x in q])))
        rho, u, v = q[r]
    ref = soc_fused.skew_gradient_eager(G, D / rho, rho, [filters._rank_one_factors(r, u, v, C, k)])
    assert torch.allclose(ref, grad, rtol=1e-12, atol=1e-14)
    # and the gradient autograd gives through A = (W - T(W))/2, sigma = u'R(A)v, S = A/sigma
    W = twin.weight.detach().clone().requires_grad_(True)
    A = 0.5 * (W - filters.transpose_filter(W))
    from lipcli.numerics.conv import conv_reshape

    sigma = u @ conv_reshape(A, r) @ v
    ((A / sigma) * G).sum().backward()
    assert torch.allclose(W.grad, ref, rtol=1e-10, atol=1e-12)


def test_cpu_never_uses_the_fused_kernels(monkeypatch):
    monkeypatch.setattr(soc_fused, "FUSED_FILTER", True)
    calls = []
    monkeypatch.setattr(soc_fused, "_skew_gradient_fused", lambda *a: calls.append(a))
    monkeypatch.setattr(soc_power, "_power_steps_fused", lambda *a: calls.append(a))
    _, _, _, grad = _layer_gradient(8, 3, fused=True)
    _, _, _, plain = _layer_gradient(8, 3, fused=False)
    assert calls == [] and torch.equal(grad, plain)


def test_a_failing_compiler_falls_back_to_eager_and_says_why(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("no C compiler found\ndetails")

    monkeypatch.setattr(torch, "compile", broken)
    wrapped = soc_fused._CompiledOrEager("test_kernel", soc_fused.skew_gradient_eager)
    G, S = torch.randn(4, 4, 3, 3), torch.randn(4, 4, 3, 3)
    rho = torch.tensor(2.0)
    fac = [(torch.randn(4, 1, 3, 1), torch.randn(1, 4, 1, 3))]
    out = wrapped(G, S, rho, fac)
    assert torch.equal(out, soc_fused.skew_gradient_eager(G, S, rho, fac))
    assert soc_fused.FUSION_STATUS["test_kernel"] == (
        "eager: compilation failed (RuntimeError: no C compiler found)")
    assert torch.equal(wrapped(G, S, rho, fac), out)  # not retried


@pytest.mark.cuda
@pytest.mark.parametrize("C,k", [(64, 3), (256, 1)])
def test_fused_kernel_on_cuda_matches_the_eager_gradient(C, k):
    _, S_eager, _, eager = _layer_gradient(C, k, fused=False, device="cuda", dtype=torch.float32)
    _, S_fused, _, fused = _layer_gradient(C, k, fused=True, device="cuda", dtype=torch.float32)
    assert soc_fused.FUSION_STATUS["skew_gradient"] == "compiled", soc_fused.FUSION_STATUS
    assert soc_fused.FUSION_STATUS["power_steps"] == "compiled", soc_fused.FUSION_STATUS
    assert ((S_fused - S_eager).norm() / S_eager.norm()).item() < 1e-5
    assert torch.equal(S_fused, -filters.transpose_filter(S_fused))  # still exactly skew
    assert ((fused - eager).norm() / eager.norm()).item() < 1e-5
