"""The verified ``λ_max`` engine: guaranteed upper bounds on the largest eigenvalue of a
symmetric matrix (SPEC §4, §5).

This is the one place where lipcli *proves* an eigenvalue bound.  The Lipschitz bounds of the
layers (``‖S‖₂`` of SOC filters, SPEC §5, via :mod:`lipcli.numerics.spectral` and
:mod:`lipcli.numerics.conv`) and the curvature bounds of the CRC-Lip certificate
(``¼λ_max(W₁ᵀ diag(d) W₁)``, SPEC §4, via :func:`lipcli.numerics.spectral.
weighted_gram_lambda_max_upper_bound`) all end in :func:`certify_lambda_max`.

Everything here returns a number that is *provably* at least the quantity it bounds, for the
exact real matrix whose entries are the given floating-point numbers (plus a caller-declared
``matrix_err`` when those numbers are themselves a rounded version of the matrix meant),
including every floating-point rounding committed along the way (model:
:mod:`lipcli.numerics.rounding`).  Estimates are used only to choose a candidate value; the
candidate is then *certified*, so a bad estimate (a corrupted start vector, an unconverged
Krylov space) costs tightness or time, never soundness.

Method, for ``λ_max`` of a symmetric matrix ``B`` of order ``p``:

1. **Estimate** a Ritz value ``λ̂ ≲ λ_max(B)`` (:data:`ESTIMATORS`):

   * ``"lanczos"`` — Lanczos (8–32 steps, full re-orthogonalisation, float64; a fixed-seed
     private generator when no start vector is given, so the global RNG is untouched).
     Matrix-free, about ``1e-3``–``1e-5`` relative; used for the Lipschitz bounds.
   * ``"krylov"`` — ``eigvalsh`` in float64 for ``p ≤ 256``, otherwise Rayleigh–Ritz on a
     float32 block Krylov space ``span{V, BV, …, B⁴⁰V}`` (``V`` random ``p×8``): a few GEMMs,
     good to ``~1e-6`` relative; used for the curvature bounds (tightness ``2e-6``).

2. **Certify** (:func:`certify_lambda_max`): ``λ̄ = λ̂ + gap``; ``λ_max(B) ≤ λ̄`` iff
   ``X = λ̄I − B ⪰ 0``.  We form ``X̂ = fl(λ̄I − B)`` and run the floating-point Cholesky
   factorisation (LAPACK ``dpotrf``, lower triangle) of ``fl(X̂ − cI)`` with Rump's shift
   (S. M. Rump, *Verification of positive definiteness*, BIT 46 (2006), Thm. 2.3 /
   Cor. 2.4)::

       c = 2 · γ_{p+1}/(1 − γ_{p+1}) · tr(X̂) + 4p(2(p+1) + max X̂_ii)·η,

   with ``γ_n``, ``u``, ``η`` as in :mod:`lipcli.numerics.rounding` (the factor 2 is our
   extra safety over Rump's constant; ``tr(X̂)`` is itself enlarged by ``1 + γ_{p+1}`` to
   cover its summation).  If it completes, ``X̂`` is positive definite, and since ``X̂``
   differs from ``λ̄I − B`` only on the diagonal by at most ``u·max|X̂_ii|·(1+2u)``,
   ``λ_max(B) ≤ λ̄ + u·max|X̂_ii|·(1 + 2u)``.  The first gap is
   ``max(rtol·|λ̂|, 1e-9·scale, 10·drift)`` (``drift``: how much the Lanczos value still
   moved, a sign it is low); if Cholesky fails the gap is multiplied by 4 and we retry; after
   :data:`MAX_CERT_ATTEMPTS` failures the caller uses a Frobenius bound (always valid).
   Only the lower triangle of ``B`` is read.

3. **Inputs and outputs** (:func:`symmetric_lambda_max_upper_bound`): ``B`` is copied to
   float64 and, when ``‖B‖_F ∉ [2⁻¹⁰⁰, 2¹⁰⁰]``, scaled by an exact power of two
   (:func:`scaled_copy`; underflow of tiny entries when scaling down is covered by ``p·η``,
   rounding when undoing it into the subnormal range by ``η``).  Its symmetric part
   ``½(B + Bᵀ)`` is formed in float64: entrywise relative error ``u``, hence at most
   ``u‖B‖_F`` in 2-norm, added twice over.  ``matrix_err`` (the caller's bound on
   ``‖B − A‖₂`` for the matrix ``A`` it means) is added by Weyl's inequality.  The final
   scalar arithmetic is covered by :func:`~lipcli.numerics.rounding.round_up`.

Safety margin, summarised: the returned bound exceeds the certified exact value by at most a
relative ``~1e-12`` plus the error terms named above, plus the requested tightness ``rtol`` of
the estimate-based candidate.  Cost: ``2p²`` flops per Lanczos step (or ``~700·p²`` for the
block Krylov estimate) and ``p³/3`` per Cholesky attempt (usually one).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from lipcli.numerics.rounding import ETA, UNIT_ROUNDOFF, gamma, round_up

__all__ = [
    "ESTIMATORS",
    "certify_lambda_max",
    "krylov_lambda_max_estimate",
    "lanczos_lambda_max",
    "psd_lambda_max_upper_bound",
    "scaled_copy",
    "unscale_up",
    "symmetric_lambda_max_upper_bound",
]

_U = UNIT_ROUNDOFF
#: Number of Lanczos steps used to estimate λ_max before certifying it.
LANCZOS_STEPS = 32
#: Number of times the certificate gap is multiplied by 4 before falling back to Frobenius.
MAX_CERT_ATTEMPTS = 14
#: The estimators of step 1 (module docstring).
ESTIMATORS = ("lanczos", "krylov")
#: Orders up to which the "krylov" estimator uses a dense float64 ``eigvalsh``.
_DENSE_ESTIMATE_MAX = 256
#: Orders up to which CPU Cholesky goes through SciPy's ``dpotrf`` (less call overhead).
_SCIPY_CHOLESKY_MAX = 512


def scaled_copy(M: Tensor) -> tuple[Tensor, int, float]:
    """``(M·2ᵏ, k, ‖M·2ᵏ‖_F)`` in float64: ``k = 0`` when ``2⁻¹⁰⁰ ≤ ‖M‖_F ≤ 2¹⁰⁰`` (no
    overflow or underflow can then occur in the Gram matrix and Cholesky factor of
    normal-sized problems), otherwise the exact power of two making ``‖M·2ᵏ‖_F ∈ [½, 1)``.
    ``k = 0`` and norm 0 for a zero matrix.  Raises on NaN/inf.

    Zero is decided by the largest entry, not by the norm: the norm of a matrix with entries
    below ~1e-162 underflows to 0 although the matrix is not zero.  Such a matrix is first
    scaled (exactly) so that its largest entry lies in ``[½, 1)``.  Scaling *up* is exact;
    scaling *down* may round entries that become subnormal, by at most ``η`` each (callers
    add that).  Undo with :func:`unscale_up`."""
    M64 = M.detach().to(torch.float64)
    amax = float(M64.abs().max()) if M64.numel() else 0.0
    if not math.isfinite(amax):
        raise ValueError("matrix has non-finite entries")
    if amax == 0.0:
        return M64, 0, 0.0
    fro = float(torch.linalg.vector_norm(M64))
    if 2.0**-100 <= fro <= 2.0**100:
        return M64, 0, fro
    k = 0
    if not 0.0 < fro < math.inf:  # the norm over- or underflowed: bring max|M| to [½, 1)
        k = -math.frexp(amax)[1]
        M64 = _times_pow2(M64, k)
        fro = float(torch.linalg.vector_norm(M64))
    k2 = -math.frexp(fro)[1]
    return _times_pow2(M64, k2), k + k2, math.ldexp(fro, k2)


def _times_pow2(M: Tensor, k: int) -> Tensor:
    """``M·2ᵏ`` (exact unless entries become subnormal); ``2ᵏ`` is split in two factors when
    it is not a float64 itself (``k > 1023``)."""
    if k > 1023:
        return (M * 2.0 ** (k // 2)) * 2.0 ** (k - k // 2)
    return M * 2.0**k


def unscale_up(value: float, k: int) -> float:
    """An upper bound on ``value·2⁻ᵏ`` (undoing :func:`scaled_copy`): exact for ``k ≤ 0``
    (scaling up cannot round) and for normal results; a result in the subnormal range may
    round down by ``η/2``, so ``η`` is added when ``k > 0``.  ``inf`` on overflow."""
    try:
        out = math.ldexp(value, -k)
    except OverflowError:
        return math.inf
    return out + ETA if k > 0 else out


# --------------------------------------------------------------------------------------
# Step 1: estimates (never trusted; they only pick the candidate to certify)
# --------------------------------------------------------------------------------------
def lanczos_lambda_max(
    B: Tensor | Callable[[Tensor], Tensor], start: Tensor | None, steps: int, rtol: float, p: int | None = None
) -> tuple[float, float]:
    """Largest Ritz value of ``B`` (symmetric) after at most ``steps`` Lanczos steps (full
    re-orthogonalisation); ``≤ λ_max`` in exact arithmetic.  Stops early once the top Ritz
    value moved by less than ``rtol/100`` (relative; at least 8 steps) in a step.  Only an
    *estimate*: it picks the candidate to certify, so an early stop costs at most a retried
    certificate.  Returns ``(θ, drift)`` with ``drift`` the change of θ in the last step (a
    hint of how far from converged it still is).  ``B`` is a symmetric matrix or a function
    applying one (then ``p`` is its order).  A start vector of the wrong size, with
    non-finite entries or all zeros is replaced by the fixed-seed random one."""
    if callable(B):
        apply = B
        assert p is not None
        device = start.device if start is not None else torch.device("cpu")
    else:
        p = B.shape[0]
        device = B.device
        apply = lambda x: torch.mv(B, x)  # noqa: E731
    steps = max(1, min(steps, p))
    if start is None or start.numel() != p or not bool(torch.isfinite(start).all()) or float(start.abs().sum()) == 0.0:
        gen = torch.Generator(device="cpu").manual_seed(0)
        start = torch.randn(p, generator=gen, dtype=torch.float64)
    q = start.to(device=device, dtype=torch.float64).reshape(-1)
    q = q / torch.linalg.vector_norm(q)
    Q = torch.empty(steps, p, dtype=torch.float64, device=device)
    alphas: list[float] = []
    betas: list[float] = []
    theta_prev = -math.inf
    theta = -math.inf
    drift = math.inf
    for j in range(steps):
        Q[j] = q
        w = apply(q)
        alpha = float(torch.dot(q, w))
        alphas.append(alpha)
        theta = _tridiag_max(alphas, betas)
        if j >= 7 and abs(theta - theta_prev) <= 0.01 * rtol * abs(theta):
            drift = abs(theta - theta_prev)
            break
        drift = abs(theta - theta_prev) if j > 0 else math.inf
        theta_prev = theta
        basis = Q[: j + 1]
        w = w - basis.T @ (basis @ w)
        w = w - basis.T @ (basis @ w)  # re-orthogonalise twice ("twice is enough")
        beta = float(torch.linalg.vector_norm(w))
        if beta <= 1e-12 * max(abs(theta), abs(alpha), 1e-300):
            drift = 0.0  # invariant subspace: θ is an eigenvalue (not necessarily the top)
            break
        if j == steps - 1:
            break
        betas.append(beta)
        q = w / beta
    return theta, drift


def _tridiag_max(alphas: list[float], betas: list[float]) -> float:
    """Largest eigenvalue of the symmetric tridiagonal matrix (alphas, betas)."""
    n = len(alphas)
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if n > 1:
        off = torch.tensor(betas[: n - 1], dtype=torch.float64)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    return float(torch.linalg.eigvalsh(T)[-1])


def krylov_lambda_max_estimate(sym: Tensor, block: int = 8, steps: int = 40) -> float:
    """Estimate of ``λ_max`` of a symmetric matrix (a Ritz value, so typically a hair low).

    Small matrices: float64 ``eigvalsh``.  Large ones: Rayleigh-Ritz on the block Krylov
    space ``span{V, AV, ..., A^steps V}`` (``V`` random ``n×block``, fixed seed), products
    with ``A`` in float32 -- a few GEMMs instead of a dense float32 ``eigvalsh`` (10-50×
    slower on a 2-core CPU for n = 2048).  Each new block is orthogonalised against the
    previous ones by block Gram-Schmidt (twice, in float64 GEMMs) and then by a thin QR of
    the ``n×block`` block alone: no QR of the whole ``n × (steps+1)·block`` basis, whose
    multi-threaded LAPACK was slow on a loaded CPU (lipcli never changes the process's
    thread count to work around that).  Only an estimate: :func:`certify_lambda_max`
    proves the bound, whatever this returns.
    """
    n = sym.shape[0]
    if n <= _DENSE_ESTIMATE_MAX:
        return float(torch.linalg.eigvalsh(sym).max())
    a = sym.to(torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn(n, block, generator=gen, dtype=torch.float64).to(a.device)
    cols = min(n, (steps + 1) * block)
    basis = torch.empty(n, cols, dtype=torch.float64, device=a.device)
    filled = 0
    while filled < cols:
        prev = basis[:, :filled]
        for _ in range(2):  # "twice is enough"
            v = v - prev @ (prev.T @ v)
        v, _ = torch.linalg.qr(v)  # thin n×block QR (cheap)
        take = min(block, cols - filled)
        basis[:, filled : filled + take] = v[:, :take]
        filled += take
        v = (a @ v.to(torch.float32)).to(torch.float64)
    q32 = basis.to(torch.float32)
    t = (q32.T @ (a @ q32)).to(torch.float64)
    return float(torch.linalg.eigvalsh(0.5 * (t + t.T)).max())


# --------------------------------------------------------------------------------------
# Step 2: the certificate (Rump's shifted Cholesky)
# --------------------------------------------------------------------------------------
def cholesky_succeeds(X: Tensor) -> bool:
    """Whether a floating-point Cholesky factorisation of ``X`` (float64, lower triangle
    read) runs to completion.  Small CPU matrices go to LAPACK ``dpotrf`` through SciPy
    (less call overhead); large ones and GPU tensors to ``torch.linalg.cholesky_ex``.  Both
    are the standard algorithm Rump's theorem covers (any order of the inner sums)."""
    if X.device.type == "cpu" and X.shape[0] <= _SCIPY_CHOLESKY_MAX:
        from scipy.linalg import lapack

        _, info = lapack.dpotrf(X.numpy(), lower=1, clean=0)
        return int(info) == 0
    _, info = torch.linalg.cholesky_ex(X, upper=False)
    return int(info) == 0


