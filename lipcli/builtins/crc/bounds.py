r"""Guaranteed curvature bounds of the CRC-Lip head (SPEC §4).

For ``g = h_l - h_j`` with ``d = W₂[l] - W₂[j]``: ``∇²g(y) = W₁ᵀ diag(d ⊙ σ''(z)) W₁`` with
``0 < σ'' <= 1/4``, hence ``∇²g ⪰ -m_lj I`` everywhere, where

    m_lj = ¼ λ_max(W₁ᵀ diag(d⁻) W₁),   d⁻ = max(-d, 0) = (W₂[j] - W₂[l])⁺.

We write ``Λ(a, b) = ¼ λ_max(W₁ᵀ diag((W₂[a] - W₂[b])⁺) W₁)`` so ``m_lj = Λ(j, l)`` and
``M_lj = Λ(l, j)`` (only ``m`` is needed: ``η >= 0`` throughout).  All curvature values are
**guaranteed upper bounds** (:class:`CurvatureBounds`), at three levels:

* global (every pair, free): ``Λ(a, b) <= ¼ max_k (W₂[a] - W₂[b])⁺_k · ‖W₁‖₂²``;
* class split (one bound per class and sign, shared by all pairs of that class):
  ``Λ(a, b) <= ¼λ_max(W₁ᵀdiag(W₂[a]⁺)W₁) + ¼λ_max(W₁ᵀdiag(W₂[b]⁻)W₁)``;
* exact (per ordered pair): ``¼λ_max`` of the pair's own matrix.

Each eigenvalue bound comes from lipcli's one verified ``λ_max`` engine:
:func:`lipcli.numerics.spectral.weighted_gram_lambda_max_upper_bound` forms the float64 Gram
``A = W₁ᵀ diag(w) W₁`` (rows with ``w = 0`` skipped) with a bound on its rounding error,
estimates ``θ ≈ λ_max(A)`` (float64 ``eigvalsh`` up to order 256, float32 block Krylov
Rayleigh–Ritz above) and *certifies* ``λ̄I - A ≻ 0`` for ``λ̄ ≈ θ(1 + 2e-6)`` by a float64
Cholesky factorisation shifted by Rump's rounding margin (:mod:`lipcli.numerics.eigen`, whose
docstring holds the rounding analysis).  ~0.3 s for 4096×2048 on 2 idle CPU cores; the
verified value exceeds ``λ_max`` by a relative ~1e-5 at most.  The few float64 operations
done here on top (a difference, a maximum, a sum of two bounds, a product by ``¼``, which is
exact) are each covered by an explicit ``1 + 2u`` or ``1 + 4u`` factor next to them.
"""

from __future__ import annotations

import time

import torch

from lipcli.builtins.crc.weights import MLPWeights
from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U64  # float64
from lipcli.numerics.spectral import weighted_gram_lambda_max_upper_bound

#: relative tightness asked of every verified curvature eigenvalue bound
CURVATURE_RTOL = 2e-6


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
        ones = torch.ones(w1.shape[0], dtype=torch.float64, device=w1.device)
        return weighted_gram_lambda_max_upper_bound(w1, ones, rtol=CURVATURE_RTOL)

    def _quarter_lambda(self, weights: torch.Tensor) -> float:
        """Verified ``¼ λ_max(W₁ᵀ diag(weights) W₁)`` for ``weights >= 0`` (timed)."""
        start = time.perf_counter()
        # ¼· is exact (a power of two); 0 when no weight is positive
        value = 0.25 * weighted_gram_lambda_max_upper_bound(self.weights.w1, weights, rtol=CURVATURE_RTOL)
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
