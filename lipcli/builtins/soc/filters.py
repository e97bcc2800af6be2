"""SOC's filter algebra: the transpose filter, the normalised skew filter and its gradient,
the power-iteration products (SPEC §1.1, §1.2).

Maths (SPEC §1; Singla & Feizi 2021, and the paper §4):

* Transpose filter ``T(K)[o, i, a, b] = K[i, o, k−1−a, k−1−b]``; under zero "same" padding
  conv with ``T(K)`` is the adjoint of conv with ``K`` (SPEC §1.1).
* Skew filter ``A = ½(W − T(W))`` (so ``T(A) = −A`` exactly, also in floating point, since
  ``fl(a − b) = −fl(b − a)``), normalised ``S = A/σ`` with ``σ`` the smallest of four
  power-iteration estimates of the spectral norms of the reshapes of ``A`` (SPEC §1.2).
  The power vectors are persistent buffers of the layer (:mod:`lipcli.builtins.soc.power`);
  gradients flow through ``σ = uᵀ R(A) v`` with ``u, v`` held constant
  (:class:`_NormalisedSkew`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lipcli.builtins.soc import fused as _fused

__all__ = ["transpose_filter"]


# --------------------------------------------------------------------------------------
# Filter algebra
# --------------------------------------------------------------------------------------
def transpose_filter(kernel: Tensor) -> Tensor:
    """``T(K)[o, i, a, b] = K[i, o, k−1−a, k−1−b]`` (SPEC §1.1): swap the channel dims and
    flip both spatial dims.  Conv with ``T(K)`` is the adjoint of conv with ``K`` under zero
    padding ``k//2`` (odd ``k``)."""
    return kernel.transpose(0, 1).flip(2, 3)


#: smallest ``C·C`` for which large 1×1 filters on CPU read ``Xᵀ`` through a transposed copy
#: (torch's cache-blocked 2-d transpose copy; 3×3 filters gain nothing from it)
_TILE_MIN_ENTRIES = 1 << 18


def _exact_cpu_matmul() -> bool:
    """Whether float32 CPU matrix products are computed in full IEEE precision (not the
    reduced-precision modes ``torch.set_float32_matmul_precision`` or oneDNN's
    ``fp32_precision`` can select), so that a product with a signed permutation matrix is
    exact."""
    if torch.get_float32_matmul_precision() != "highest":
        return False
    onednn = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    return getattr(onednn, "fp32_precision", "none") in ("none", "ieee")


_REVERSALS: dict[tuple[int, torch.dtype], Tensor] = {}


def _negated_reversal(n: int, dtype: torch.dtype) -> Tensor:
    """``−J`` for the ``n×n`` exchange matrix ``J`` (``(x·(−J))_t = −x_{n−1−t}``), CPU."""
    key = (n, dtype)
    if key not in _REVERSALS:
        J = torch.zeros(n, n, dtype=dtype)
        J[torch.arange(n), torch.arange(n - 1, -1, -1)] = -1.0
        _REVERSALS[key] = J
    return _REVERSALS[key]


def _minus_transpose(X: Tensor, scale: float | Tensor | None = None) -> Tensor:
    """``X − T(X)`` (times ``scale`` if given), contiguous.

    On CPU the transpose is never materialised as a strided copy:

    * ``k×k`` filters, ``k > 1``: with ``X`` viewed as ``(C, C, k²)``,
      ``T(X)[o, i, t] = X[i, o, k²−1−t]`` (the flip of both tap axes reverses the flattened
      taps), so ``X − T(X) = X + Xᵀ·(−J)`` is one batched product
      ``baddbmm(X, X.transpose(0, 1), −J)`` over ``o``.  The product with ``−J`` has a single
      non-zero term ``−x`` per entry (the others are exact zeros), so without ``scale`` the
      result is bit-identical to ``X − T(X)`` (the test suite checks it) and
      ``T(D) = −D`` still holds exactly; used only when matrix products run in full
      precision (:func:`_exact_cpu_matmul`).  With ``scale`` (the gradient, where exact
      skewness does not matter) the scale is applied inside the same product.
    * large ``1×1`` filters: ``T(X) = Xᵀ`` is first copied into a contiguous matrix by
      torch's cache-blocked transpose copy, so that no elementwise pass walks the matrix with a
      stride of a whole row; the values are the same subtractions, bit for bit (with
      ``scale``, the copy is scaled by ``−scale`` and the second pass adds ``scale·X``).

    About 2× faster than ``flip`` + ``sub`` for the ``1024×1024×3×3`` filter of
    LipConvnet-10…40 on the 2-core test machine (20 ms instead of 43 ms)."""
    C, C2, kh, kw = X.shape
    # the blocked CPU forms write through ``out=`` views: not inside torch.compile
    on_cpu = X.device.type == "cpu" and X.is_contiguous() and C == C2 and not torch.compiler.is_compiling()
    if on_cpu and kh == 1 and kw == 1 and C * C >= _TILE_MIN_ENTRIES:
        X2 = X.view(C, C)
        Xt = torch.empty_like(X2)
        Xt.copy_(X2.t())  # the blocked transpose copy: both operands below are contiguous
        out = torch.empty_like(X)  # written through a view; returned as a base tensor
        if scale is None:
            torch.sub(X2, Xt, out=out.view(C, C))
            return out
        # scaled (the gradient): the transposed copy carries −s, the add +s·X
        s = float(scale) if isinstance(scale, Tensor) else scale
        torch.add(Xt.mul_(-s), X2, alpha=s, out=out.view(C, C))
        return out
    elif (
        on_cpu and kh * kw > 1 and X.dtype in (torch.float32, torch.float64)
        and _exact_cpu_matmul()
    ):
        n = kh * kw
        X3 = X.view(C, C, n)
        J = _negated_reversal(n, X.dtype).expand(C, n, n)
        out = torch.empty_like(X)
        if scale is None:
            torch.baddbmm(X3, X3.transpose(0, 1), J, out=out.view(C, C, n))
        else:
            s = float(scale)
            torch.baddbmm(X3, X3.transpose(0, 1), J, beta=s, alpha=s, out=out.view(C, C, n))
        return out
    else:
        out = torch.sub(X, transpose_filter(X))
    return out if scale is None else out.mul_(scale)


