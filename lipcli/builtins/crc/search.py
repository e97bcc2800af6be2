r"""The per-chunk search of the CRC-Lip certifier (:mod:`lipcli.builtins.crc.certifier`): which
``(input, class)`` pairs get an exact gradient norm, which get a dual solve (SPEC §4).

An input's radius is ``min_j v_j`` over the competing classes, ``v_j = max(r_fast_j,
r_dual_j)``.  Every quantity kept for a pair is a sound lower bound on its distance, and a pair
is only refined while its lower bound is below the input's current minimum of *solved* pairs:

1. ``r_lo_j <= r_fast_j``: the closed form with a cheap gradient-norm bound
   (:func:`~lipcli.builtins.crc.pruning.gradient_norm_upper`), for all pairs;
2. ``r_fast_j``: with the exact gradient norm (one ``H × D`` product per pair), computed only
   when ``r_lo_j`` could decide the next pick or the minimum;
3. ``v_j``: the dual, solved in rounds of increasing ``r_fast`` (1 pair per input, then 4)
   for pairs with ``r_fast_j`` below the current minimum; a solve stops early once its sound
   value exceeds that minimum (it cannot become the minimum any more).

The pairs picked for dual solves are exactly those of the exhaustive search (all exact norms
first), so the radii are the same; ``prune=False`` runs the exhaustive search (reference).
"""

from __future__ import annotations

import math

import torch

from lipcli.builtins.crc.closed_form import closed_form_radius, pair_margins, point_margins
from lipcli.builtins.crc.dual import solve_dual
from lipcli.builtins.crc.pruning import exact_gradient_norm, gradient_norm_upper
from lipcli.sdk.certificates import competing_classes

_INF = math.inf
_REFINE = 4  # exact gradient norms computed per input and step


