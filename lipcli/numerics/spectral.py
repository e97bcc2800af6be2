"""Guaranteed upper bounds on spectral norms (SPEC §5).

Everything here returns a number that is *provably* at least the quantity it bounds, for the
exact real matrix whose entries are the given floating-point numbers, including every
floating-point rounding committed along the way.  Estimates (power iteration, Lanczos) are
used only to choose a candidate value; the candidate is then *certified*.

Method (for ``λ_max`` of a symmetric matrix ``B`` of order ``p``):

1. Lanczos (8–32 steps, full re-orthogonalisation; a fixed-seed private generator when no
   start vector is given, so the global RNG is untouched) gives a Ritz value
   ``λ̂ ≤ λ_max(B)``.
2. Certificate: ``λ̄ = λ̂ + gap``; ``λ_max(B) ≤ λ̄`` iff ``X = λ̄I − B ⪰ 0``.  We form
   ``X̂ = fl(λ̄I − B)`` and run the floating-point Cholesky factorisation (LAPACK, lower
   triangle) of ``fl(X̂ − cI)`` with Rump's shift (S. M. Rump, *Verification of positive
   definiteness*, BIT 46 (2006), Thm. 2.3 / Cor. 2.4)::

       c = 2 · γ_{p+1}/(1 − γ_{p+1}) · tr(X̂) + 4p(2(p+1) + max X̂_ii)·η,

   with ``γ_n = n·u/(1 − n·u)``, ``u = 2⁻⁵³`` and ``η = 2⁻¹⁰⁷⁴`` (the factor 2 is our extra
   safety over Rump's constant).  If it completes, ``X̂`` is positive definite, and since
   ``X̂`` differs from ``λ̄I − B`` only on the diagonal by at most ``u·max|X̂_ii|·(1+2u)``,
   ``λ_max(B) ≤ λ̄ + u·max|X̂_ii|·(1 + 2u)``.  If it fails, ``gap`` is multiplied by 4 and
   we retry; after 14 failures the (always valid) Frobenius bound ``λ_max ≤ ‖B‖_F`` is used.
3. Spectral norms go through the *smaller* Gram matrix ``G = MMᵀ`` (or ``MᵀM``) in float64.
   Only the blocks on and below the diagonal are computed (4 row blocks, ≈ 62 % of the
   flops); every computed entry is one dot product of length ``q`` (the inner dimension),
   so ``|Ĝ − G| ≤ γ_q |M||M|ᵀ`` entrywise (any summation order, FMA or not), hence
   ``‖Ĝ − G‖₂ ≤ γ_q ‖M‖_F²`` for the symmetric matrix made of ``Ĝ``'s lower triangle —
   exactly the matrix Cholesky reads.  We add ``2·γ_q‖M‖_F²`` (factor 2 safety) to its
   certified ``λ_max``; then ``‖M‖₂ ≤ √λ``.  Lanczos runs on ``x ↦ M(Mᵀx)`` (no need for
   the upper triangle).
4. Matrices with ``‖M‖_F`` outside ``[2⁻¹⁰⁰, 2¹⁰⁰]`` are scaled by an exact power of two
   (undone exactly; possible underflow of tiny entries is covered by ``√(mn)·η``).  The
   final scalar arithmetic (a handful of roundings of relative size ``u``) is covered by
   multiplying by ``1 + 1e-12``.

Safety margin, summarised: the returned bound exceeds the certified exact value by at most a
relative ``~1e-12`` plus ``2γ_q‖M‖_F²/λ`` (≲ 1e-8 relative for the matrices of LipConvnet),
plus the requested tightness ``rtol`` (default 1e-3) of the Lanczos-based candidate.

Cost (2-core CPU, float64 ~100 GFLOP/s when idle): about ``1.25·p²·q`` flops for the Gram
blocks, ``2·q·p`` per Lanczos step and ``p³/3`` per Cholesky attempt (usually one).  The
whole-network bound of a LipConvnet-20 (21 SOC layers, see ``SOC.lipschitz_upper_bound``)
took 1.9 s on the 2-core machine when it was quiet (5–8 s while other jobs loaded it).

Convolution filters (SPEC §1.2, §5): for a filter ``K`` of shape ``(out, in, kh, kw)`` the
operator norm of the zero-padded "same" convolution obeys
``‖conv_K‖₂ ≤ √(kh·kw) · min_r ‖R_r(K)‖₂`` over the four reshapes ``R_r``
(:func:`conv_reshape`), Singla & Feizi, *Fantastic Four* (NeurIPS 2021).  Tightness is
purpose driven: :func:`conv_spectral_norm_upper_bound` certifies the cheapest reshape among
those whose estimated norm is within ``select_rtol`` of the smallest, and another only if it
could still improve the bound by more than that.  (The tradeoff: a looser ``b`` costs
nothing for 1×1 SOC layers, where ``b ≈ 1`` makes the series tail ``b¹⁵/15!`` negligible,
and only a few times ``1e-5`` in the Lipschitz bound of a 3×3 layer with ``b ≈ 3``.)
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "CONV_RESHAPES",
    "conv_reshape",
    "conv_reshape_shape",
    "conv_reshape_matvec",
    "conv_reshape_rmatvec",
    "conv_spectral_norm_upper_bound",
    "psd_lambda_max_upper_bound",
    "spectral_norm_upper_bound",
    "symmetric_lambda_max_upper_bound",
]

#: Unit roundoff of float64.
#: unit roundoff of float64 (shared with the certificate modules)
UNIT_ROUNDOFF = 2.0**-53
_U = UNIT_ROUNDOFF
#: Smallest positive subnormal float64 (Rump's underflow unit).
_ETA = 2.0**-1074
#: Relative margin covering the last few scalar roundings of every bound.
_SCALAR_MARGIN = 1e-12
#: Number of Lanczos steps used to estimate λ_max before certifying it.
_LANCZOS_STEPS = 32
#: Number of times the certificate gap is multiplied by 4 before falling back to Frobenius.
_MAX_CERT_ATTEMPTS = 14

#: Number of reshapes of a convolution filter used by SOC (SPEC §1.2).
CONV_RESHAPES = 4

# Einsum subscripts for M v and M^T u of the four reshapes of a filter K[o, i, a, b]:
#   0: rows (o, a) x cols (i, b)     1: rows (o, b) x cols (i, a)
#   2: rows o x cols (i, a, b)       3: rows (o, a, b) x cols i
_MATVEC = ("oiab,ib->oa", "oiab,ia->ob", "oiab,iab->o", "oiab,i->oab")
_RMATVEC = ("oiab,oa->ib", "oiab,ob->ia", "oiab,o->iab", "oiab,oab->i")


def _gamma(n: int) -> float:
    """Higham's ``γ_n = n·u / (1 − n·u)`` for float64."""
    nu = n * _U
    if nu >= 0.5:
        raise ValueError(f"problem too large for the rounding analysis (n = {n})")
    return nu / (1.0 - nu)


