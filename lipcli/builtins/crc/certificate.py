r"""The ``crc-lip`` certificate: curvature-based certificates of a 1-hidden-layer softplus MLP.

Head (SPEC §4): ``h(y) = W₂ σ(W₁ y + b₁) + b₂`` with σ = softplus (``head.fc1``, ``head.fc2``).
For predicted class ``l`` and a competitor ``j`` let ``d = W₂[l] - W₂[j]`` and

    g(y) = h_l(y) - h_j(y) = dᵀ σ(W₁ y + b₁) + (b₂[l] - b₂[j]),
    ∇g(y) = W₁ᵀ (d ⊙ σ'(z)),   ∇²g(y) = W₁ᵀ diag(d ⊙ σ''(z)) W₁,   z = W₁ y + b₁,

with ``0 < σ'' <= 1/4``.  Hence ``∇²g ⪰ -m_lj I`` everywhere, where (SPEC §4)

    m_lj = ¼ λ_max(W₁ᵀ diag(d⁻) W₁),   d⁻ = max(-d, 0) = (W₂[j] - W₂[l])⁺.

We write ``Λ(a, b) = ¼ λ_max(W₁ᵀ diag((W₂[a] - W₂[b])⁺) W₁)`` so ``m_lj = Λ(j, l)`` and
``M_lj = Λ(l, j)`` (only ``m`` is needed: ``η >= 0`` throughout).  All curvature values used
here are **guaranteed upper bounds** (:class:`CurvatureBounds`), at three levels:

* global (every pair, free): ``Λ(a, b) <= ¼ max_k (W₂[a] - W₂[b])⁺_k · ‖W₁‖₂²``;
* class split (one bound per class and sign, shared by all pairs of that class):
  ``Λ(a, b) <= ¼λ_max(W₁ᵀdiag(W₂[a]⁺)W₁) + ¼λ_max(W₁ᵀdiag(W₂[b]⁻)W₁)``;
* exact (per ordered pair): ``¼λ_max`` of the pair's own matrix.

Each eigenvalue bound (:func:`verified_lambda_max`, ~0.3 s for 4096×2048 on 2 idle CPU
cores) forms the float64 Gram ``A = W₁ᵀ diag(w) W₁`` (rows with ``w = 0`` skipped) with a
bound on its rounding error, estimates ``θ ≈ λ_max(A)`` by float32 block Krylov Rayleigh-Ritz,
and *verifies* ``tI - A ≻ 0`` for ``t ≈ θ(1 + 2e-6)`` by a float64 Cholesky factorisation
shifted by Rump's rounding margin (S. M. Rump, "Verification of positive definiteness",
BIT 46, 2006).  The verified value exceeds ``λ_max`` by a relative ~1e-5 at most.

Two sound per-pair lower bounds on the distance from ``y`` to ``{g = 0}`` (``g(y) > 0``):

1. **Closed form** (SPEC §4): ``g(y + δ) >= g(y) - ‖∇g‖‖δ‖ - (K/2)‖δ‖²`` with ``K >= m_lj``,
   so ``r_fast = (√(‖∇g‖² + 2Kg) - ‖∇g‖)/K = 2g / (√(‖∇g‖² + 2Kg) + ‖∇g‖)`` (``g/‖∇g‖`` at
   ``K = 0``).
2. **Dual / CRC** (Singla & Feizi 2020; paper Appendix E): for every ``η >= 0`` and every
   ``y'`` with ``g(y') <= 0``: ``½‖y' - y‖² >= ½‖y' - y‖² + η g(y') >= d(η)`` where
   ``d(η) = min_δ F_η(δ)``, ``F_η(δ) = ½‖δ‖² + η g(y + δ)``.  ``d`` is concave with
   ``d'(η) = g(y + δ*(η))`` and ``d''(η) = -∇gᵀ (I + η∇²g)⁻¹ ∇g``.  For ``η < 1/m_lj`` the
   inner problem is ``μ``-strongly convex with ``μ = 1 - η m_lj``, so for ANY ``δ``
   ``d(η) >= F_η(δ) - ‖∇F_η(δ)‖² / (2μ)`` and ``r_dual = √(2 (F_η(δ) - ‖∇F_η(δ)‖²/(2μ)))``
   is sound.  It is used only when ``‖∇F_η(δ)‖ <= grad_tol`` (1e-6, as in the paper).
   ``η`` is found by a safeguarded Newton iteration on the KKT system
   ``δ + η∇g(y + δ) = 0, g(y + δ) = 0`` (bracketed by the sign of ``d'``, clipped to
   ``[0, (1 - τ)/m]``); the inner Newton systems are solved by batched conjugate gradients
   with Hessian-vector products ``v + η W₁ᵀ (d ⊙ σ''(z) ⊙ W₁ v)``.  The search stops when
   the Newton model's predicted gain ``g²/(2|d''|)`` is below ``dual_rtol · d(η)``, or at the
   boundary ``η = (1 - τ)/m`` with ``d' > 0``.  When ``g(y + δ*) = 0`` at an interior ``η``
   the dual equals the primal: the certificate is the exact distance.

Per pair the certificate is ``max(r_fast, r_dual)``; per input the minimum over the competing
classes (all ``c - 1`` by default).  Dual solves are skipped for pairs whose ``r_fast``
already reaches the input's current minimum (they cannot lower it), processed in rounds of
increasing ``r_fast``, batched over inputs and pairs.  With ``curvature="lazy"`` (default)
only the global bounds exist at first; when the pair that decides an input's radius has a
non-exact bound and its certificate is not already exact (dual optimum interior), its
class-split bounds, and if still needed its exact bound, are computed, cached in memory and
in the returned cache dict, and the affected pairs are re-certified.

All certificate arithmetic is float64 and subtracts bounds on its own rounding errors; CG
search directions may use float32 (``solver_dtype``), which cannot affect soundness because
every certified quantity is re-evaluated in float64 at the final point.  We certify the
mathematical function ``h`` with ``σ(x) = log(1 + eˣ)`` (the head's float32 forward and the
``threshold=20`` shortcut of ``F.softplus`` differ from it by rounding only).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from lipcli.sdk.certificates import (
    HEURISTIC_NOTE,
    CertifyResult,
    cache_matches,
    competing_classes,
    make_cache,
)
from lipcli.sdk.hookspecs import hookimpl
from lipcli.numerics.spectral import UNIT_ROUNDOFF as _U64  # float64
from lipcli.sdk.specs import SOUND, CertificateSpec, Param

_METHOD = "crc-lip"


# --------------------------------------------------------------------------------------------
# head weights and exact float64 evaluation of softplus and its derivatives
# --------------------------------------------------------------------------------------------


@dataclass
class MLPWeights:
    """Float64 (and float32) copies of an MLP head's weights plus norms used in error bounds."""

    w1: torch.Tensor  # (H, D) float64
    b1: torch.Tensor  # (H,)
    w2: torch.Tensor  # (c, H)
    b2: torch.Tensor  # (c,)
    w1_solver: torch.Tensor  # (H, D) in the CG dtype
    w1_row_norm: torch.Tensor  # (H,) ‖W₁[k]‖₂
    w1_frob: float  # ‖W₁‖_F
    w2_abs: torch.Tensor  # (c, H) |W₂|
    w2_row_norm: torch.Tensor  # (c,) ‖W₂[i]‖₂
    w1_sq_bound: float = math.inf  # verified upper bound on ‖W₁‖₂² (set by the certifier)

    @property
    def hidden(self) -> int:
        return self.w1.shape[0]

    @property
    def dim(self) -> int:
        return self.w1.shape[1]

    @property
    def num_classes(self) -> int:
        return self.w2.shape[0]

    @property
    def device(self) -> torch.device:
        return self.w1.device