def all_pair_gradients(w, s1: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """``‖∇g_lj(y)‖`` for every input and class ``(B, c)`` (float64, exhaustive)."""
    batch, c = s1.shape[0], w.num_classes
    out = torch.empty(batch, c, dtype=torch.float64, device=s1.device)
    step = max(1, (1 << 23) // (c * w.hidden))
    for s in range(0, batch, step):
        sl = slice(s, s + step)
        diff = (w.w2[pred[sl]].unsqueeze(1) - w.w2.unsqueeze(0)) * s1[sl].unsqueeze(1)  # (b, c, H)
        out[sl] = (diff @ w.w1).norm(dim=2)
    return out


def _smallest(values: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the ``k`` smallest finite entries of each row in ``rows``."""
    k = min(k, values.shape[1])
    order = values.argsort(dim=1)[:, :k]
    mask = torch.zeros_like(values, dtype=torch.bool)
    mask.scatter_(1, order, True)
    return mask & torch.isfinite(values) & rows.unsqueeze(1)


class ChunkSearch:
    """State of one chunk: per-pair bounds ``(B, c)`` and the refinement steps."""

    def __init__(self, certifier, feats: torch.Tensor, top_k: int | None, stats: dict, prune: bool):
        self.w, self.bounds, self.stats, self.prune = certifier.weights, certifier.bounds, stats, prune
        self.settings = certifier.settings
        w, sq = self.w, self.bounds.w1_sq_bound
        y = feats.to(device=w.device, dtype=torch.float64)
        if prune:
            self.t = point_margins(w, y)
            self.gn = gradient_norm_upper(w, sq, self.t)
            self.known = torch.zeros_like(self.t.g, dtype=torch.bool)
        else:
            self.t = pair_margins(w, y, sq, lambda s1, pred: all_pair_gradients(w, s1, pred))
            self.gn = self.t.gn_hi
            self.known = torch.ones_like(self.t.g, dtype=torch.bool)
        self.cand, self.exact_classes = competing_classes(self.t.logits, self.t.pred, top_k)
        self.g_lo = self.t.g_lo
        self.m, self.m_exact = self.bounds.lower_curvature(self.t.pred)
        self.rf = closed_form_radius(self.g_lo, self.gn, self.m).masked_fill(~self.cand, _INF)
        self.cert = self.rf.clone()  # max(r_fast (or r_lo), r_dual) per pair: always sound
        self.solved = torch.zeros_like(self.cand)
        self.tight = torch.zeros_like(self.cand)
        # pairs whose closed form is final without an exact norm: g <= 0 gives 0 whatever the norm
        self.settled = self.known | (self.g_lo <= 0) | ~self.cand
        stats["inputs"] += y.shape[0]
        stats["pairs"] += int(self.cand.sum())

    def make_exact(self, mask: torch.Tensor) -> None:
        """Exact gradient norms (hence exact ``r_fast``) for the pairs in ``mask``."""
        bi, ji = (mask & ~self.known).nonzero(as_tuple=True)
        if bi.numel() == 0:
            return
        gn = exact_gradient_norm(self.w, self.bounds.w1_sq_bound, self.t, bi, ji)
        self.gn[bi, ji] = gn
        self.known[bi, ji] = True
        self.settled[bi, ji] = True
        rf = closed_form_radius(self.g_lo[bi, ji], gn, self.m[bi, ji])
        self.rf[bi, ji] = rf
        self.cert[bi, ji] = torch.maximum(self.cert[bi, ji], rf)
        self.stats["exact_gradient_norms"] += int(bi.numel())

    def settle(self) -> None:
        """Make each input's minimum attained at a pair whose value is final."""
        rows = torch.arange(self.cert.shape[0], device=self.cert.device)
        while True:
            j = self.cert.argmin(dim=1)
            open_rows = ~self.settled[rows, j] & torch.isfinite(self.cert[rows, j])
            if not bool(open_rows.any()):
                return
            self.make_exact(_smallest(self.cert.masked_fill(self.settled, _INF), open_rows, _REFINE))

    def dual_rounds(self) -> None:
        """Dual solves in rounds of increasing ``r_fast`` (1 pair per input, then 4) for the
        pairs whose ``r_fast`` is below the input's current minimum of solved pairs."""
        quota_first = torch.ones(self.cand.shape[0], dtype=torch.bool, device=self.cand.device)
        slots = torch.arange(4, device=self.cand.device)
        while True:
            solved_min = self.cert.masked_fill(~self.solved, _INF).amin(dim=1, keepdim=True)
            need = self.cand & ~self.solved & (self.g_lo > 0) & torch.isfinite(self.rf) & (self.rf < solved_min)
            if not bool(need.any()):
                return
            quota = torch.where(quota_first, 1, 4)
            order = self.rf.masked_fill(~need, _INF).argsort(dim=1)[:, :4]
            pick = torch.zeros_like(need)
            pick.scatter_(1, order[:, : slots.numel()], (slots < quota.unsqueeze(1))[:, : order.shape[1]])
            pick &= need
            # a pick with only a lower bound r_lo: refine the smallest unknown needed pairs first
            # (the picks are then the exhaustive search's: the quota smallest exact r_fast)
            unsure = (pick & ~self.known).any(dim=1)
            if bool(unsure.any()):
                self.make_exact(_smallest(self.rf.masked_fill(~need | self.known, _INF), unsure, _REFINE))
            ready = pick & ~unsure.unsqueeze(1)
            if bool(ready.any()):
                stop = solved_min if self.prune else torch.full_like(solved_min, _INF)
                self.solve(ready, stop.expand_as(ready))
                self.solved |= ready
                quota_first &= ~ready.any(dim=1)
                self.stats["rounds"] += 1

    def solve(self, pick: torch.Tensor, stop: torch.Tensor) -> None:
        """Dual solves for the pairs in ``pick``; a solve may stop once above ``stop``."""
        w, t, stats = self.w, self.t, self.stats
        bi, ji = pick.nonzero(as_tuple=True)
        li = t.pred[bi]
        a = w.w2[li] - w.w2[ji]
        grad0 = (a * t.s1[bi]) @ w.w1
        res = solve_dual(
            w, t.z0[bi], t.z0_err[bi], a, w.b2[li] - w.b2[ji], t.g[bi, ji], grad0, self.m[bi, ji],
            self.settings, stop=stop[bi, ji],
        )
        rf = self.rf[bi, ji]
        # every value ever certified for the pair is sound: keep the best
        self.cert[bi, ji] = torch.maximum(self.cert[bi, ji], torch.maximum(rf, res.radius))
        self.tight[bi, ji] = res.tight & (res.radius >= rf)
        stats["dual_solves"] += int(bi.numel())
        stats["dual_tight"] += int(res.tight.sum())
        stats["dual_boundary"] += int(res.at_boundary.sum())
        stats["dual_improved"] += int((res.radius > rf).sum())
        stats["dual_stopped_early"] += int(res.stopped.sum())
        stats["hvps"] += res.hvps
        stats["newton_iters"] += int(res.iterations.sum())

    def tighten(self) -> bool:
        """Lazy curvature: tighten the bound of each input's deciding pair where it is loose
        and the pair's certificate is not already exact; ``False`` when nothing to do."""
        rows = torch.arange(self.cert.shape[0], device=self.cert.device)
        radius, jstar = self.cert.masked_fill(~self.cand, _INF).min(dim=1)
        improvable = (
            ~self.m_exact[rows, jstar] & ~self.tight[rows, jstar] & (self.g_lo[rows, jstar] > 0)
            & torch.isfinite(radius)
        )
        if not bool(improvable.any()):
            return False
        pred = self.t.pred
        wanted = {(int(j), int(l)) for j, l in zip(jstar[improvable].tolist(), pred[improvable].tolist())}
        for a_cls, b_cls in sorted(wanted):
            self.bounds.tighten(a_cls, b_cls)  # class-split bounds first, then the exact one
        m_new, self.m_exact = self.bounds.lower_curvature(pred)
        changed = m_new < self.m
        self.m = m_new
        fresh = closed_form_radius(self.g_lo, self.gn, self.m).masked_fill(~self.cand, _INF)
        self.rf = torch.where(changed, fresh, self.rf)
        self.cert = torch.where(changed, torch.maximum(self.cert, self.rf), self.cert)
        # a smaller m can only raise the dual too: re-solve where the pair was solved
        self.solved &= ~changed
        self.tight &= ~changed
        return True


def certify_chunk(
    certifier, feats: torch.Tensor, top_k: int | None, stats: dict, prune: bool = True
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(pred, feature-space radius, exact_classes)`` of one chunk (module docstring)."""
    ch = ChunkSearch(certifier, feats, top_k, stats, prune)
    c = certifier.weights.num_classes
    for _tighten in range(c * c + 2 * c + 1):  # each pass computes >= 1 new bound
        if certifier.dual:
            ch.dual_rounds()
        ch.settle()
        if certifier.curvature != "lazy" or not ch.tighten():
            break
    ch.settle()
    rows = torch.arange(ch.cert.shape[0], device=ch.cert.device)
    radius, jstar = ch.cert.masked_fill(~ch.cand, _INF).min(dim=1)
    # the deciding pair's dual optimum is interior: the radius IS the distance to the
    # decision boundary (up to the search tolerance), not just a lower bound
    stats["exact_radius_inputs"] += int((ch.tight[rows, jstar] & torch.isfinite(radius)).sum())
    radius = torch.where(torch.isnan(radius), torch.zeros_like(radius), radius).clamp_min(0)
    return ch.t.pred.cpu(), radius.cpu(), ch.exact_classes