def _round_up(x: float) -> float:
    """``x`` moved up by the relative scalar margin (also correct for ``x < 0``)."""
    return x + abs(x) * _SCALAR_MARGIN


def _pow2_scale(value: float) -> float:
    """An exact power of two ``s`` with ``value·s ∈ [0.5, 1)`` (value > 0, finite)."""
    _, exponent = math.frexp(value)
    return math.ldexp(1.0, -exponent)


# --------------------------------------------------------------------------------------
# Convolution filter reshapes
# --------------------------------------------------------------------------------------
def conv_reshape_shape(kernel_shape: Sequence[int], which: int) -> tuple[int, int]:
    """``(rows, cols)`` of reshape ``which`` ∈ {0, 1, 2, 3} of a filter ``(out, in, kh, kw)``.

    0: ``(out·kh) × (in·kw)``, 1: ``(out·kw) × (in·kh)``, 2: ``out × (in·kh·kw)``,
    3: ``(out·kh·kw) × in`` (SPEC §1.2).
    """
    o, i, kh, kw = (int(s) for s in kernel_shape)
    return ((o * kh, i * kw), (o * kw, i * kh), (o, i * kh * kw), (o * kh * kw, i))[which]


def conv_reshape(kernel: Tensor, which: int) -> Tensor:
    """The reshape ``which`` of ``kernel`` as a contiguous matrix (rows/cols as in
    :func:`conv_reshape_shape`, the channel index always the major one)."""
    o, i, kh, kw = kernel.shape
    if which == 0:
        return kernel.permute(0, 2, 1, 3).reshape(o * kh, i * kw)
    if which == 1:
        return kernel.permute(0, 3, 1, 2).reshape(o * kw, i * kh)
    if which == 2:
        return kernel.reshape(o, i * kh * kw)
    if which == 3:
        return kernel.permute(0, 2, 3, 1).reshape(o * kh * kw, i)
    raise ValueError(f"reshape index must be 0..3, got {which}")