def _skew_difference(weight: Tensor) -> Tensor:
    """``D = W − T(W) = 2A`` (SPEC §1.1), contiguous; ``T(D) = −D`` holds exactly in
    floating point (``fl(a − b) = −fl(b − a)``)."""
    return _minus_transpose(weight)


def _rank_one_factors(r: int, u: Tensor, v: Tensor, C: int, k: int) -> tuple[Tensor, Tensor]:
    """Broadcastable factors with ``eu·ev = ∂(uᵀ R_r(D) v)/∂D`` in the ``(o, i, a, b)``
    layout of the filter (reshapes as in :func:`lipcli.numerics.conv.conv_reshape`)."""
    if r == 0:
        return u.view(C, 1, k, 1), v.view(1, C, 1, k)
    if r == 1:
        return u.view(C, 1, 1, k), v.view(1, C, k, 1)
    if r == 2:
        return u.view(C, 1, 1, 1), v.view(1, C, k, k)
    return u.view(C, 1, k, k), v.view(1, C, 1, 1)


class _NormalisedSkew(torch.autograd.Function):
    """``S = D/ρ`` with ``D = W − T(W)`` (given, computed without grad, overwritten by ``S``) and
    ``ρ = uᵀ R_r(D) v = 2σ`` for power vectors ``u, v`` held constant (SPEC §1.2).

    Backward with ``G = ∂ℓ/∂S``: ``∂ℓ/∂D = (G − ⟨G, S⟩·E)/ρ`` with the rank-one
    ``E = ∂ρ/∂D = eu·ev``, and since ``T`` is a self-adjoint involution,
    ``∂ℓ/∂W = H − T(H)`` with ``H = ∂ℓ/∂D``.  Exact — the same gradient autograd would give
    through ``A = ½(W − T(W))``, ``σ = uᵀR_r(A)v``, ``S = A/σ`` — with fewer passes over the
    filter.  ``E`` is given as a list of broadcastable factor pairs whose products are
    summed: one pair on CPU; on GPUs all four reshapes' pairs with the non-selected ones
    scaled by exactly 0 (so the reshape can be chosen on the device, without a host sync).
    """

    @staticmethod
    def forward(ctx: Any, weight: Tensor, D: Tensor, rho: Tensor,  # type: ignore[override]
                factors: list[tuple[Tensor, Tensor]]) -> Tensor:
        # D is a temporary of the caller: scaled in place (no second filter-sized buffer);
        # inside torch.compile out of place (the same values; the compiler plans the buffers)
        if torch.compiler.is_compiling():
            S = D * (1.0 / rho)
        else:
            S = D.mul_(1.0 / rho)
            ctx.mark_dirty(D)
        ctx.save_for_backward(S, rho)
        ctx.factors = factors
        return S

    @staticmethod
    def backward(ctx: Any, G: Tensor) -> tuple[Tensor | None, None, None, None]:  # type: ignore[override]
        S, rho = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        G = G.contiguous()
        if _fused.use_fused(G):  # CUDA, LIPCLI_FUSED_FILTER=1: one reduction + one pointwise kernel
            return _fused.skew_gradient(G, S, rho, ctx.factors), None, None, None
        c = torch.dot(G.reshape(-1), S.reshape(-1))
        (eu, ev), *rest = ctx.factors
        H = torch.addcmul(G, eu * (-c), ev)
        for eu, ev in rest:
            H.addcmul_(eu * (-c), ev)
        return _minus_transpose(H, 1.0 / rho), None, None, None