def mlp_weights(head: nn.Module, solver_dtype: torch.dtype = torch.float32) -> MLPWeights:
    """Extract ``W₁, b₁, W₂, b₂`` from ``head.fc1`` / ``head.fc2`` as float64 tensors."""
    if not (hasattr(head, "fc1") and hasattr(head, "fc2")):
        raise TypeError("crc-lip certifies heads with fc1 = Linear(D, H), fc2 = Linear(H, c)")
    with torch.no_grad():
        w1 = head.fc1.weight.detach().to(torch.float64).contiguous()
        w2 = head.fc2.weight.detach().to(torch.float64).contiguous()
        b1 = _bias(head.fc1, w1.shape[0], w1.device)
        b2 = _bias(head.fc2, w2.shape[0], w1.device)
        return MLPWeights(
            w1=w1,
            b1=b1,
            w2=w2,
            b2=b2,
            w1_solver=w1.to(solver_dtype).contiguous(),
            w1_row_norm=w1.norm(dim=1),
            w1_frob=float(w1.norm()),
            w2_abs=w2.abs(),
            w2_row_norm=w2.norm(dim=1),
        )


def _bias(layer: nn.Module, size: int, device: torch.device) -> torch.Tensor:
    bias = getattr(layer, "bias", None)
    if bias is None:
        return torch.zeros(size, dtype=torch.float64, device=device)
    return bias.detach().to(torch.float64)


def softplus64(z: torch.Tensor) -> torch.Tensor:
    """``log(1 + eᶻ)`` to full float64 accuracy (no threshold shortcut)."""
    return z.clamp_min(0) + torch.log1p(torch.exp(-z.abs()))


def _hidden_error(z: torch.Tensor, z_err: torch.Tensor, sp: torch.Tensor, hidden: int) -> torch.Tensor:
    """Per-unit bound on |computed σ(z) - exact σ(z_exact)| incl. the later summation error.

    ``z_err`` bounds |z - z_exact|; σ is 1-Lipschitz; σ's own evaluation costs a few ulps;
    the summation ``Σ_k d_k σ_k`` over ``H`` terms adds at most ``γ_{H+2} Σ|d_k| σ_k``.
    """
    return z_err + 8 * _U64 * (sp + 1.0) + (hidden + 4) * _U64 * sp


# --------------------------------------------------------------------------------------------
# guaranteed curvature bounds
# --------------------------------------------------------------------------------------------


def verified_lambda_max(gram: torch.Tensor, gram_err: float, rel: float = 2e-6) -> float:
    """A guaranteed upper bound on ``λ_max`` of the exact matrix that ``gram`` approximates.

    ``gram`` is a float64 symmetric matrix with ``‖gram - A‖₂ <= gram_err`` for the exact
    ``A``.  An estimate ``θ`` (:func:`top_eigenvalue_estimate`) is *verified*: ``X = tI - gram``
    with ``t = θ + rel·|θ|`` is shown positive definite by a float64 Cholesky of
    ``X - cI``, ``c = γ_{n+1}/(1-γ_{n+1}) · tr(X) + tiny`` (Rump 2006: if that floating-point
    factorisation succeeds, ``X`` is positive definite).  ``rel`` grows by factors of 4
    until verification succeeds.  Returns ``t + (diagonal rounding) + gram_err``.
    """
    n = gram.shape[0]
    if n == 0:
        return 0.0
    diag_max = float(gram.diagonal().abs().max())
    if diag_max == 0.0 and float(gram.abs().max()) == 0.0:
        return gram_err
    theta = top_eigenvalue_estimate(gram)
    scale = max(abs(theta), diag_max, 1e-300)
    eye = torch.eye(n, dtype=torch.float64, device=gram.device)
    gamma = (n + 1) * _U64 / (1 - (n + 1) * _U64)
    while True:
        t = max(theta, 0.0) + rel * scale
        x = t * eye - gram
        trace_x = float(x.diagonal().sum())
        c = gamma / (1 - gamma) * max(trace_x, 0.0) + 1e-290
        if _cholesky_succeeds(x - c * eye):
            # fl(t - gram_ii) carries one rounding: |error| <= u (t + |gram_ii|)
            return t + 2 * _U64 * (t + diag_max) + c + gram_err
        rel *= 4.0
        if rel > 1e6:  # cannot happen for a symmetric matrix; be safe anyway
            return float(gram.abs().sum(dim=1).max()) * (1 + 1e-12) + gram_err


