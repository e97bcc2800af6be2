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
increasing ``r_fast``, batched over inputs and pairs.  With ``curvature="lazy"`` (default)
only the global bounds exist at first; when the pair that decides an input's radius has a
non-exact bound and its certificate is not already exact (dual optimum interior), its
class-split bounds, and if still needed its exact bound, are computed, cached in memory and
in the returned cache dict, and the affected pairs are re-certified.

All certificate arithmetic is float64 and subtracts bounds on its own rounding errors
(CG search directions may be float32: :mod:`lipcli.builtins.crc.dual`).  Parameters and their
defaults: :class:`~lipcli.builtins.crc.settings.CRCSettings`.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from lipcli.builtins.crc.bounds import CurvatureBounds
from lipcli.builtins.crc.closed_form import closed_form_radius, pair_margins
from lipcli.builtins.crc.dual import solve_dual
from lipcli.builtins.crc.export import export_crc_certificate
from lipcli.builtins.crc.settings import CRCSettings
from lipcli.builtins.crc.weights import MLPWeights, mlp_weights
from lipcli.sdk.certificates import (
    HEURISTIC_NOTE,
    CertifyResult,
    cache_matches,
    competing_classes,
    make_cache,
)
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import SOUND, CertificateSpec

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
                f"{st.dual_rtol:g}; CG directions in {st.solver_dtype}, "
                "certificates in float64"
            )
        else:
            notes.append("crc-lip: closed-form certificate only (dual disabled)")
        if not exact:
            notes.append(HEURISTIC_NOTE.format(k=top_k, c=c - 1))
        return CertifyResult(pred.cpu(), radius.cpu(), exact_classes=exact, notes=notes, stats=stats)

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
            params=CRCSettings.params(),
        )
    ]
