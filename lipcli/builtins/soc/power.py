"""SOC's power-iteration vectors: the buffers, the power steps and the Rayleigh quotients
(SPEC §1.2).

:class:`PowerVectors` is the part of :class:`lipcli.builtins.soc.layer.SOC` that owns the
persistent buffers ``power_u{r}``, ``power_v{r}`` (r = 0..3): the power-iteration vectors of
the four reshapes ``R_r`` of the skew filter (part of the state dict).  The products
themselves live in :mod:`lipcli.builtins.soc.filters`; the layer turns the quotients into
``σ`` and ``S = A/σ``.

For the exactly skew ``D`` (``T(D) = −D``) the four reshapes are tied (F flips the tap
index): ``R1(D) = −F R0(D)ᵀ F`` and ``R3(D) = −F2 R2(D)ᵀ``, so all products needed by the
four power iterations come from two matrices, ``M0 = R0(D)`` and ``M2 = R2(D)`` (a view of
``D``), two vectors each per pass.  ``M0`` is never materialised: its products are computed
from ``M2`` (see ``filters._left_products``/``_right_products``), so each half-step reads ``D`` once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lipcli.builtins.soc import fused as _fused
from lipcli.builtins.soc.filters import (
    FUSED_MAX_POWER_STEPS,
    _power_steps,
    _power_steps_fused,
    _right_products,
)
from lipcli.numerics.conv import CONV_RESHAPES, conv_reshape_shape

__all__ = ["PowerVectors"]


class PowerVectors(nn.Module):
    """Base of :class:`~lipcli.builtins.soc.layer.SOC` (which sets ``kernel_size``): the
    power-iteration buffers of the four reshapes and their steps."""

    kernel_size: int

    def _register_power_vectors(self, C: int, k: int) -> None:
        """Random unit start vectors ``power_u{r}``, ``power_v{r}`` for the reshapes of a
        ``C×C×k×k`` filter, registered as persistent buffers."""
        for r in range(CONV_RESHAPES):
            rows, cols = conv_reshape_shape((C, C, k, k), r)
            u = torch.randn(rows)
            v = torch.randn(cols)
            self.register_buffer(f"power_u{r}", u / torch.linalg.vector_norm(u))
            self.register_buffer(f"power_v{r}", v / torch.linalg.vector_norm(v))

    def _power_vectors(self, r: int) -> tuple[Tensor, Tensor]:
        return getattr(self, f"power_u{r}"), getattr(self, f"power_v{r}")

    def _flip1(self, x: Tensor) -> Tensor:  # F on a (channel, tap) index
        k = self.kernel_size
        return x if k == 1 else x.view(-1, k).flip(1).reshape(-1)

    def _flip2(self, x: Tensor) -> Tensor:  # F2 on a (channel, tap, tap) index
        k = self.kernel_size
        return x if k == 1 else x.view(-1, k, k).flip(1, 2).reshape(-1)

    @torch.no_grad()
    def _power_iterate(self, D: Tensor, steps: int) -> list[tuple[Tensor, Tensor, Tensor]]:
        """``steps ≥ 1`` power steps on the four reshapes of ``D`` (buffers updated in
        place).  Returns per reshape ``(ρ_r, u_r, v_r)`` with the new vectors and
        ``ρ_r = u_rᵀ R_r(D) v_r`` (= the norm of the last product; R0, R2 update v then u,
        R1, R3 update u then v).

        In the coordinates ``X = [u0, F v1]`` (for M0) and ``X = [u2, v3]`` (for M2) one
        step of both iterations of a pair is ``P̂ = unit(MᵀX)``, ``Q = M (P̂·s)``,
        ``X ← unit(Q)·s`` with the column signs ``s = (1, −1)``; afterwards
        ``v0 = P̂₀, u1 = −F P̂₁, u0 = X₀, v1 = F X₁`` and
        ``v2 = P̂₀, u3 = −F2 P̂₁, u2 = X₀, v3 = X₁``.
        """
        f1, f2 = self._flip1, self._flip2
        X0 = torch.stack([self.power_u0, f1(self.power_v1)], 1)
        X2 = torch.stack([self.power_u2, self.power_v3], 1)
        fused = _fused.use_fused(D) and steps <= FUSED_MAX_POWER_STEPS
        P0, P2, X0, X2, r0, r2 = (_power_steps_fused if fused else _power_steps)(D, X0, X2, steps)
        new = (
            (X0[:, 0], P0[:, 0]),
            (-f1(P0[:, 1]), f1(X0[:, 1])),
            (X2[:, 0], P2[:, 0]),
            (-f2(P2[:, 1]), X2[:, 1]),
        )
        rhos = (r0[0], r0[1], r2[0], r2[1])
        out = []
        for r, (u, v) in enumerate(new):
            bu, bv = self._power_vectors(r)
            bu.copy_(u)
            bv.copy_(v)
            out.append((rhos[r], u.contiguous(), v.contiguous()))
        return out

    @torch.no_grad()
    def _rayleigh_quotients(self, D: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
        """``(u_rᵀ R_r(D) v_r, u_r, v_r)`` for the current buffers (no power step)."""
        (u0, v0), (u1, v1), (u2, v2), (u3, v3) = (
            tuple(t.clone() for t in self._power_vectors(r)) for r in range(CONV_RESHAPES)
        )
        f1, f2 = self._flip1, self._flip2
        q, q2 = _right_products(
            D, torch.stack([v0, f1(u1)], 1), torch.stack([v2, f2(u3)], 1)
        )
        rho = [
            torch.dot(u0, q[:, 0]),
            -torch.dot(f1(v1), q[:, 1]),
            torch.dot(u2, q2[:, 0]),
            -torch.dot(v3, q2[:, 1]),
        ]
        vecs = ((u0, v0), (u1, v1), (u2, v2), (u3, v3))
        return [(rho[r], vecs[r][0], vecs[r][1]) for r in range(CONV_RESHAPES)]