def top_eigenvalue_estimate(sym: torch.Tensor, block: int = 8, steps: int = 40) -> float:
    """Estimate of ``λ_max`` of a symmetric matrix (a Ritz value, so typically a hair low).

    Small matrices: float64 ``eigvalsh``.  Large ones: Rayleigh-Ritz on a block Krylov space
    ``span{V, AV, ..., A^steps V}`` (``V`` random ``n×block``) in float32 -- a few GEMMs
    instead of a dense float32 ``eigvalsh`` (10-50× slower on a 2-core CPU for n = 2048).
    Only an estimate: :func:`verified_lambda_max` proves the bound it returns.
    """
    n = sym.shape[0]
    if n <= 256:
        return float(torch.linalg.eigvalsh(sym).max())
    a = sym.to(torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn(n, block, generator=gen, dtype=torch.float64).to(a.device)
    blocks = []
    for _ in range(steps + 1):
        # thin QR in float64 (LAPACK's float32 QR is far slower here)
        with _small_lapack(v):
            v, _ = torch.linalg.qr(v.to(torch.float64))
        blocks.append(v)
        v = a @ v.to(torch.float32)
    basis = torch.cat(blocks, dim=1)
    with _small_lapack(basis):
        q, _ = torch.linalg.qr(basis)
    q32 = q.to(torch.float32)
    t = (q32.T @ (a @ q32)).to(torch.float64)
    with _small_lapack(t):
        return float(torch.linalg.eigvalsh(0.5 * (t + t.T)).max())


@contextlib.contextmanager
def _small_lapack(x: torch.Tensor):
    """Run thin/small CPU LAPACK calls on one thread.

    On a 2-core CPU whose other core is busy, multi-threaded LAPACK on thin matrices spends
    its time in barriers: a 2048×104 QR took 0.5 s with 2 threads and 7 ms with 1.
    """
    if x.device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cholesky_succeeds(x: torch.Tensor) -> bool:
    """Whether a floating-point Cholesky factorisation of ``x`` (float64) runs to completion.

    Small CPU matrices go to LAPACK ``dpotrf`` through SciPy (torch's call overhead is ~30 ms);
    large ones and GPU tensors to ``torch.linalg.cholesky_ex``.
    """
    if x.device.type == "cpu" and x.shape[0] <= 512:
        from scipy.linalg import lapack

        _, info = lapack.dpotrf(x.numpy(), lower=1, clean=0)
        return int(info) == 0
    _, info = torch.linalg.cholesky_ex(x)
    return int(info) == 0


def weighted_gram(w1: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``W₁ᵀ diag(weights) W₁`` (``weights >= 0``) in float64 and a bound on its rounding error.

    Only rows with positive weight enter.  Error: each entry is an ``m``-term dot product of
    products with one extra rounding, so ``|ΔA| <= γ_{m+2} |B|ᵀ|B|`` entrywise with
    ``B = diag(√w) W₁``, whence ``‖ΔA‖₂ <= γ_{m+2} ‖B‖_F² = γ_{m+2} Σ_k w_k ‖W₁[k]‖²``.
    """
    support = weights > 0
    rows = w1[support]
    wts = weights[support]
    m = rows.shape[0]
    gram = (rows * wts.unsqueeze(1)).T @ rows
    gram = 0.5 * (gram + gram.T)  # exactly symmetric (averaging adds <= u relative)
    trace = float((wts * rows.pow(2).sum(dim=1)).sum().detach())
    gamma = (m + 4) * _U64 / (1 - (m + 4) * _U64)
    return gram, 2 * gamma * trace * (1 + 1e-10)


class CurvatureBounds:
    """Guaranteed upper bounds ``Λ(a, b) = ¼ λ_max(W₁ᵀ diag((W₂[a] - W₂[b])⁺) W₁)``.

    ``m_lj = Λ(j, l)`` bounds the negative curvature of ``g = h_l - h_j``.  Three levels; the
    table holds the smallest bound available for every ordered pair:

    * global: ``¼ max_k (W₂[a] - W₂[b])⁺_k · ‖W₁‖₂²`` (free once ``‖W₁‖₂²`` is bounded);
    * class split: since ``(x - y)⁺ <= x⁺ + y⁻`` elementwise,
      ``W₁ᵀdiag((W₂[a]-W₂[b])⁺)W₁ ⪯ P_a + N_b`` with ``P_a = W₁ᵀdiag(W₂[a]⁺)W₁`` and
      ``N_b = W₁ᵀdiag(W₂[b]⁻)W₁``, so ``Λ(a, b) <= ¼λ_max(P_a) + ¼λ_max(N_b)`` (Weyl).  One
      eigenvalue bound per class and sign serves all ``c - 1`` pairs it appears in;
    * exact: the verified eigenvalue bound of the pair itself (:meth:`compute_exact`).

    Measured on a 10-class 4096×2048 head trained without curvature penalty, the global bound
    is ~3.9× the exact value and the class split ~1.3× (median over pairs).
    """

    def __init__(
        self,
        weights: MLPWeights,
        w1_sq_bound: float,
        exact: dict[tuple[int, int], float] | None = None,
        class_pos: dict[int, float] | None = None,
        class_neg: dict[int, float] | None = None,
    ):
        self.weights = weights
        self.w1_sq_bound = w1_sq_bound
        self.exact: dict[tuple[int, int], float] = {}
        self.class_pos: dict[int, float] = {}
        self.class_neg: dict[int, float] = {}
        self.seconds_exact = 0.0
        self.num_computed = 0
        c = weights.num_classes
        w2 = weights.w2
        glob = torch.empty(c, c, dtype=torch.float64, device=w2.device)
        for a in range(c):  # (c, H) per row keeps memory at c·H
            glob[a] = (w2[a].unsqueeze(0) - w2).clamp_min(0).amax(dim=1)
        # max((W₂[a]-W₂[b])⁺) carries one rounding (relative u) -> inflate
        self.global_table = 0.25 * glob * w1_sq_bound * (1 + 4 * _U64)
        self.table = self.global_table.clone()
        self.is_exact = torch.zeros(c, c, dtype=torch.bool, device=w2.device)
        for a_cls, value in (class_pos or {}).items():
            self._store_class(a_cls, value, positive=True)
        for b_cls, value in (class_neg or {}).items():
            self._store_class(b_cls, value, positive=False)
        for (a_cls, b_cls), value in (exact or {}).items():
            self._store(a_cls, b_cls, value)

    # ---- storing ----

    def _store(self, a: int, b: int, value: float) -> None:
        self.exact[(a, b)] = value
        # the exact bound could exceed another one only through its tiny slack
        self.table[a, b] = min(value, float(self.table[a, b]))
        self.is_exact[a, b] = True

    def _store_class(self, cls: int, value: float, positive: bool) -> None:
        (self.class_pos if positive else self.class_neg)[cls] = value
        other = self.class_neg if positive else self.class_pos
        for k, v in other.items():
            a, b = (cls, k) if positive else (k, cls)
            if a != b:
                split = (value + v) * (1 + 4 * _U64)  # the addition rounds once
                self.table[a, b] = min(float(self.table[a, b]), split)

    # ---- computing ----

    @staticmethod
    def compute_w1_sq_bound(weights: MLPWeights) -> float:
        """Verified upper bound on ``‖W₁‖₂²`` (Gram of the smaller side)."""
        w1 = weights.w1
        if w1.shape[0] < w1.shape[1]:
            w1 = w1.T
        gram, err = weighted_gram(w1, torch.ones(w1.shape[0], dtype=torch.float64, device=w1.device))
        return verified_lambda_max(gram, err)

    def _quarter_lambda(self, weights: torch.Tensor) -> float:
        """Verified ``¼ λ_max(W₁ᵀ diag(weights) W₁)`` for ``weights >= 0`` (timed)."""
        start = time.perf_counter()
        value = 0.0
        if bool((weights > 0).any()):
            gram, err = weighted_gram(self.weights.w1, weights)
            value = 0.25 * verified_lambda_max(gram, err)
        self.seconds_exact += time.perf_counter() - start
        self.num_computed += 1
        return value

    def compute_class_bound(self, cls: int, positive: bool) -> None:
        """``¼λ_max(P_cls)`` (``positive``) or ``¼λ_max(N_cls)``; tightens the table."""
        if cls in (self.class_pos if positive else self.class_neg):
            return
        row = self.weights.w2[cls]
        self._store_class(cls, self._quarter_lambda((row if positive else -row).clamp_min(0)), positive)

    def compute_class_bounds(self) -> None:
        """All ``2c`` class-split bounds."""
        for cls in range(self.weights.num_classes):
            self.compute_class_bound(cls, True)
            self.compute_class_bound(cls, False)

    def compute_exact(self, a: int, b: int) -> float:
        """Exact (verified) ``Λ(a, b)``; cached."""
        if (a, b) not in self.exact:
            w2 = self.weights.w2
            # the difference of two float64-cast float32 numbers may round once: inflate
            self._store(a, b, self._quarter_lambda((w2[a] - w2[b]).clamp_min(0) * (1 + 2 * _U64)))
        return self.exact[(a, b)]

    def tighten(self, a: int, b: int) -> None:
        """Next level for ``Λ(a, b)``: its class-split bounds if missing, else the exact bound."""
        if a not in self.class_pos or b not in self.class_neg:
            self.compute_class_bound(a, True)
            self.compute_class_bound(b, False)
        else:
            self.compute_exact(a, b)

    # ---- lookup and persistence ----

    def lower_curvature(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(m, exact)`` of shape ``(B, c)``: ``m[b, j] = Λ(j, l_b)`` and whether it is exact."""
        return self.table[:, labels].T, self.is_exact[:, labels].T

    def to_cache(self) -> dict:
        return {
            "w1_sq_bound": self.w1_sq_bound,
            "pair_bounds": {f"{a},{b}": v for (a, b), v in sorted(self.exact.items())},
            "class_pos": {str(k): v for k, v in sorted(self.class_pos.items())},
            "class_neg": {str(k): v for k, v in sorted(self.class_neg.items())},
        }

    @classmethod
    def from_cache(cls, weights: MLPWeights, cache: dict) -> "CurvatureBounds":
        exact = {}
        for key, value in cache.get("pair_bounds", {}).items():
            a, b = (int(s) for s in key.split(","))
            exact[(a, b)] = float(value)
        pos = {int(k): float(v) for k, v in cache.get("class_pos", {}).items()}
        neg = {int(k): float(v) for k, v in cache.get("class_neg", {}).items()}
        return cls(weights, float(cache["w1_sq_bound"]), exact, pos, neg)


# --------------------------------------------------------------------------------------------
# closed-form certificate
# --------------------------------------------------------------------------------------------


def closed_form_radius(g: torch.Tensor, grad_norm: torch.Tensor, curvature: torch.Tensor) -> torch.Tensor:
    """``r_fast = 2g / (√(‖∇g‖² + 2Kg) + ‖∇g‖)`` (SPEC §4), 0 where ``g <= 0``.

    Inputs must already be rounding-safe: ``g`` a lower bound, ``grad_norm`` and
    ``curvature`` upper bounds.  ``+inf`` when ``K = ‖∇g‖ = 0 < g`` (``g`` convex with its
    minimum at ``y``: it never reaches 0).
    """
    g_pos = g.clamp_min(0)
    denom = torch.sqrt(grad_norm.pow(2) + 2 * curvature * g_pos) + grad_norm
    r = torch.where(denom > 0, 2 * g_pos / denom, torch.full_like(g_pos, math.inf))
    r = torch.where(g > 0, r, torch.zeros_like(r))
    # the square root and division add a few ulps: shave a relative 1e-14
    return r * (1 - 1e-14)


@dataclass
class PairMargins:
    """Float64 quantities at ``y`` for every input and class ``j`` (see :func:`pair_margins`)."""

    z0: torch.Tensor  # (B, H) W₁y + b₁
    z0_err: torch.Tensor  # (B, H) bound on its rounding error
    s1: torch.Tensor  # (B, H) σ'(z0) = sigmoid
    logits: torch.Tensor  # (B, c)
    pred: torch.Tensor  # (B,) argmax
    g: torch.Tensor  # (B, c) margins h_l - h_j
    g_lo: torch.Tensor  # (B, c) lower bounds on the exact margins
    gn_hi: torch.Tensor  # (B, c) upper bounds on ‖∇g_lj(y)‖


def pair_margins(w, y: torch.Tensor, w1_sq_bound: float, pair_gradients) -> PairMargins:
    """Logits, predictions, margin lower bounds and gradient-norm upper bounds at ``y``
    (float64, every rounding error bounded), the inputs of the closed form and the dual.

    ``w`` has the fields of :class:`MLPWeights` (``w1, b1, w2, b2, w1_row_norm, w2_abs,
    w2_row_norm, w1_frob, hidden, dim``): the certifier's weights, or the exported
    certificate module holding them as buffers.  ``pair_gradients(s1, pred)`` gives
    ``‖∇g_lj(y)‖`` ``(B, c)`` (its matrix-product rounding is covered by the bound below).
    Written with ``gather``/``index_select`` so that ``torch.export`` and ONNX can trace it."""
    u, hidden = _U64, w.hidden
    z0 = y @ w.w1.T + w.b1
    y_norm = y.norm(dim=1, keepdim=True)
    z0_err = (w.dim + 4) * u * (w.w1_row_norm * y_norm + w.b1.abs()) + 2 * u * z0.abs()
    sp = softplus64(z0)
    s1 = torch.sigmoid(z0)
    logits = sp @ w.w2.T + w.b2
    pred = logits.argmax(dim=1)
    own = pred.unsqueeze(1)
    hid_err = _hidden_error(z0, z0_err, sp, hidden) @ w.w2_abs.T  # (B, c)
    bias_err = 4 * u * w.b2.abs()
    top = logits.gather(1, own)
    g = top - logits
    g_err = hid_err.gather(1, own) + hid_err + bias_err.index_select(0, pred).unsqueeze(1) + bias_err
    g_err = g_err + 4 * u * (top.abs() + logits.abs())
    gn = pair_gradients(s1, pred)
    max_zerr = z0_err.amax(dim=1, keepdim=True)
    gn_err = ((hidden + 4) * u * w.w1_frob + math.sqrt(w1_sq_bound) * (0.25 * max_zerr + 8 * u)) * (
        w.w2_row_norm.index_select(0, pred).unsqueeze(1) + w.w2_row_norm.unsqueeze(0)
    ) + 8 * u * gn
    return PairMargins(z0, z0_err, s1, logits, pred, g, g - g_err, gn + gn_err)


# --------------------------------------------------------------------------------------------
# dual (CRC) certificate: batched safeguarded Newton on the KKT system
# --------------------------------------------------------------------------------------------


@dataclass
class DualSettings:
    """Tolerances of the dual solve (see the module docstring)."""

    grad_tol: float = 1e-6  #: ‖∇F_η(δ)‖ required for a dual certificate (paper)
    dual_rtol: float = 1e-7  #: stop when the predicted gain of d(η) <= dual_rtol·d(η)
    boundary: float = 1e-3  #: τ: η <= (1 - τ)/m, so μ = 1 - ηm >= τ
    max_iter: int = 40  #: Newton iterations per pair solve
    cg_rtol: float = 1e-4  #: relative residual of each CG solve
    cg_max_iter: int = 200
    solver_dtype: torch.dtype = torch.float32


@dataclass
class DualResult:
    """Per-column outcome of :func:`solve_dual`."""

    radius: torch.Tensor  # sound dual radius (0 if never certified)
    eta: torch.Tensor
    tight: torch.Tensor  # η search converged inside [0, (1-τ)/m): certificate ≈ distance
    at_boundary: torch.Tensor  # η hit (1-τ)/m with d' > 0: a smaller m could help
    upper: torch.Tensor  # ‖δ‖ at an evaluated point with g(y+δ) < 0 (else inf)
    iterations: torch.Tensor
    hvps: int = 0  # Hessian-vector products (per column, summed)


def _batched_cg(
    w1: torch.Tensor,
    rhs: torch.Tensor,
    diag: torch.Tensor,
    eta: torch.Tensor,
    rtol: float,
    max_iter: int,
) -> tuple[torch.Tensor, int]:
    """Solve ``(I + η_i W₁ᵀ diag(diag_i) W₁) x_i = rhs_i`` for every row ``i`` by CG.

    All matrices are positive definite (``η_i m <= 1 - τ``).  Rows stop once their residual
    is below ``rtol·‖rhs_i‖``; the working set is compacted as rows finish.  Runs in
    ``w1.dtype``.  Returns ``(x float64, number of operator applications)``.
    """
    dtype = w1.dtype
    n = rhs.shape[0]
    scale = rhs.norm(dim=1, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    x_out = torch.zeros(rhs.shape, dtype=dtype, device=rhs.device)
    idx = torch.arange(n, device=rhs.device)
    r = (rhs / scale).to(dtype)  # unit right-hand sides: no float32 under/overflow
    dg = diag.to(dtype)
    et = eta.to(dtype).unsqueeze(1)
    x = torch.zeros_like(r)
    p = r.clone()
    rs = (r * r).sum(dim=1)
    target = (rtol**2) * rs
    applications = 0
    for _ in range(max_iter):
        live = rs > target
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live < 0.5 * live.numel():  # compact the working set (a copy) only now and then
            done = ~live
            x_out[idx[done]] = x[done]
            idx, r, dg, et, x, p, rs, target = (
                idx[live], r[live], dg[live], et[live], x[live], p[live], rs[live], target[live]
            )
            live = rs > target
        ap = p + et * ((p @ w1.T) * dg) @ w1
        applications += n_live
        pap = (p * ap).sum(dim=1)
        # finished rows (and breakdowns) take no step: alpha = 0 keeps x, r, p frozen
        alpha = torch.where(live & (pap > 0), rs / pap.clamp_min(1e-30), torch.zeros_like(pap))
        x += alpha.unsqueeze(1) * p
        r -= alpha.unsqueeze(1) * ap
        rs_new = (r * r).sum(dim=1)
        beta = torch.where(live, rs_new / rs.clamp_min(1e-30), torch.zeros_like(rs_new))
        p = torch.where(live.unsqueeze(1), r + beta.unsqueeze(1) * p, p)
        # a breakdown (pap <= 0) stops the row
        rs = torch.where(live & ~(pap > 0), torch.zeros_like(rs_new), torch.where(live, rs_new, rs))
    x_out[idx] = x
    return x_out.to(torch.float64) * scale, applications


def solve_dual(
    weights: MLPWeights,
    z0: torch.Tensor,
    z0_err: torch.Tensor,
    a: torch.Tensor,
    c0: torch.Tensor,
    g0: torch.Tensor,
    grad0: torch.Tensor,
    m: torch.Tensor,
    settings: DualSettings,
) -> DualResult:
    """Batched dual (CRC) certificates for ``N`` columns ``(y_i, d_i)``.

    Args:
        weights: the head (:func:`mlp_weights`).
        z0: ``(N, H)`` ``W₁y + b₁`` at the features ``y``, with rounding bound ``z0_err``.
        a: ``(N, H)`` ``d = W₂[l] - W₂[j]``; ``c0``: ``(N,)`` ``b₂[l] - b₂[j]``.
        g0, grad0: ``g(y) > 0`` and ``∇g(y)`` (starting point only).
        m: ``(N,)`` guaranteed upper bounds on the negative curvature of ``g``.
        settings: tolerances.
    Returns:
        :class:`DualResult`.  ``radius`` is the best sound value over all evaluated points
        with ``‖∇F_η(δ)‖ <= grad_tol``: ``√(2(F - ‖∇F‖²/(2μ)))`` minus rounding bounds; 0
        where no such point was reached.
    """
    w1 = weights.w1
    hidden, dim = weights.hidden, weights.dim
    n = z0.shape[0]
    dev = z0.device
    f64 = torch.float64
    sqrt_w1 = math.sqrt(weights.w1_sq_bound)

    grad0_sq = grad0.pow(2).sum(dim=1)
    inf = torch.full_like(g0, math.inf)
    eta_max = torch.where(m > 0, (1 - settings.boundary) / m.clamp_min(1e-300), inf)
    # linear model: g(y - η∇g) = 0 at η₀ = g/‖∇g‖² (exact for a linear head)
    eta0 = torch.where(grad0_sq > 0, g0 / grad0_sq.clamp_min(1e-300), inf)
    eta_cap = torch.minimum(eta_max, torch.where(torch.isfinite(eta0), 1e6 * eta0, torch.full_like(eta0, 1e6)))
    eta = torch.minimum(eta0, 0.5 * eta_cap)
    eta = torch.where(torch.isfinite(eta) & (eta > 0), eta, torch.minimum(torch.ones_like(eta), 0.5 * eta_cap))
    delta = -eta.unsqueeze(1) * grad0

    def zeros(dtype: torch.dtype = f64) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, device=dev)

    # working set: every per-column tensor, compacted (rows dropped) when half are done
    ws = {
        "orig": torch.arange(n, device=dev),
        "z0": z0, "z0_err": z0_err, "a": a, "a_abs": a.abs(), "c0": c0, "m": m,
        "eta_max": eta_max, "eta_cap": eta_cap, "delta": delta, "eta": eta,
        "lo": zeros(), "hi": eta_cap.clone(), "frozen": zeros(torch.bool),
        "at_boundary": zeros(torch.bool), "tight": zeros(torch.bool), "done": zeros(torch.bool),
        "best": zeros(), "upper": torch.full((n,), math.inf, dtype=f64, device=dev),
        "iters": zeros(torch.long), "prev_delta": delta.clone(),
        "prev_f": torch.full((n,), math.inf, dtype=f64, device=dev), "prev_slope": zeros(),
        "check_armijo": zeros(torch.bool),
    }
    outputs = ("best", "eta", "tight", "at_boundary", "upper", "iters", "done")
    out = {k: ws[k].clone() for k in outputs}
    hvps = 0

    def flush(rows: torch.Tensor) -> None:
        for k in outputs:
            out[k][ws["orig"][rows]] = ws[k][rows]

    for _ in range(settings.max_iter):
        live = ~ws["done"]
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live < 0.5 * live.numel():
            flush(~live)
            ws = {k: v[live] for k, v in ws.items()}
            live = ~ws["done"]
        w = ws
        delta, eta, m_w, a_w = w["delta"], w["eta"], w["m"], w["a"]
        w["iters"] += live.long()
        z = w["z0"] + delta @ w1.T  # W₁(y + δ) + b₁
        sp = softplus64(z)
        s1 = torch.sigmoid(z)
        gv = (a_w * sp).sum(dim=1) + w["c0"]  # g(y + δ)
        grad = (a_w * s1) @ w1  # ∇g(y + δ)
        resid = delta + eta.unsqueeze(1) * grad  # ∇F_η(δ)
        rn, dn, gnorm = resid.norm(dim=1), delta.norm(dim=1), grad.norm(dim=1)
        fval = 0.5 * dn.pow(2) + eta * gv  # F_η(δ)

        # sound certificate from this point: d(η) >= F - ‖∇F‖²/(2μ) (minus rounding bounds)
        mu = 1 - eta * m_w * (1 + 4 * _U64) - 4 * _U64  # rounding-safe lower bound on 1 - ηm
        ok = live & (rn <= settings.grad_tol) & (mu > 0)
        if bool(ok.any()):
            k = ok.nonzero().squeeze(1)
            z_k, dn_k, e_k, gv_k, a_abs_k = z[k], dn[k], eta[k], gv[k], w["a_abs"][k]
            z_err = w["z0_err"][k] + (dim + 4) * _U64 * weights.w1_row_norm * dn_k.unsqueeze(1) + 2 * _U64 * z_k.abs()
            g_err = (a_abs_k * _hidden_error(z_k, z_err, sp[k], hidden)).sum(dim=1) + 4 * _U64 * w["c0"][k].abs()
            grad_err = (hidden + 4) * _U64 * weights.w1_frob * (a_w[k] * s1[k]).norm(dim=1) + sqrt_w1 * (
                a_abs_k * (0.25 * z_err + 8 * _U64)
            ).norm(dim=1)
            r_err = e_k * grad_err + (dim + 8) * _U64 * (dn_k + e_k * gnorm[k])
            f_err = e_k * g_err + (dim + 8) * _U64 * (dn_k.pow(2) + e_k * gv_k.abs())
            r_sq = 2 * (fval[k] - f_err - (rn[k] + r_err).pow(2) / (2 * mu[k]))
            cert = torch.where(r_sq > 0, r_sq.clamp_min(0).sqrt() * (1 - 1e-14), torch.zeros_like(r_sq))
            w["best"][k] = torch.maximum(w["best"][k], cert)
            crossed = gv_k + g_err < 0
            w["upper"][k] = torch.where(crossed, torch.minimum(w["upper"][k], dn_k), w["upper"][k])

        # Armijo backtracking for pure inner (η frozen) Newton steps
        bad = live & w["check_armijo"] & (fval > w["prev_f"] - 1e-4 * w["prev_slope"] + 1e-13 * fval.abs())
        if bool(bad.any()):
            delta = torch.where(bad.unsqueeze(1), w["prev_delta"] + 0.5 * (delta - w["prev_delta"]), delta)
            w["delta"] = delta
            w["prev_slope"] = torch.where(bad, 0.5 * w["prev_slope"], w["prev_slope"])

        # bracket on η where the inner solution is accurate enough to trust sign(d'(η))
        reliable = live & ~bad & (rn * gnorm / mu.clamp_min(1e-12) <= 0.25 * gv.abs())
        w["lo"] = torch.where(reliable & (gv > 0), torch.maximum(w["lo"], eta), w["lo"])
        w["hi"] = torch.where(reliable & (gv < 0), torch.minimum(w["hi"], eta), w["hi"])
        pinned = reliable & (gv > 0) & (eta >= w["eta_cap"] * (1 - 1e-12))
        w["at_boundary"] |= pinned & (w["eta_cap"] >= w["eta_max"])
        w["frozen"] |= pinned

        fin = live & w["frozen"] & (rn <= settings.grad_tol) & ~bad
        w["done"] |= fin
        step = live & ~fin & ~bad
        w["check_armijo"] = bad
        if not bool(step.any()):
            continue

        # Newton directions: H⁻¹∇F for stepping columns, H⁻¹∇g for those still searching η
        srch = step & ~w["frozen"]
        hess_diag = a_w * (s1 * torch.sigmoid(-z))  # d ⊙ σ''(z)
        rhs = torch.cat([resid * step.unsqueeze(1), grad * srch.unsqueeze(1)], dim=0)  # zero rows idle
        sol, apps = _batched_cg(
            weights.w1_solver, rhs, torch.cat([hess_diag, hess_diag]), torch.cat([eta, eta]),
            settings.cg_rtol, settings.cg_max_iter,
        )
        hvps += apps
        p_dir, q_dir = sol[: eta.numel()], sol[eta.numel():]  # H⁻¹∇F, H⁻¹∇g

        t = (grad * q_dir).sum(dim=1).clamp_min(1e-300)  # -d''(η)
        # KKT Newton: [[H, ∇g], [∇gᵀ, 0]] (Δδ, Δη) = -(∇F, g)
        d_eta = (gv - (grad * p_dir).sum(dim=1)) / t
        gain = gv.pow(2) / (2 * t)  # Newton model's predicted increase of d(η)
        converged = srch & (gain <= settings.dual_rtol * fval.abs()) & (rn <= 1e-3 * dn + settings.grad_tol)
        prop = torch.clamp(eta + d_eta, min=eta / 4, max=eta * 4)  # trust region
        lo, hi, cap = w["lo"], w["hi"], w["eta_cap"]
        h_real = hi < cap
        prop = torch.where(h_real & ((prop <= lo) | (prop >= hi)), 0.5 * (lo + hi), prop)
        prop = torch.where(prop <= lo, 0.5 * (lo + eta), prop)
        prop = torch.minimum(prop, cap)
        new_eta = torch.where(srch & ~converged, prop, eta)
        w["frozen"] |= converged
        # converged with d'(η) ≈ 0 strictly inside the strongly convex range: the dual optimum
        # is attained at a point with g ≈ 0, so dual == primal (exact certificate)
        w["tight"] |= converged & (eta < w["eta_max"] * (1 - 1e-9))
        move = -p_dir - torch.where(srch, new_eta - eta, torch.zeros_like(eta)).unsqueeze(1) * q_dir
        w["prev_delta"] = torch.where(step.unsqueeze(1), delta, w["prev_delta"])
        w["prev_f"] = torch.where(step, fval, w["prev_f"])
        w["prev_slope"] = torch.where(step, (resid * p_dir).sum(dim=1), w["prev_slope"])  # -∇Fᵀ(Δδ)
        w["check_armijo"] = bad | (step & w["frozen"] & (new_eta == eta))
        w["delta"] = torch.where(step.unsqueeze(1), delta + move, delta)
        w["eta"] = new_eta

    flush(torch.ones_like(ws["done"]))
    return DualResult(
        radius=out["best"],
        eta=out["eta"],
        tight=out["tight"] & out["done"] & (out["best"] > 0),
        at_boundary=out["at_boundary"],
        upper=out["upper"],
        iterations=out["iters"],
        hvps=hvps,
    )


# --------------------------------------------------------------------------------------------
# the certifier
# --------------------------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class CRCCertifier:
    """CRC-Lip certifier of an MLP head (see the module docstring for the mathematics).

    Args:
        curvature: ``"lazy"`` (global and class-split bounds in :meth:`prepare` -- ``2c``
            verified eigenvalue bounds -- then exact bounds for the pairs that limit a
            certificate, computed when needed and cached), ``"exact"`` (exact bounds for all
            ``c(c-1)`` ordered pairs in :meth:`prepare`), ``"global"`` (compute nothing beyond
            the global bound; bounds found in a given cache are still used).
        dual: also run the dual (CRC) solve; ``False`` gives the closed form only.
        grad_tol, dual_rtol, boundary, max_iter, cg_rtol, cg_max_iter, solver_dtype: see
            :class:`DualSettings`.
        chunk_size: inputs certified together.
        trust_cache: reuse the curvature bounds of a cache given to :meth:`prepare` (one
            whose fingerprint matches the head) without recomputing them.  Off by default:
            a cache read from a model file is data anyone can edit (the fingerprint only
            shows which weights it claims to be for), and a forged bound smaller than the
            true curvature gives radii larger than the true ones.  With the default the
            bounds are recomputed (guaranteed by construction); the certifier's own cache is
            always reused within a process.
    """

    name = _METHOD
    promises = (SOUND,)

    def __init__(
        self,
        curvature: str = "lazy",
        dual: bool = True,
        grad_tol: float = 1e-6,
        dual_rtol: float = 1e-7,
        boundary: float = 1e-3,
        max_iter: int = 40,
        cg_rtol: float = 1e-4,
        cg_max_iter: int = 200,
        solver_dtype: str = "float32",
        chunk_size: int = 256,
        trust_cache: bool = False,
    ) -> None:
        if curvature not in ("lazy", "exact", "global"):
            raise ValueError("curvature must be lazy, exact or global")
        if not 0 < boundary < 1:
            raise ValueError("boundary must be in (0, 1)")
        self.curvature = curvature
        self.dual = dual
        self.settings = DualSettings(
            grad_tol=grad_tol,
            dual_rtol=dual_rtol,
            boundary=boundary,
            max_iter=max_iter,
            cg_rtol=cg_rtol,
            cg_max_iter=cg_max_iter,
            solver_dtype=_DTYPES[solver_dtype],
        )
        self.chunk_size = max(1, chunk_size)
        self.trust_cache = bool(trust_cache)
        self.cache: dict = {}
        self.weights: MLPWeights | None = None
        self.bounds: CurvatureBounds | None = None
        self.prepare_seconds = 0.0
        self._head_key: tuple | None = None
        self._notes: list[str] = []

    # ---- per-model precomputation ----

    @staticmethod
    def _key(head: nn.Module) -> tuple:
        """Which head :meth:`prepare` ran for: parameter storage, version counter and shape.
        Writes that bypass version counters (``p.data[...] = ...``) are not seen: call
        :meth:`prepare` again after them (the ``lip certify`` driver builds a new certifier
        for every run)."""
        return tuple((p.data_ptr(), p._version, tuple(p.shape)) for p in head.state_dict().values())

    def prepare(self, head: nn.Module, cache: dict | None = None) -> dict:
        """Global curvature bounds (and, for ``curvature="exact"``, all pair bounds).

        Reuses the bounds in ``cache`` only when it carries this head's fingerprint *and* it
        is trusted: it is this certifier's own cache, or ``trust_cache`` is set (see the
        class docstring).  The returned dict is kept as :attr:`cache` and grows in place
        when :meth:`certify` computes more exact bounds.
        """
        start = time.perf_counter()
        self._notes = []
        self.weights = mlp_weights(head, self.settings.solver_dtype)
        matches = cache_matches(cache, self.name, head)
        trusted = matches and (self.trust_cache or (cache is self.cache and bool(cache)))
        if matches and trusted and cache is not self.cache:
            self._notes.append(
                "crc-lip: curvature bounds taken from the given cache without recomputing "
                "them (trust_cache=true): the certificate is sound only if that cache is"
            )
        if matches and not trusted:
            self._notes.append("crc-lip: stored curvature bounds not trusted; recomputed")
        if trusted:
            self.cache = cache
            self.weights.w1_sq_bound = float(cache["w1_sq_bound"])
            self.bounds = CurvatureBounds.from_cache(self.weights, cache)
            self._notes.append(
                f"crc-lip: reused cached curvature bounds ({len(self.bounds.exact)} exact pairs, "
                f"{len(self.bounds.class_pos) + len(self.bounds.class_neg)} class bounds)"
            )
        else:
            self.cache = make_cache(self.name, head)
            if cache is not None and not matches:
                self._notes.append("crc-lip: given cache does not match this head; recomputed")
            self.weights.w1_sq_bound = CurvatureBounds.compute_w1_sq_bound(self.weights)
            self.bounds = CurvatureBounds(self.weights, self.weights.w1_sq_bound)
        if self.curvature == "exact":
            c = self.weights.num_classes
            for a in range(c):
                for b in range(c):
                    if a != b:
                        self.bounds.compute_exact(a, b)
        self.cache.update(self.bounds.to_cache())
        self._head_key = self._key(head)
        self.prepare_seconds = time.perf_counter() - start
        return self.cache

    def export_certificate(self, head: nn.Module):
        """``lip export --certify``: the closed-form certificate with freshly computed
        guaranteed curvature bounds (:mod:`lipcli.builtins.crc.export`)."""
        from lipcli.builtins.crc.export import export_crc_certificate

        return export_crc_certificate(head)

    def _sync_cache(self) -> None:
        if self.bounds is not None:
            self.cache.update(self.bounds.to_cache())

    # ---- certification ----

    def certify(
        self, head: nn.Module, features: torch.Tensor, *, top_k: int | None = None
    ) -> CertifyResult:
        """Feature-space radii ``min_j max(r_fast, r_dual)`` for every input (see module doc)."""
        notes: list[str] = []
        if self.bounds is None or self._head_key != self._key(head):
            self.prepare(head, self.cache if self.cache else None)
        notes.extend(self._notes)  # set by prepare: identical for every chunk
        assert self.weights is not None and self.bounds is not None
        start = time.perf_counter()
        bounds_before, seconds_before = self.bounds.num_computed, self.bounds.seconds_exact
        stats = {"inputs": 0, "pairs": 0, "exact_radius_inputs": 0, "dual_solves": 0, "dual_tight": 0,
                 "dual_boundary": 0, "dual_improved": 0, "hvps": 0, "newton_iters": 0, "rounds": 0}
        results = []
        with torch.no_grad():
            feats = features.detach()
            for s in range(0, feats.shape[0], self.chunk_size):
                results.append(self._certify_chunk(feats[s : s + self.chunk_size], top_k, stats))
        self._sync_cache()
        c = self.weights.num_classes
        pred = torch.cat([r[0] for r in results]) if results else torch.zeros(0, dtype=torch.long)
        radius = torch.cat([r[1] for r in results]) if results else torch.zeros(0, dtype=torch.float64)
        exact = all(r[2] for r in results) if results else True
        stats.update(
            seconds=time.perf_counter() - start,
            curvature_seconds=self.bounds.seconds_exact - seconds_before,
            curvature_bounds_computed=self.bounds.num_computed - bounds_before,
            exact_pair_bounds_total=len(self.bounds.exact),
            class_bounds_total=len(self.bounds.class_pos) + len(self.bounds.class_neg),
            prepare_seconds_total=self.prepare_seconds,
        )
        levels = {
            "lazy": "global ¼·max(d⁻)·‖W₁‖² for every pair; class-split ¼λ(P_a)+¼λ(N_b) and exact "
            "per-pair bounds computed where a loose bound limits a radius, and cached",
            "exact": "exact per-pair bounds for all ordered pairs",
            "global": "global ¼·max(d⁻)·‖W₁‖² (plus bounds found in the cache), none computed",
        }[self.curvature]
        notes.append(f"crc-lip: guaranteed (verified) curvature bounds m_lj: {levels}")
        if self.dual:
            st = self.settings
            notes.append(
                "crc-lip: per pair max(closed form, dual CRC); dual only where it can lower the "
                f"input's minimum; dual certified at ‖∇F‖ <= {st.grad_tol:g} with the rigorous "
                f"strong-convexity correction, η <= (1-{st.boundary:g})/m, search tolerance "
                f"{st.dual_rtol:g}; CG directions in {str(st.solver_dtype).replace('torch.', '')}, "
                "certificates in float64"
            )
        else:
            notes.append("crc-lip: closed-form certificate only (dual disabled)")
        if not exact:
            notes.append(HEURISTIC_NOTE.format(k=top_k, c=c - 1))
        return CertifyResult(
            predictions=pred.cpu(),
            radius=radius.cpu(),
            exact_classes=exact,
            notes=notes,
            stats=stats,
        )

    def _pair_gradients(self, s1: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """‖∇g_lj(y)‖ for every input and class ``(B, c)`` (float64)."""
        w = self.weights
        assert w is not None
        batch, c = s1.shape[0], w.num_classes
        out = torch.empty(batch, c, dtype=torch.float64, device=s1.device)
        step = max(1, (1 << 23) // (c * w.hidden))
        for s in range(0, batch, step):
            sl = slice(s, s + step)
            diff = (w.w2[pred[sl]].unsqueeze(1) - w.w2.unsqueeze(0)) * s1[sl].unsqueeze(1)  # (b, c, H)
            out[sl] = (diff @ w.w1).norm(dim=2)
        return out

    def _certify_chunk(
        self, feats: torch.Tensor, top_k: int | None, stats: dict
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        w, bounds = self.weights, self.bounds
        assert w is not None and bounds is not None
        dev = w.device
        y = feats.to(device=dev, dtype=torch.float64)
        batch, c = y.shape[0], w.num_classes
        rows = torch.arange(batch, device=dev)

        t = pair_margins(w, y, bounds.w1_sq_bound, self._pair_gradients)
        z0, z0_err, s1, logits, pred, g, g_lo, gn_hi = (
            t.z0, t.z0_err, t.s1, t.logits, t.pred, t.g, t.g_lo, t.gn_hi)
        cand, exact_classes = competing_classes(logits, pred, top_k)

        inf = math.inf
        m, m_exact = bounds.lower_curvature(pred)
        r_fast = closed_form_radius(g_lo, gn_hi, m).masked_fill(~cand, inf)
        cert = r_fast.clone()  # per-pair certificate max(r_fast, r_dual) (r_fast if unsolved)
        solved = torch.zeros_like(cand)
        tight = torch.zeros_like(cand)
        stats["inputs"] += batch
        stats["pairs"] += int(cand.sum())

        for _tighten in range(c * c + 2 * c + 1):  # each pass computes >= 1 new bound
            if self.dual:
                first = True
                while True:
                    # pairs that could lower the input's minimum: r_fast below the best solved value
                    solved_min = cert.masked_fill(~solved, inf).amin(dim=1, keepdim=True)
                    need = cand & ~solved & (g_lo > 0) & torch.isfinite(r_fast) & (r_fast < solved_min)
                    if not bool(need.any()):
                        break
                    quota = 1 if first else 4
                    first = False
                    order = r_fast.masked_fill(~need, inf).argsort(dim=1)[:, :quota]
                    pick = torch.zeros_like(need)
                    pick.scatter_(1, order, True)
                    pick &= need
                    self._solve_pairs(pick, z0, z0_err, s1, pred, g, m, r_fast, cert, tight, stats)
                    solved |= pick
                    stats["rounds"] += 1
            radius = cert.masked_fill(~cand, inf).amin(dim=1)
            if self.curvature != "lazy":
                break
            # tighten the loose curvature bound of each input's deciding pair
            jstar = cert.masked_fill(~cand, inf).argmin(dim=1)
            improvable = (
                ~m_exact[rows, jstar] & ~tight[rows, jstar] & (g_lo[rows, jstar] > 0) & torch.isfinite(radius)
            )
            if not bool(improvable.any()):
                break
            wanted = {(int(j), int(l)) for j, l in zip(jstar[improvable].tolist(), pred[improvable].tolist())}
            for a_cls, b_cls in sorted(wanted):
                bounds.tighten(a_cls, b_cls)  # class-split bounds first, then the exact one
            m_new, m_exact = bounds.lower_curvature(pred)
            changed = m_new < m
            m = m_new
            r_fast = torch.where(changed, closed_form_radius(g_lo, gn_hi, m).masked_fill(~cand, inf), r_fast)
            cert = torch.where(changed, torch.maximum(cert, r_fast), cert)
            # a smaller m can only raise the dual too: re-solve where the pair was solved
            solved &= ~changed
            tight &= ~changed
        masked = cert.masked_fill(~cand, inf)
        radius, jstar = masked.min(dim=1)
        # the deciding pair's dual optimum is interior: the radius IS the distance to the
        # decision boundary (up to the search tolerance), not just a lower bound
        stats["exact_radius_inputs"] += int((tight[rows, jstar] & torch.isfinite(radius)).sum())
        radius = torch.where(torch.isnan(radius), torch.zeros_like(radius), radius).clamp_min(0)
        return pred.cpu(), radius.cpu(), exact_classes

    def _solve_pairs(
        self,
        pick: torch.Tensor,
        z0: torch.Tensor,
        z0_err: torch.Tensor,
        s1: torch.Tensor,
        pred: torch.Tensor,
        g: torch.Tensor,
        m: torch.Tensor,
        r_fast: torch.Tensor,
        cert: torch.Tensor,
        tight: torch.Tensor,
        stats: dict,
    ) -> None:
        """Dual solves for the ``(input, class)`` pairs in ``pick``; updates ``cert``, ``tight``."""
        w = self.weights
        assert w is not None
        bi, ji = pick.nonzero(as_tuple=True)
        li = pred[bi]
        a = w.w2[li] - w.w2[ji]
        grad0 = (a * s1[bi]) @ w.w1
        res = solve_dual(
            w, z0[bi], z0_err[bi], a, w.b2[li] - w.b2[ji], g[bi, ji], grad0, m[bi, ji], self.settings
        )
        rf = r_fast[bi, ji]
        # every value ever certified for the pair is sound: keep the best
        cert[bi, ji] = torch.maximum(cert[bi, ji], torch.maximum(rf, res.radius))
        tight[bi, ji] = res.tight & (res.radius >= rf)
        stats["dual_solves"] += int(bi.numel())
        stats["dual_tight"] += int(res.tight.sum())
        stats["dual_boundary"] += int(res.at_boundary.sum())
        stats["dual_improved"] += int((res.radius > rf).sum())
        stats["hvps"] += res.hvps
        stats["newton_iters"] += int(res.iterations.sum())


@hookimpl
def lip_certificates() -> list[CertificateSpec]:
    return [
        CertificateSpec(
            name=_METHOD,
            factory=CRCCertifier,
            description="curvature certificate of a softplus MLP head: closed form + dual (CRC), "
            "guaranteed curvature bounds, all classes",
            promises=(SOUND,),
            params=(
                Param(
                    name="curvature", type=str, default="lazy", choices=("lazy", "exact", "global"),
                    help="curvature bounds: class-split + exact where they decide a radius (lazy), "
                    "exact for all pairs up front, or global only",
                ),
                Param(name="dual", type=bool, default=True, help="run the dual (CRC) solve, not only the closed form"),
                Param(
                    name="grad_tol", type=float, default=1e-6,
                    help="inner gradient norm required for a dual certificate",
                ),
                Param(
                    name="dual_rtol", type=float, default=1e-7,
                    help="relative tolerance of the η search (dual value)",
                ),
                Param(
                    name="boundary", type=float, default=1e-3,
                    help="τ: η <= (1-τ)/m keeps the inner problem τ-strongly convex",
                ),
                Param(name="max_iter", type=int, default=40, help="Newton iterations per pair"),
                Param(name="cg_rtol", type=float, default=1e-4, help="relative residual of each CG solve"),
                Param(
                    name="solver_dtype", type=str, default="float32", choices=("float32", "float64"),
                    help="precision of CG search directions (certificates are always float64)",
                ),
                Param(name="chunk_size", type=int, default=256, help="inputs certified together"),
                Param(
                    name="trust_cache", type=bool, default=False,
                    help="reuse curvature bounds stored in the model file instead of recomputing "
                    "them (the certificate is then only as sound as that stored data)",
                ),
            ),
        )
    ]
