"""The verified λ_max engine (lipcli.numerics.eigen): never below the exact largest eigenvalue
(float64 eigvalsh, or exact rescaling by powers of two), within the promised tightness, and
the rounding margins really applied -- cases where the estimate alone would under-claim, nearly
equal eigenvalues, tiny and huge scales, corrupted start vectors."""

from __future__ import annotations

import math

import pytest
import torch

from lipcli.numerics import eigen, rounding
from lipcli.numerics.eigen import (
    certify_lambda_max,
    krylov_lambda_max_estimate,
    lanczos_lambda_max,
    psd_lambda_max_upper_bound,
    symmetric_lambda_max_upper_bound,
)

RTOL = 1e-3
KRYLOV_RTOL = 2e-6  # the curvature bounds' tightness


def top(B: torch.Tensor) -> float:
    return float(torch.linalg.eigvalsh(0.5 * (B + B.T))[-1])


def with_spectrum(values: list[float] | torch.Tensor, seed: int) -> torch.Tensor:
    """Q diag(values) Qᵀ for a random orthogonal Q (float64)."""
    values = torch.as_tensor(values, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(values), len(values), generator=gen, dtype=torch.float64))
    B = (Q * values) @ Q.T
    return 0.5 * (B + B.T)


def test_psd_lambda_max_bound():
    gen = torch.Generator().manual_seed(4)
    W = torch.randn(300, 80, generator=gen, dtype=torch.float64)
    d = torch.rand(300, generator=gen, dtype=torch.float64)
    B = W.T @ (d[:, None] * W)
    true = top(B)
    bound = psd_lambda_max_upper_bound(B)
    assert true <= bound <= true * (1 + 2 * RTOL)
    assert isinstance(bound, float)


def test_symmetric_bound_indefinite_and_nonsymmetric():
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(50, 50, generator=gen, dtype=torch.float64)
    for B in (X + X.T, -(X @ X.T) - torch.eye(50, dtype=torch.float64), X):
        sym = 0.5 * (B + B.T)
        true = top(B)
        for estimator in eigen.ESTIMATORS:
            bound = symmetric_lambda_max_upper_bound(B, estimator=estimator)
            assert true <= bound <= true + 2 * RTOL * float(torch.linalg.matrix_norm(sym, 2))


@pytest.mark.parametrize("n", [1, 5, 40, 300])  # 300: block Krylov rather than eigvalsh
def test_krylov_estimator_is_tight_to_its_rtol(n):
    gen = torch.Generator().manual_seed(n)
    b = torch.randn(n + 3, n, generator=gen, dtype=torch.float64)
    a = b.T @ b - 0.5 * torch.eye(n, dtype=torch.float64)  # indefinite shifts too
    exact = top(a)
    bound = symmetric_lambda_max_upper_bound(a, rtol=KRYLOV_RTOL, estimator="krylov")
    assert exact <= bound <= exact + 1e-5 * max(abs(exact), 1.0)
    assert abs(krylov_lambda_max_estimate(a) - exact) <= 1e-5 * max(abs(exact), 1.0)


def test_rump_shift_is_applied_when_the_estimate_under_claims():
    """A candidate just below λ_max, and first gaps far below Rump's shift c: the factorisation
    of X̂ − cI must fail until λ̄ exceeds λ_max by about c.  Without the shift (or with the
    estimate taken as the answer) the bound would be below or within rounding of λ_max."""
    p = 300  # Rump's c ≈ 2e-11, well above the final relative margin 1e-12
    gen = torch.Generator().manual_seed(9)
    v = torch.randn(p, generator=gen, dtype=torch.float64)
    B = torch.outer(v, v) / float(v @ v)  # rank one, λ_max ≈ 1
    true = top(B)
    estimate = true - 1e-13
    bound = certify_lambda_max(B.clone(), estimate, 0.0, 1e-6)  # first gap 1e-15
    assert bound is not None and bound >= true
    g = rounding.gamma(p + 1)
    shift = 2 * g / (1 - g) * (p - 1)  # ≈ Rump's c for tr(X̂) ≈ p·1 − tr(B)
    assert bound - true >= 0.5 * shift  # the shift, not the 1e-15 gap, decided the bound
    # a candidate far too low is rejected and the gap grows until it certifies
    assert certify_lambda_max(B.clone(), 0.5, 1e-3, 1.0) >= true


