"""Guaranteed curvature bounds of the CRC-Lip head (lipcli.builtins.crc.bounds): every level
dominates the exact eigenvalues (float64 eigvalsh), the table keeps the smallest, and the
bounds come from lipcli's one verified λ_max engine (lipcli.numerics.eigen)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crc_helpers import MLP
from lipcli.builtins.crc.bounds import CurvatureBounds
from lipcli.builtins.crc.weights import mlp_weights
from lipcli.numerics import eigen


@pytest.mark.parametrize("seed", [0, 1])
def test_pair_bounds_dominate_exact_eigenvalues(seed):
    head = MLP(5, 12, 4, scale=3.0, seed=seed)
    w = mlp_weights(head)
    w1_sq = CurvatureBounds.compute_w1_sq_bound(w)
    true_w1_sq = float(np.linalg.norm(w.w1.numpy(), 2) ** 2)
    assert true_w1_sq <= w1_sq <= true_w1_sq * (1 + 1e-5)
    bounds = CurvatureBounds(w, w1_sq)
    bounds.compute_class_bounds()
    w1, w2 = w.w1.numpy(), w.w2.numpy()
    for a in range(4):
        for b in range(4):
            if a == b:
                continue
            d_plus = np.maximum(w2[a] - w2[b], 0.0)
            exact = 0.25 * np.linalg.eigvalsh(w1.T @ np.diag(d_plus) @ w1).max()
            glob = float(bounds.global_table[a, b])
            split = bounds.class_pos[a] + bounds.class_neg[b]
            before = float(bounds.table[a, b])
            assert glob >= exact and split >= exact and before >= exact
            assert before <= min(glob, split) * (1 + 1e-12)
            tight = bounds.compute_exact(a, b)
            assert exact <= tight <= exact * (1 + 1e-5) + 1e-12
            assert float(bounds.table[a, b]) == min(tight, before)
    # class bounds are exact eigenvalues of P_a and N_b too
    for a in range(4):
        p_a = 0.25 * np.linalg.eigvalsh(w1.T @ np.diag(np.maximum(w2[a], 0)) @ w1).max()
        assert p_a <= bounds.class_pos[a] <= p_a * (1 + 1e-5) + 1e-12
    # m_lj = Λ(j, l) is what certifying class l against j uses
    m, exact_flags = bounds.lower_curvature(torch.tensor([2]))
    assert float(m[0, 1]) == float(bounds.table[1, 2]) and bool(exact_flags[0, 1])


def test_curvature_bounds_go_through_the_one_engine(monkeypatch):
    """With every Cholesky factorisation of the engine failing, the curvature bounds fall back
    to the engine's Frobenius bound: they are certified by lipcli.numerics.eigen, not by a
    private copy."""
    w = mlp_weights(MLP(5, 12, 4, scale=3.0, seed=0))
    certified = CurvatureBounds.compute_w1_sq_bound(w)
    calls = []
    monkeypatch.setattr(eigen, "cholesky_succeeds", lambda X: calls.append(1) and False)
    fallback = CurvatureBounds.compute_w1_sq_bound(w)
    assert calls
    w1 = w.w1.numpy()
    small = w1 @ w1.T if w1.shape[0] < w1.shape[1] else w1.T @ w1
    fro = float(np.linalg.norm(small, "fro"))
    assert fro <= fallback <= fro * (1 + 1e-9)
    assert certified < fallback  # the certified value was tighter: the engine was used