def certify_lambda_max(
    B: Tensor, estimate: float, rtol: float, scale: float, drift: float = 0.0
) -> float | None:
    """Certified upper bound on ``λ_max(B)`` (``B`` float64 symmetric, only its lower
    triangle is read) near ``estimate``, or ``None`` if no candidate could be certified in
    :data:`MAX_CERT_ATTEMPTS` tries.  ``scale`` (> 0) sets the absolute size of the smallest
    gap tried; the first gap is at least ``10·drift`` (Lanczos still moving: its estimate is
    likely low).

    Rounding analysis: module docstring, step 2 (Rump's shift, SPEC §5)."""
    p = B.shape[0]
    g = gamma(p + 1)
    rump = 2.0 * g / (1.0 - g)
    base_gap = max(rtol * abs(estimate), 1e-9 * scale, 10.0 * drift if math.isfinite(drift) else 0.0)
    for attempt in range(MAX_CERT_ATTEMPTS):
        lam_bar = estimate + base_gap * 4.0**attempt
        X = -B
        X.diagonal().add_(lam_bar)  # X̂ = fl(λ̄I − B)
        diag_X = torch.diagonal(X)
        max_abs_diag = float(diag_X.abs().max())
        if float(diag_X.min()) <= 0.0:
            continue  # a non-positive diagonal: λ̄ < some B_ii <= λ_max, certainly too low
        trace = float(diag_X.sum()) * (1.0 + gamma(p + 1))  # upper bound on tr(X̂)
        shift = rump * trace + 4.0 * p * (2.0 * (p + 1) + max_abs_diag) * ETA
        X.diagonal().sub_(shift)
        if cholesky_succeeds(X):
            diag_rounding = _U * max_abs_diag * (1.0 + 2.0 * _U)
            return round_up(lam_bar + diag_rounding)
    return None