def test_candidate_is_rejected_by_cholesky_not_accepted(monkeypatch):
    """B = I + 9vvᵀ: with a start vector orthogonal to v Lanczos sees only the eigenvalue 1
    (the estimate under-claims by a factor 10); the certificate must reject the low
    candidates -- by the diagonal check, then by failed Cholesky factorisations -- and retry
    upwards."""
    p = 40
    v = torch.ones(p, dtype=torch.float64) / math.sqrt(p)
    B = torch.eye(p, dtype=torch.float64) + 9.0 * torch.outer(v, v)
    start = torch.zeros(p, dtype=torch.float64)
    start[0], start[1] = 1.0, -1.0  # orthogonal to v
    theta, _ = lanczos_lambda_max(B, start, 32, RTOL)
    assert theta < 1.5  # the naive estimate would under-claim
    outcomes: list[bool] = []
    real = eigen.cholesky_succeeds
    monkeypatch.setattr(eigen, "cholesky_succeeds", lambda X: outcomes.append(real(X)) or outcomes[-1])
    assert symmetric_lambda_max_upper_bound(B, start=start) >= top(B)
    assert outcomes[-1] and not any(outcomes[:-1]) and len(outcomes) > 1


@pytest.mark.parametrize("estimator", eigen.ESTIMATORS)
@pytest.mark.parametrize("second", [1.0, 1.0 - 1e-12, 1.0 - 1e-9])
def test_nearly_equal_top_eigenvalues(estimator, second):
    values = torch.cat([torch.tensor([1.0, second]), torch.linspace(0.9, -0.5, 38)])
    B = with_spectrum(values, seed=3)
    true = top(B)
    rtol = RTOL if estimator == "lanczos" else KRYLOV_RTOL
    bound = symmetric_lambda_max_upper_bound(B, rtol=rtol, estimator=estimator)
    assert true <= bound <= true * (1 + 3 * rtol)


