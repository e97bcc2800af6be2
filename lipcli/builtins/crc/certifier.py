r"""The ``crc-lip`` certificate: curvature-based certificates of a 1-hidden-layer softplus MLP.

Head (SPEC §4): ``h(y) = W₂ σ(W₁ y + b₁) + b₂`` with σ = softplus (``head.fc1``, ``head.fc2``).
For predicted class ``l`` and a competitor ``j`` let ``d = W₂[l] - W₂[j]`` and

    g(y) = h_l(y) - h_j(y) = dᵀ σ(W₁ y + b₁) + (b₂[l] - b₂[j]),
    ∇g(y) = W₁ᵀ (d ⊙ σ'(z)),   ∇²g(y) = W₁ᵀ diag(d ⊙ σ''(z)) W₁,   z = W₁ y + b₁,

with ``0 < σ'' <= 1/4``.  Hence ``∇²g ⪰ -m_lj I`` everywhere, where (SPEC §4)

    m_lj = ¼ λ_max(W₁ᵀ diag(d⁻) W₁),   d⁻ = max(-d, 0) = (W₂[j] - W₂[l])⁺.

The values ``m_lj`` used are guaranteed upper bounds (:mod:`lipcli.builtins.crc.bounds`,
verified by lipcli's one ``λ_max`` engine :mod:`lipcli.numerics.eigen`).  Two sound per-pair lower bounds on the distance from ``y`` to
``{g = 0}`` (``g(y) > 0``):

1. **Closed form** (SPEC §4, :mod:`lipcli.builtins.crc.closed_form`):
   ``r_fast = 2g / (√(‖∇g‖² + 2Kg) + ‖∇g‖)`` with ``K >= m_lj``.
2. **Dual / CRC** (paper Appendix E, :mod:`lipcli.builtins.crc.dual`):
   ``r_dual = √(2 (F_η(δ) - ‖∇F_η(δ)‖²/(2μ)))`` at a point with ``‖∇F_η(δ)‖ <= grad_tol``.

Per pair the certificate is ``max(r_fast, r_dual)``; per input the minimum over the competing
classes (all ``c - 1`` by default).  Dual solves are skipped for pairs whose ``r_fast``
already reaches the input's current minimum (they cannot lower it), processed in rounds of
increasing ``r_fast``, batched over inputs and pairs; exact gradient norms (one ``H × D``
product per pair) are only computed where a cheap guaranteed bound cannot exclude the pair
(:mod:`lipcli.builtins.crc.search`, :mod:`lipcli.builtins.crc.pruning`), and a dual solve
stops once its sound value exceeds the input's current minimum.  The radii are those of the
exhaustive search.  With ``curvature="lazy"`` (default)
only the global bounds exist at first; when the pair that decides an input's radius has a
non-exact bound and its certificate is not already exact (dual optimum interior), its
class-split bounds, and if still needed its exact bound, are computed, cached in memory and
in the returned cache dict, and the affected pairs are re-certified.

All certificate arithmetic is float64 and subtracts bounds on its own rounding errors
(CG search directions may be float32: :mod:`lipcli.builtins.crc.dual`).  Parameters and their
defaults: :class:`~lipcli.builtins.crc.settings.CRCSettings`.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from lipcli.builtins.crc.bounds import CurvatureBounds
from lipcli.builtins.crc.export import export_crc_certificate
from lipcli.builtins.crc.search import certify_chunk
from lipcli.builtins.crc.settings import CRCSettings
from lipcli.builtins.crc.weights import MLPWeights, mlp_weights
from lipcli.sdk.certificates import (
    HEURISTIC_NOTE,
    CertifyResult,
    cache_matches,
    make_cache,
)
from lipcli.sdk.specs import SOUND

_METHOD = "crc-lip"
_D = CRCSettings()  # the defaults, written once in CRCSettings


class CRCCertifier:
    """CRC-Lip certifier of an MLP head (see the module docstring for the mathematics).

    Args:
        curvature: ``"lazy"`` (global and class-split bounds in :meth:`prepare` -- ``2c``
            verified eigenvalue bounds -- then exact bounds for the pairs that limit a
            certificate, computed when needed and cached), ``"exact"`` (exact bounds for all
            ``c(c-1)`` ordered pairs in :meth:`prepare`), ``"global"`` (compute nothing beyond
            the global bound; bounds found in a given cache are still used).
        dual: also run the dual (CRC) solve; ``False`` gives the closed form only.
        grad_tol, dual_rtol, boundary, max_iter, cg_rtol, cg_max_iter, solver_dtype: the dual
            solve's tolerances (:mod:`lipcli.builtins.crc.dual`).
        Defaults and help of every argument: :class:`~lipcli.builtins.crc.settings.CRCSettings`.
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
        curvature: str = _D.curvature,
        dual: bool = _D.dual,
        grad_tol: float = _D.grad_tol,
        dual_rtol: float = _D.dual_rtol,
        boundary: float = _D.boundary,
        max_iter: int = _D.max_iter,
        cg_rtol: float = _D.cg_rtol,
        cg_max_iter: int = _D.cg_max_iter,
        solver_dtype: str = _D.solver_dtype,
        chunk_size: int = _D.chunk_size,
        trust_cache: bool = _D.trust_cache,
    ) -> None:
        self.settings = CRCSettings(
            curvature=curvature,
            dual=dual,
            grad_tol=grad_tol,
            dual_rtol=dual_rtol,
            boundary=boundary,
            max_iter=max_iter,
            cg_rtol=cg_rtol,
            cg_max_iter=cg_max_iter,
            solver_dtype=solver_dtype,
            chunk_size=chunk_size,
            trust_cache=trust_cache,
        )  # validates
        self.curvature = curvature
        self.dual = dual
        self.chunk_size = max(1, chunk_size)
        self.trust_cache = bool(trust_cache)
        self.cache: dict = {}
        self.weights: MLPWeights | None = None
        self.bounds: CurvatureBounds | None = None
        self.prepare_seconds = 0.0
        self._head_key: tuple | None = None
        self._notes: list[str] = []
        #: prune pairs by cheap bounds before exact gradient norms and dual solves (same
        #: radii); False runs the exhaustive search (a reference for tests)
        self._prune = True

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
        self.weights = mlp_weights(head, self.settings.torch_solver_dtype)
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
        return export_crc_certificate(
            head, lambda: CRCCertifier(curvature="global", dual=False, trust_cache=True)
        )

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
                 "dual_boundary": 0, "dual_improved": 0, "dual_stopped_early": 0, "hvps": 0,
                 "newton_iters": 0, "rounds": 0, "exact_gradient_norms": 0}
        results = []
        with torch.no_grad():
            feats = features.detach()
            for s in range(0, feats.shape[0], self.chunk_size):
                results.append(certify_chunk(self, feats[s : s + self.chunk_size], top_k, stats, self._prune))
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
                f"{st.dual_rtol:g}; CG directions in {st.solver_dtype}, "
                "certificates in float64"
            )
        else:
            notes.append("crc-lip: closed-form certificate only (dual disabled)")
        if not exact:
            notes.append(HEURISTIC_NOTE.format(k=top_k, c=c - 1))
        return CertifyResult(pred.cpu(), radius.cpu(), exact_classes=exact, notes=notes, stats=stats)