# --------------------------------------------------------------------------------------
# Step 3: public bounds
# --------------------------------------------------------------------------------------
def symmetric_lambda_max_upper_bound(
    B: Tensor,
    *,
    rtol: float = 1e-3,
    start: Tensor | None = None,
    estimator: str = "lanczos",
    matrix_err: float = 0.0,
) -> float:
    """Guaranteed upper bound on ``λ_max(½(A + Aᵀ))`` for a square matrix ``A`` with
    ``‖A − B‖₂ ≤ matrix_err`` (``A = B`` by default).

    The symmetric part is formed in float64 (entrywise relative rounding ``u``, hence an
    error of at most ``u‖B‖_F`` in 2-norm, added twice over).  Tightness: typically within
    ``rtol·|λ_max|`` (relative) of the true value, plus ``matrix_err``.  Works for
    indefinite ``B`` too.  ``estimator`` picks step 1 of the module docstring (``start``
    seeds Lanczos only).
    """
    if B.dim() != 2 or B.shape[0] != B.shape[1]:
        raise ValueError(f"expected a square matrix, got shape {tuple(B.shape)}")
    if B.numel() == 0:
        raise ValueError("empty matrix has no eigenvalues")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if not matrix_err >= 0.0:
        raise ValueError(f"matrix_err must be >= 0, got {matrix_err}")
    Bs, k, fro_s = scaled_copy(B)
    if fro_s == 0.0:
        return round_up(matrix_err)
    Bsym = (Bs + Bs.T) * 0.5
    fro_s = fro_s * (1.0 + 2.0 * gamma(Bs.numel() + 2))  # ≥ ‖B_s‖_F ≥ ‖Bsym‖_F
    sym_err = 2.0 * _U * fro_s + (Bs.shape[0] * ETA if k < 0 else 0.0)  # + underflow
    if estimator == "lanczos":
        estimate, drift = lanczos_lambda_max(Bsym, start, LANCZOS_STEPS, rtol)
    else:
        estimate, drift = krylov_lambda_max_estimate(Bsym), 0.0
    bound = certify_lambda_max(Bsym, estimate, rtol, fro_s, drift)
    if bound is None:
        bound = fro_s * (1.0 + 2.0 * _U)  # λ_max ≤ ‖Bsym‖₂ ≤ ‖Bsym‖_F ≤ ‖B‖_F
    bound = unscale_up(round_up(bound + sym_err), k)
    if matrix_err == 0.0:
        return bound
    return round_up(bound + matrix_err)  # Weyl: λ_max(A) ≤ λ_max(B) + ‖A − B‖₂


def psd_lambda_max_upper_bound(B: Tensor, *, rtol: float = 1e-3) -> float:
    """Guaranteed upper bound on ``λ_max`` of a symmetric (typically PSD) matrix ``B``.

    Tensor in, Python float out.  ``B`` is used through its symmetric part ``½(B + Bᵀ)``;
    rounding committed *before* the call (e.g. while forming ``B``) is the caller's
    responsibility — for a Gram-type matrix ``FᵀF`` prefer
    ``spectral_norm_upper_bound(F) ** 2`` or
    :func:`lipcli.numerics.spectral.weighted_gram_lambda_max_upper_bound`, which cover the
    product's rounding too.  Result is ≥ 0 when ``B`` is PSD; tight to about ``rtol``.
    """
    return symmetric_lambda_max_upper_bound(B, rtol=rtol)