# --------------------------------------------------------------------------------------
# Power-iteration products (SPEC §1.2; see SOC._power_iterate)
# --------------------------------------------------------------------------------------
def _left_products(D: Tensor, X0: Tensor, X2: Tensor) -> tuple[Tensor, Tensor]:
    """``(R0(D)ᵀ X0, R2(D)ᵀ X2)`` (shapes ``(Ck, n0)`` and ``(Ck², n2)``) from one product
    with ``M2 = D.view(C, Ck²)``.  With ``R0(D)[(o,a),(i,b)] = D[o,i,a,b]``:
    ``(R0ᵀX)[(i,b),c] = Σ_a Z[(a,c),(i,a,b)]`` for ``Z = X̃ M2``, ``X̃[(a,c),o] = X[(o,a),c]``."""
    C, k = D.shape[0], D.shape[-1]
    M2 = D.view(C, C * k * k)
    n0 = X0.shape[1]
    if k == 1:
        Z = torch.cat([X0, X2], 1).T @ M2
        return Z[:n0].T, Z[n0:].T
    Xt = X0.view(C, k, n0).permute(1, 2, 0).reshape(k * n0, C)
    Z = torch.cat([Xt, X2.T], 0) @ M2
    Z0 = Z[: k * n0].view(k, n0, C, k, k)
    P0 = torch.diagonal(Z0, dim1=0, dim2=3).sum(-1)  # (c, i, b)
    return P0.reshape(n0, C * k).T, Z[k * n0:].T

def _right_products(D: Tensor, P0: Tensor, P2: Tensor) -> tuple[Tensor, Tensor]:
    """``(R0(D) P0, R2(D) P2)`` (shapes ``(Ck, n0)`` and ``(C, n2)``) from one product with
    ``M2``: ``(R0 P)[(o,a),c] = (M2 V)[o,(a,c)]`` with the block-sparse
    ``V[(i,a',b),(a,c)] = P[(i,b),c]·δ(a',a)`` (exact: the other terms are zeros)."""
    C, k = D.shape[0], D.shape[-1]
    M2 = D.view(C, C * k * k)
    n0 = P0.shape[1]
    if k == 1:
        Y = M2 @ torch.cat([P0, P2], 1)
        return Y[:, :n0], Y[:, n0:]
    eye = torch.eye(k, dtype=D.dtype, device=D.device)
    V0 = (P0.view(C, 1, k, 1, n0) * eye.view(1, k, 1, k, 1)).reshape(C * k * k, k * n0)
    Y = M2 @ torch.cat([V0, P2], 1)
    return Y[:, : k * n0].reshape(C * k, n0), Y[:, k * n0:]


def _power_steps(D: Tensor, X0: Tensor, X2: Tensor, steps: int) -> tuple[Tensor, ...]:
    """The loop of :meth:`SOC._power_iterate` (pure: no buffers touched): ``steps`` passes
    ``P̂ = unit(MᵀX)``, ``Q = M (P̂·s)``, ``X ← unit(Q)·s``; returns ``(P̂0, P̂2, X0, X2, r0, r2)``
    with the unsigned ``P̂`` and the norms ``r`` of the last products."""
    # (1, −1) built on the device (indexed assignment or torch.tensor would copy from
    # the host, a synchronisation on GPUs)
    signs = 1.0 - 2.0 * torch.arange(2, dtype=D.dtype, device=D.device)
    P0, P2 = X0, X2
    r0 = r2 = X0.new_zeros(2)

    def unit(M: Tensor) -> tuple[Tensor, Tensor]:
        norm = torch.linalg.vector_norm(M, dim=0)
        return M * (signs / norm.clamp_min(1e-30)), norm

    for _ in range(steps):
        P0, P2 = _left_products(D, X0, X2)
        P0, P2 = unit(P0)[0], unit(P2)[0]
        Q0, Q2 = _right_products(D, P0, P2)
        (X0, r0), (X2, r2) = unit(Q0), unit(Q2)
    return P0 * signs, P2 * signs, X0, X2, r0, r2  # P·s = P̂ (unsigned)


#: the power steps compiled into fused kernels (CUDA, ``LIPCLI_FUSED_FILTER=1``; training
#: forwards run one step per layer; the refreshes' many steps stay eager)
_power_steps_fused = _fused.compiled_or_eager("power_steps", _power_steps)
#: most power steps per call that use the compiled loop (it is unrolled when compiled)
FUSED_MAX_POWER_STEPS = 2