def conv_reshape_matvec(kernel: Tensor, which: int, v: Tensor) -> Tensor:
    """``R_which(kernel) @ v`` (flat vectors) without materialising the reshape."""
    o, i, kh, kw = kernel.shape
    col_shape = ((i, kw), (i, kh), (i, kh, kw), (i,))[which]
    return torch.einsum(_MATVEC[which], kernel, v.view(col_shape)).reshape(-1)


def conv_reshape_rmatvec(kernel: Tensor, which: int, u: Tensor) -> Tensor:
    """``R_which(kernel)ᵀ @ u`` (flat vectors) without materialising the reshape."""
    o, i, kh, kw = kernel.shape
    row_shape = ((o, kh), (o, kw), (o,), (o, kh, kw))[which]
    return torch.einsum(_RMATVEC[which], kernel, u.view(row_shape)).reshape(-1)


def _scaled_copy(M: Tensor) -> tuple[Tensor, float, float]:
    """``(M·s, s, ‖M·s‖_F)`` in float64 with ``s`` an exact power of two: ``s = 1`` when
    ``2⁻¹⁰⁰ ≤ ‖M‖_F ≤ 2¹⁰⁰`` (no overflow or underflow can then occur in the Gram matrix
    and Cholesky factor of normal-sized problems), otherwise making ``‖M·s‖_F ≈ 1``.
    ``s = 1`` and norm 0 for a zero matrix.  Raises on NaN/inf."""
    M64 = M.detach().to(torch.float64)
    fro = float(torch.linalg.vector_norm(M64))
    if not math.isfinite(fro):
        amax = float(M64.abs().max())
        if not math.isfinite(amax):
            raise ValueError("matrix has non-finite entries")
        M64 = M64 * _pow2_scale(amax)  # exact; then the norm cannot overflow
        pre = _pow2_scale(amax)
        fro = float(torch.linalg.vector_norm(M64))
    else:
        pre = 1.0
    if fro == 0.0:
        return M64, 1.0, 0.0
    if pre == 1.0 and 2.0**-100 <= fro <= 2.0**100:
        return M64, 1.0, fro
    s = _pow2_scale(fro)
    return M64 * s, s * pre, fro * s


# --------------------------------------------------------------------------------------
# λ_max of symmetric matrices
# --------------------------------------------------------------------------------------
def _lanczos_lambda_max(
    B: Tensor | Callable[[Tensor], Tensor], start: Tensor | None, steps: int, rtol: float, p: int | None = None
) -> tuple[float, float]:
    """Largest Ritz value of ``B`` (symmetric) after at most ``steps`` Lanczos steps (full
    re-orthogonalisation); ``≤ λ_max`` in exact arithmetic.  Stops early once the top Ritz
    value moved by less than ``rtol/100`` (relative; at least 8 steps) in a step.  Only an *estimate*: it
    picks the candidate to certify, so an early stop costs at most a retried certificate.
    Returns ``(θ, drift)`` with ``drift`` the change of θ in the last step (a hint of how
    far from converged it still is).  ``B`` is a symmetric matrix or a function applying one (then ``p`` is its order)."""
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


