"""SLLDense: the dense T formula, the verified bound against dense Jacobians and pair ratios
(random, perturbed, briefly trained; float32 numbers cast exactly), gradients, the export
stand-in."""

from __future__ import annotations

import pytest
import torch

from lipcli.testing import perturbed_copies
from lipcli_sll import SLLDense, sll_t
from lipcli_sll.dense import ExportedSLLDense


def jacobian_norm(fn, x: torch.Tensor) -> float:
    jac = torch.autograd.functional.jacobian(fn, x)
    return float(torch.linalg.matrix_norm(jac.reshape(x.numel(), x.numel()), ord=2))


def worst(fn, features: int, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    out = jacobian_norm(fn, torch.zeros(features, dtype=torch.float64))
    for i in range(6):
        x = (0.5 * 2 ** (i % 3)) * torch.randn(features, generator=gen, dtype=torch.float64)
        out = max(out, jacobian_norm(fn, x))
        y = x + 10.0 ** (1 - i % 3) * torch.randn(features, generator=gen, dtype=torch.float64)
        with torch.no_grad():
            out = max(out, float((fn(x) - fn(y)).norm() / (x - y).norm()))
    return out


def randomised(layer: SLLDense, seed: int) -> SLLDense:
    layer = layer.double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return layer


def test_dense_t_is_the_papers_formula():
    gen = torch.Generator().manual_seed(0)
    K = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    log_q = torch.randn(6, generator=gen, dtype=torch.float64)
    q = log_q.exp()
    expected = ((K @ K.T).abs() * q[None, :] / q[:, None]).sum(dim=1)
    torch.testing.assert_close(sll_t(K[:, :, None, None], log_q), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("features, hidden", [(6, None), (5, 9), (8, 3)])
def test_jacobians_and_ratios_below_the_bound(features, hidden):
    layer = randomised(SLLDense(features, hidden), seed=features)
    for i, (how, moved) in enumerate([("random", layer), *perturbed_copies(layer, (features,), seed=1)]):
        bound = moved.lipschitz_upper_bound()
        assert bound <= 1 + 1e-9, how
        assert 0.99 < worst(moved, features, seed=i) <= bound * (1 + 1e-12), how


def test_float32_numbers_cast_exactly():
    layer = SLLDense(16).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    bound = layer.lipschitz_upper_bound()
    assert 1.0 <= bound < 1.0 + 1e-4
    w, b, s = (t.detach().double() for t in (layer.weight, layer.bias, layer.eval_scale()))

    def exact(x):
        return x - (2 * s * torch.relu(w @ x + b)) @ w

    assert worst(exact, 16, seed=3) <= bound * (1 + 1e-12)


def test_gradients_and_stand_in():
    layer = randomised(SLLDense(4, 6), seed=2).train()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,), eps=1e-6, atol=1e-6)
    layer.eval()
    standin = layer.export_module()
    assert isinstance(standin, ExportedSLLDense) and not list(standin.parameters())
    with torch.no_grad():
        torch.testing.assert_close(standin(x), layer(x), rtol=1e-12, atol=1e-12)
