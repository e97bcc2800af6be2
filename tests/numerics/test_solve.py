"""The checked solve: a correct batched solve is returned bit for bit; a wrong or failing one
(as the batched LAPACK solve does under several threads) is redone one matrix at a time in
double precision; wrong even then is a LipError, never a wrong operator."""

from __future__ import annotations

import pytest
import torch

from lipcli.numerics.solve import checked_solve, solve_residual_ok
from lipcli.sdk.errors import LipError


def _system(left: bool, dtype=torch.complex64):
    g = torch.Generator().manual_seed(0)
    V = torch.randn(6, 24, 8, dtype=torch.complex128, generator=g).to(dtype)
    A = V.mH @ V + 0.1 * torch.eye(8, dtype=dtype)
    B = torch.randn(6, 8, 5, dtype=torch.complex128, generator=g).to(dtype)
    return A, (B if left else B.mT)


@pytest.mark.parametrize("left", [True, False])
def test_a_correct_solve_is_returned_unchanged(left):
    A, B = _system(left)
    X = checked_solve(A, B, left=left)
    assert torch.equal(X, torch.linalg.solve(A, B, left=left))
    assert solve_residual_ok(A, B, X, left=left) and not solve_residual_ok(A, B, X.flip(-1), left=left)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("failure", ["wrong", "nan", "raise"])
def test_a_failed_batched_solve_is_redone_per_matrix(monkeypatch, left, failure):
    A, B = _system(left)
    real = torch.linalg.solve

    def batched_fails(a, b, *, left=True):
        if a.dim() == 2:  # one matrix at a time: correct
            return real(a, b, left=left)
        if failure == "raise":
            raise RuntimeError("Pivots given to lu_solve must all be greater or equal to 1.")
        x = real(a, b, left=left)
        return x.flip(-1) if failure == "wrong" else x * float("nan")

    monkeypatch.setattr(torch.linalg, "solve", batched_fails)
    X = checked_solve(A, B, left=left)
    assert X.dtype == B.dtype and X.shape == B.shape
    want = real(A.to(torch.complex128), B.to(torch.complex128), left=left)
    assert torch.allclose(X.to(torch.complex128), want, atol=1e-5)


def test_wrong_even_per_matrix_is_an_error(monkeypatch):
    A, B = _system(True)
    real = torch.linalg.solve
    monkeypatch.setattr(torch.linalg, "solve", lambda a, b, *, left=True: real(a, b, left=left) * 2)
    with pytest.raises(LipError, match="BRO ridge reflector: the linear solve returned a wrong result"):
        checked_solve(A, B, left=True, what="BRO ridge reflector")