def _certify_lambda_max(
    B: Tensor, estimate: float, rtol: float, scale: float, drift: float = 0.0
) -> float | None:
    """Certified upper bound on ``λ_max(B)`` (``B`` float64 symmetric, only its lower
    triangle is read by Cholesky) near ``estimate``, or ``None`` if no candidate could be
    certified.  ``scale`` (> 0) sets the absolute size of the smallest gap tried; the
    first gap is at least ``10·drift`` (Lanczos still moving: its estimate is likely low).

    See the module docstring, step 2, for the rounding analysis (Rump's shift)."""
    p = B.shape[0]
    g = _gamma(p + 1)
    rump = 2.0 * g / (1.0 - g)
    base_gap = max(rtol * abs(estimate), 1e-9 * scale, 10.0 * drift if math.isfinite(drift) else 0.0)
    for attempt in range(_MAX_CERT_ATTEMPTS):
        lam_bar = estimate + base_gap * 4.0**attempt
        X = -B
        X.diagonal().add_(lam_bar)  # X̂ = fl(λ̄I − B)
        diag_X = torch.diagonal(X)
        max_abs_diag = float(diag_X.abs().max())
        if float(diag_X.min()) <= 0.0:
            continue  # a non-positive diagonal: λ̄ < some B_ii <= λ_max, certainly too low
        trace = float(diag_X.sum()) * (1.0 + _gamma(p + 1))  # upper bound on tr(X̂)
        shift = rump * trace + 4.0 * p * (2.0 * (p + 1) + max_abs_diag) * _ETA
        X.diagonal().sub_(shift)
        _, info = torch.linalg.cholesky_ex(X, upper=False)
        if int(info) == 0:
            diag_rounding = _U * max_abs_diag * (1.0 + 2.0 * _U)
            return _round_up(lam_bar + diag_rounding)
    return None


def symmetric_lambda_max_upper_bound(
    B: Tensor, *, rtol: float = 1e-3, start: Tensor | None = None
) -> float:
    """Guaranteed upper bound on ``λ_max(½(B + Bᵀ))`` for a square matrix ``B``.

    The symmetric part is formed in float64 (entrywise relative rounding ``u``, hence an
    error of at most ``u‖B‖_F`` in 2-norm, added twice over).  Tightness: typically within
    ``rtol·|λ_max|`` (relative) of the true value.  Works for indefinite ``B`` too.
    """
    if B.dim() != 2 or B.shape[0] != B.shape[1]:
        raise ValueError(f"expected a square matrix, got shape {tuple(B.shape)}")
    if B.numel() == 0:
        raise ValueError("empty matrix has no eigenvalues")
    Bs, s, fro_s = _scaled_copy(B)
    if fro_s == 0.0:
        return 0.0
    Bsym = (Bs + Bs.T) * 0.5
    fro_s = fro_s * (1.0 + 2.0 * _gamma(Bs.numel() + 2))  # ≥ ‖B_s‖_F ≥ ‖Bsym‖_F
    sym_err = 2.0 * _U * fro_s + (Bs.shape[0] * _ETA if s < 1.0 else 0.0)  # + underflow
    estimate, drift = _lanczos_lambda_max(Bsym, start, _LANCZOS_STEPS, rtol)
    bound = _certify_lambda_max(Bsym, estimate, rtol, fro_s, drift)
    if bound is None:
        bound = fro_s * (1.0 + 2.0 * _U)  # λ_max ≤ ‖Bsym‖₂ ≤ ‖Bsym‖_F ≤ ‖B‖_F
    bound = _round_up(bound + sym_err)
    return bound / s


def psd_lambda_max_upper_bound(B: Tensor, *, rtol: float = 1e-3) -> float:
    """Guaranteed upper bound on ``λ_max`` of a symmetric (typically PSD) matrix ``B``.

    Tensor in, Python float out; suitable for curvature bounds such as
    ``¼·λ_max(W₁ᵀ diag(d⁺) W₁)`` (SPEC §4).  ``B`` is used through its symmetric part
    ``½(B + Bᵀ)``; rounding committed *before* the call (e.g. while forming ``B``) is the
    caller's responsibility — for a Gram-type matrix ``FᵀF`` prefer
    ``spectral_norm_upper_bound(F) ** 2`` which covers the product's rounding too.
    Result is ≥ 0 when ``B`` is PSD; tight to about ``rtol`` (relative).
    """
    return symmetric_lambda_max_upper_bound(B, rtol=rtol)


# --------------------------------------------------------------------------------------
# Spectral norms
# --------------------------------------------------------------------------------------
#: Number of row blocks of the Gram product: only the ``nb(nb+1)/2`` blocks on or below the
#: diagonal are computed (≈ 62 % of the flops of a full product for nb = 4).
_GRAM_BLOCKS = 4


