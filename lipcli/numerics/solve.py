"""A batched linear solve checked by its residual (:func:`checked_solve`), for layers whose
operator is built from one (Cayley's ``B (I + M)⁻¹``, BRO's ridge reflector).

The batched LAPACK solve of this machine's torch (oneMKL) has raised ("Pivots given to
lu_solve", ``?LASWP`` parameter errors) and has returned NaN or wrong matrices without an
error when torch runs more than one thread on a batch of matrices of about 150 rows or more
(``torch.linalg.solve`` of 2 × 256 × 256 matrices at 2 threads: measured); one matrix at a time
it is correct.  A wrong operator would then be trained, or evaluated and certified without
being the layer's.  So the result is checked; if the check fails or the solve raises, every
matrix is solved again one at a time in double precision (rounded back to the input's dtype)
and checked again; if that fails too a :class:`~lipcli.sdk.errors.LipError` is raised rather
than a wrong operator used.  A correct first solve is returned unchanged (the same rounding
as an unchecked ``torch.linalg.solve``); the fallback is differentiable as well.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lipcli.sdk.errors import LipError

__all__ = ["RESIDUAL_FACTOR", "checked_solve", "solve_residual_ok"]

#: a solve whose residual exceeds this many ``n·u·‖X‖_F‖A‖_F`` is rejected (LU with partial
#: pivoting is backward stable: correct results measured at about 0.03 of one unit)
RESIDUAL_FACTOR = 64.0
_WIDER = {torch.float32: torch.float64, torch.complex64: torch.complex128}


def solve_residual_ok(A: Tensor, B: Tensor, X: Tensor, *, left: bool = False) -> bool:
    """Whether ``X`` solves ``A X = B`` (``left``) or ``X A = B`` (batched) to within
    ``RESIDUAL_FACTOR·n·u·‖X‖‖A‖`` (Frobenius norms, per matrix, ``u`` of ``X``'s precision)
    and is finite."""
    with torch.no_grad():
        X, A, B = X.detach(), A.detach(), B.detach()
        if not bool(torch.isfinite(X).all()):
            return False
        n = A.shape[-1]
        eps = torch.finfo(X.real.dtype if X.is_complex() else X.dtype).eps
        res = torch.linalg.matrix_norm((A @ X if left else X @ A) - B)
        scale = torch.linalg.matrix_norm(X) * torch.linalg.matrix_norm(A)
        return bool((res <= RESIDUAL_FACTOR * n * eps * scale).all())


def checked_solve(A: Tensor, B: Tensor, *, left: bool = False, what: str = "linear solve") -> Tensor:
    """``A⁻¹ B`` (``left``) or ``B A⁻¹`` (batched over leading dimensions), verified by its
    residual (module docstring); ``what`` names the layer in the error."""
    try:
        X = torch.linalg.solve(A, B, left=left)
        if solve_residual_ok(A, B, X, left=left):
            return X
    except RuntimeError:
        pass
    wide = _WIDER.get(B.dtype, B.dtype)
    n = A.shape[-1]
    batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    Aw = torch.broadcast_to(A.to(wide), (*batch, n, n)).reshape(-1, n, n)
    Bw = torch.broadcast_to(B.to(wide), (*batch, *B.shape[-2:])).reshape(-1, *B.shape[-2:])
    Xw = torch.stack([torch.linalg.solve(Aw[i], Bw[i], left=left) for i in range(Aw.shape[0])])
    if not solve_residual_ok(Aw, Bw, Xw, left=left):
        raise LipError(f"{what}: the linear solve returned a wrong result even one matrix at a time in double "
                       "precision (residual check failed); the layer's operator cannot be trusted")
    return Xw.reshape(*batch, *B.shape[-2:]).to(B.dtype)
