"""so-adam: the Lie-algebra gradient, FastExp, staying on the manifold, Lookahead, resume."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lipcli.sdk.orthogonal import declare_orthogonal, orthogonal_parameters, orthogonality_defect, random_orthogonal
from lipcli_lipnext.fastexp import THRESHOLDS, fast_exp, fast_exp_order, lie_gradient, polar, taylor_exp
from lipcli_lipnext.so_adam import SOAdam

D = torch.float64


def skew(n, norm, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(n, n, dtype=D, generator=g)
    S = B - B.T
    return S * (norm / torch.linalg.matrix_norm(S))


def test_lie_gradient_is_the_derivative_along_every_skew_direction():
    g = torch.Generator().manual_seed(1)
    for shape in ((5, 5), (3, 6)):
        X = random_orthogonal(*shape, generator=g).double()
        T = torch.randn(shape, dtype=D, generator=g)
        X.requires_grad_(True)
        f = lambda Y: (torch.tanh(Y) * T).sum() + (Y ** 3).sum()  # noqa: E731
        (G,) = torch.autograd.grad(f(X), X)
        A = lie_gradient(X.detach(), G)
        assert torch.equal(A, -A.T)  # exactly skew
        for k in range(3):
            Om = skew(shape[1], 1.0, seed=10 + k)
            t = torch.zeros((), dtype=D, requires_grad=True)
            (dt,) = torch.autograd.grad(f(X.detach() @ torch.linalg.matrix_exp(t * Om)), t)
            assert float(dt) == pytest.approx(float((A * Om).sum()), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("norm", [0.01, 0.049, 0.05, 0.2, 0.26, 0.9, 1.0, 2.5])
def test_fast_exp_matches_matrix_exp_within_its_order(norm):
    U = skew(12, norm)
    E, order = fast_exp(U)
    expect = next((o for edge, o in THRESHOLDS if norm < edge), 0)
    assert order == expect == fast_exp_order(U)
    exact = torch.linalg.matrix_exp(U)
    err = float(torch.linalg.matrix_norm(E - exact))
    if order == 0:
        assert err < 1e-12
    else:
        tail = norm ** (order + 1) / math.factorial(order + 1) * math.exp(norm)
        assert err <= tail * (1 + 1e-9) + 1e-15
        assert err >= 0.01 * tail or order == 4  # really truncated at that order (not higher)
        assert torch.allclose(taylor_exp(U, order), E)


def test_polar_restores_the_manifold():
    X = random_orthogonal(4, 9).double() + 1e-3 * torch.randn(4, 9, dtype=D)
    assert orthogonality_defect(X) > 1e-4
    assert orthogonality_defect(polar(X)) < 1e-13


class Toy(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.R = nn.Parameter(random_orthogonal(2, 6, 6, generator=g))
        self.S = nn.Parameter(random_orthogonal(3, 6, generator=g))
        self.b = nn.Parameter(torch.zeros(6))
        declare_orthogonal(self, "R")
        declare_orthogonal(self, "S", "stiefel")

    def forward(self, x):
        y = x @ self.R[0].T @ self.R[1].T + self.b
        return y @ self.S.T


def make(model, lookahead=0, lr=0.01, **kw):
    euclid = torch.optim.Adam([model.b], lr=lr)
    return SOAdam(euclid, orthogonal_parameters(model), lr=lr, lookahead=lookahead, **kw)


TEACHER = Toy(seed=7).requires_grad_(False)


def train(model, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 6, generator=g)
        loss = ((model(x) - TEACHER(x)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("lookahead", [0, 3])
def test_many_steps_stay_on_the_manifold_and_learn(lookahead):
    model = Toy()
    opt = make(model, lookahead=lookahead, retract_tol=1e-6)
    b0 = model.b.detach().clone()
    losses = train(model, opt, 300)
    assert sum(losses[-20:]) < 0.5 * sum(losses[:20])  # it learns
    assert not torch.equal(model.b, b0)  # the Euclidean part steps too
    for X in (model.R, model.S):
        assert orthogonality_defect(X) < 1e-5  # 300 float64 updates (mostly order 2), float32 storage
    opt.end_epoch()
    for X in (model.R, model.S):
        assert orthogonality_defect(X) < 1e-6
    assert sum(opt.orders.values()) == 300 * 2 + (100 * 2 if lookahead else 0)


def test_update_is_skew_so_exact_exponential_keeps_float64_orthogonal():
    model = Toy().double()
    for p in (model.R, model.S):
        p.data = polar(p)
    opt = make(model, exact=True, lr=0.3)
    for _ in range(5):
        model.R.grad, model.S.grad = torch.randn_like(model.R), torch.randn_like(model.S)
        opt.step()
    assert opt.orders == {"exact": 10}
    assert orthogonality_defect(model.R) < 1e-13 and orthogonality_defect(model.S) < 1e-13


def test_state_dict_resume_is_bit_identical():
    a, b = Toy(), Toy()
    oa, ob = make(a, lookahead=4), make(b, lookahead=4)
    train(a, oa, 10, seed=3)
    train(b, ob, 10, seed=3)
    state = ob.state_dict()
    c = Toy(seed=5)
    c.load_state_dict(b.state_dict())
    oc = make(c, lookahead=4)
    oc.load_state_dict(state)
    train(a, oa, 7, seed=4)
    train(c, oc, 7, seed=4)
    for k, v in a.state_dict().items():
        assert torch.equal(v, c.state_dict()[k]), k


def test_a_model_without_declared_parameters_is_refused():
    with pytest.raises(ValueError, match="declared orthogonal"):
        SOAdam(None, [], lr=0.1)