def _gram_lower(A: Tensor) -> Tensor:
    """``A Aᵀ`` with (at least) its lower triangle computed; entries above the diagonal
    blocks are zero and must not be used.  Every computed entry is one length-``q`` dot
    product, so the entrywise bound ``|Ĝ − G| ≤ γ_q |A||A|ᵀ`` holds."""
    p = A.shape[0]
    if p < 512:
        return A @ A.T
    edges = [round(j * p / _GRAM_BLOCKS) for j in range(_GRAM_BLOCKS + 1)]
    G = torch.zeros(p, p, dtype=A.dtype, device=A.device)
    for a in range(_GRAM_BLOCKS):
        ra = slice(edges[a], edges[a + 1])
        G[ra, : edges[a + 1]] = A[ra] @ A[: edges[a + 1]].T
    return G


def spectral_norm_upper_bound(M: Tensor, *, rtol: float = 1e-3, start: Tensor | None = None) -> float:
    """Guaranteed upper bound on ``‖M‖₂`` (largest singular value) of a 2-D tensor.

    Works through the smaller Gram matrix in float64 (module docstring, steps 2–4).
    ``start`` is an optional estimate of the top singular vector on the *smaller* side (the
    left vector if ``rows ≤ cols``, else the right one), used to seed Lanczos.
    Typically tight to ``rtol`` (relative, on ``‖M‖₂``).
    """
    if M.dim() != 2:
        raise ValueError(f"expected a matrix, got shape {tuple(M.shape)}")
    if M.numel() == 0:
        return 0.0
    Ms, s, fro_s = _scaled_copy(M)
    if fro_s == 0.0:
        return 0.0
    m, n = Ms.shape
    A = Ms if m <= n else Ms.T  # G = A Aᵀ is the smaller Gram matrix, inner dimension q
    q = max(m, n)
    G = _gram_lower(A)
    # Cholesky reads only the lower triangle: the matrix certified is the symmetric one
    # made of Ĝ's lower triangle, whose entries all obey the entrywise error bound.
    fro2 = fro_s**2 * (1.0 + 2.0 * _gamma(m * n + 2))  # ≥ ‖M_s‖_F²
    gram_err = 2.0 * _gamma(q) * fro2  # ≥ ‖Ĝ − G‖₂ (factor 2 safety)
    if start is None:
        start = torch.randn(A.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    estimate, drift = _lanczos_lambda_max(
        lambda x: torch.mv(A, torch.mv(A.T, x)), start.to(A.device), _LANCZOS_STEPS, rtol, A.shape[0]
    )
    # ‖M‖(1+rtol) ⇔ λ(1 + 2rtol + rtol²): certify λ within ~2·rtol.
    lam = _certify_lambda_max(G, estimate, 2.0 * rtol, fro2, drift)
    if lam is None:
        lam_true = fro2  # λ_max(MMᵀ) = ‖M‖₂² ≤ ‖M‖_F²
    else:
        lam_true = min(lam + gram_err, fro2)
    # + √(mn)·η: entries that may have underflowed when scaling by s (only if s < 1).
    underflow = math.sqrt(m * n) * _ETA if s < 1.0 else 0.0
    return (math.sqrt(lam_true) + underflow) * (1.0 + _SCALAR_MARGIN) / s


def _power_estimate(
    M: Tensor, start: Tensor | None, iters: int, gen: torch.Generator
) -> tuple[float, Tensor, Tensor]:
    """Power-iteration estimate ``(‖M v‖, u, v)`` of ``‖M‖₂`` and its singular vectors (a
    lower estimate up to rounding; used only to order and seed the certified bounds)."""
    rows, cols = M.shape
    if start is not None and start.numel() == cols and bool(torch.isfinite(start).all()):
        v = start.detach().to(device=M.device, dtype=M.dtype).reshape(-1).clone()
    else:
        v = torch.randn(cols, generator=gen, dtype=torch.float64).to(M)
    v = v / torch.linalg.vector_norm(v).clamp_min(1e-30)
    u = torch.mv(M, v)
    for _ in range(iters):
        u = u / torch.linalg.vector_norm(u).clamp_min(1e-30)
        v = torch.mv(M.T, u)
        v = v / torch.linalg.vector_norm(v).clamp_min(1e-30)
        u = torch.mv(M, v)
    est = float(torch.linalg.vector_norm(u))
    return est, u / max(est, 1e-30), v


def conv_spectral_norm_upper_bound(
    kernel: Tensor,
    *,
    rtol: float = 1e-3,
    select_rtol: float | None = None,
    skew: bool = False,
    start_vectors: Sequence[Tensor | None] | None = None,
    estimate_iters: int | None = None,
) -> float:
    """Guaranteed upper bound on the l2 operator norm of the zero-padded "same" convolution
    with ``kernel`` (shape ``(out, in, kh, kw)``), via
    ``√(kh·kw) · min_r ‖R_r(kernel)‖₂`` (SPEC §5) with each ``‖R_r‖₂`` bounded from above by
    :func:`spectral_norm_upper_bound` (tightness ``rtol``).

    Which reshapes get certified is decided by power-iteration estimates (in the kernel's
    own dtype, on materialised reshapes): among the reshapes whose estimate is within
    ``select_rtol`` (default ``rtol``) of the smallest, the cheapest (smallest Gram matrix)
    is certified first; any other reshape only if its estimate shows it could still lower
    the bound by more than ``rtol``.  A larger ``select_rtol`` trades tightness for speed
    (e.g. 0.15 when the bound only feeds the tail ``b^T/T!`` of SPEC §5).

    ``skew=True`` declares ``T(K) = −K`` (checked exactly; ``ValueError`` otherwise).  Then
    ``R_1 = −F R_0ᵀ F`` and ``R_3 = −F₂ R_2ᵀ`` (``F``, ``F₂`` flip the tap indices) have
    the same singular values as ``R_0`` and ``R_2``, so only reshapes 0 and 2 are
    considered.  For 1×1 filters all four reshapes coincide and only one is bounded.

    ``start_vectors`` (one per reshape: right singular vector estimates such as SOC's
    power-iteration buffers) make 2 power steps enough; otherwise ``estimate_iters``
    (default 8) are used.  Estimates affect only speed and tightness, never soundness.
    """
    if kernel.dim() != 4:
        raise ValueError(f"expected a 4-D filter, got shape {tuple(kernel.shape)}")
    K = kernel.detach()
    if not K.is_floating_point():
        K = K.to(torch.float64)
    o, i, kh, kw = K.shape
    if K.numel() == 0:
        return 0.0
    if skew:
        if o != i or kh != kw or not torch.equal(K.transpose(0, 1).flip(2, 3), -K):
            raise ValueError("skew=True but the filter does not satisfy T(K) = -K exactly")
    if kh == 1 and kw == 1:
        which = [0]
    elif skew:
        which = [0, 2]
    else:
        which = [0, 1, 2, 3]
    select = rtol if select_rtol is None else max(select_rtol, rtol)
    iters = estimate_iters if estimate_iters is not None else (2 if start_vectors is not None else 8)
    gen = torch.Generator(device="cpu").manual_seed(0)
    mats = {r: conv_reshape(K, r).contiguous() for r in which}
    estimates = {
        r: _power_estimate(mats[r], start_vectors[r] if start_vectors is not None else None, iters, gen)
        for r in which
    }

    def cost(r: int) -> float:  # flops of the Gram product of reshape r
        rows, cols = conv_reshape_shape(K.shape, r)
        return float(min(rows, cols)) ** 2 * max(rows, cols)

    smallest = min(est for est, _, _ in estimates.values())
    near = sorted((r for r in which if estimates[r][0] <= smallest * (1.0 + select)), key=cost)
    rest = sorted((r for r in which if r not in near), key=lambda r: estimates[r][0])
    best = math.inf
    for r in near[:1] + rest:
        est, u, v = estimates[r]
        if est * (1.0 + select) >= best:
            continue  # certifying r cannot lower the bound by more than select_rtol
        rows, cols = mats[r].shape
        start = u if rows <= cols else v
        bound = spectral_norm_upper_bound(mats[r], rtol=rtol, start=start.to(torch.float64))
        best = min(best, bound)
    root = math.sqrt(kh * kw) * (1.0 + 2.0 * _U)
    return root * best * (1.0 + _SCALAR_MARGIN)