@pytest.mark.parametrize("k", [-1070, -1000, -600, -200, 300, 1000])
def test_tiny_and_huge_scales(k):
    """B·2ᵏ has exactly the eigenvalues of B times 2ᵏ (entries rescaled exactly, except in the
    subnormal range, where the reference is the rounded matrix rescaled back exactly).  A
    matrix whose norm underflows (k = -600) must not be mistaken for zero."""
    B = with_spectrum(torch.linspace(2.0, -1.0, 12), seed=4)
    Bk = B * 2.0 ** (k // 2) * 2.0 ** (k - k // 2)
    back = Bk * 2.0 ** (-(k // 2)) * 2.0 ** (-(k - k // 2))  # exact: scaling up / normal range
    true_scaled = top(back)  # λ_max(Bk) = 2ᵏ·λ_max(back)
    for fn in (symmetric_lambda_max_upper_bound, psd_lambda_max_upper_bound):
        bound = fn(Bk)
        assert bound > 0.0
        assert math.ldexp(bound, -k) >= true_scaled
        assert math.ldexp(bound, -k) <= true_scaled * (1 + 3 * RTOL) + math.ldexp(4 * eigen.ETA, -k)


@pytest.mark.parametrize("bad", ["nan", "inf", "zeros", "wrong_size"])
def test_corrupted_start_vector_falls_back_to_the_seeded_one(bad):
    B = with_spectrum(torch.linspace(3.0, 0.0, 30), seed=6)
    start = {
        "nan": torch.full((30,), math.nan, dtype=torch.float64),
        "inf": torch.full((30,), math.inf, dtype=torch.float64),
        "zeros": torch.zeros(30, dtype=torch.float64),
        "wrong_size": torch.ones(7, dtype=torch.float64),
    }[bad]
    bound = symmetric_lambda_max_upper_bound(B, start=start)
    assert bound == symmetric_lambda_max_upper_bound(B)  # the same fixed-seed start vector
    assert top(B) <= bound <= top(B) * (1 + 2 * RTOL)


def test_matrix_err_is_added():
    """The caller's ‖A − B‖₂ ≤ e is honoured: here A = B + e·vvᵀ (v the top eigenvector) has
    λ_max(A) = λ_max(B) + e exactly, above the bound for B alone."""
    B = with_spectrum(torch.linspace(1.0, 0.0, 20), seed=7)
    e = 1e-3
    plain = symmetric_lambda_max_upper_bound(B, rtol=1e-6, estimator="krylov")
    assert plain < top(B) + e
    bound = symmetric_lambda_max_upper_bound(B, rtol=1e-6, estimator="krylov", matrix_err=e)
    assert bound >= top(B) + e
    assert bound <= (plain + e) * (1 + 3e-12)


def test_frobenius_fallback(monkeypatch):
    monkeypatch.setattr(eigen, "MAX_CERT_ATTEMPTS", 0)
    X = torch.randn(30, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    B = X @ X.T
    fro = float(torch.linalg.matrix_norm(B, "fro"))
    for estimator in eigen.ESTIMATORS:
        bound = symmetric_lambda_max_upper_bound(B, estimator=estimator)
        assert fro <= bound <= fro * (1 + 1e-9)


def test_zero_and_invalid_matrices():
    assert psd_lambda_max_upper_bound(torch.zeros(4, 4)) == 0.0
    assert symmetric_lambda_max_upper_bound(torch.zeros(3, 3), matrix_err=0.5) >= 0.5
    with pytest.raises(ValueError):
        psd_lambda_max_upper_bound(torch.ones(2, 3))
    with pytest.raises(ValueError):
        psd_lambda_max_upper_bound(torch.zeros(0, 0))
    with pytest.raises(ValueError):
        psd_lambda_max_upper_bound(torch.tensor([[1.0, math.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError):
        symmetric_lambda_max_upper_bound(torch.eye(3), estimator="power")
    with pytest.raises(ValueError):
        symmetric_lambda_max_upper_bound(torch.eye(3), matrix_err=-1.0)


def test_rounding_model():
    assert rounding.gamma(1) == pytest.approx(2.0**-53, rel=1e-15)
    with pytest.raises(ValueError):
        rounding.gamma(2**52)  # n·u = ½: no rounding analysis
    assert rounding.round_up(-1.0) > -1.0 and rounding.round_up(1.0) > 1.0
    for value in (3.0, 1e-300, 1e300):
        assert 0.5 <= value * rounding.pow2_scale(value) < 1.0


def test_block_krylov_estimate_never_changes_the_process_thread_count(monkeypatch):
    """Issue 26 item 4: the estimator used to switch torch to one thread around its QRs and
    back, and a changed thread count made later batched complex64 solves (the Cayley layer's)
    return wrong matrices or crash on MKL.  It must not touch the setting at all."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    gen = torch.Generator().manual_seed(3)
    b = torch.randn(303, 300, generator=gen, dtype=torch.float64)
    a = b.T @ b
    exact = top(a)
    bound = symmetric_lambda_max_upper_bound(a, rtol=KRYLOV_RTOL, estimator="krylov")
    assert exact <= bound <= exact * (1 + 1e-5)
    assert calls == []


def test_library_code_never_sets_the_thread_count():
    """``torch.set_num_threads`` is process-global: only ``lip bench --threads`` (the user's
    explicit request, applied once before any computation) may call it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    allowed = {Path("lipcli/cli/common.py")}  # apply_threads: the command line's --threads, at a command's start
    offenders = []
    for base in (root / "lipcli", root / "plugins"):
        for path in base.rglob("*.py"):
            rel = path.relative_to(root)
            if "tests" in rel.parts or rel in allowed:
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                code = line.split("#", 1)[0]
                if "set_num_threads(" in code:
                    offenders.append(f"{rel}: {line.strip()}")
    assert offenders == []
