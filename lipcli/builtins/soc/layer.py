"""Skew orthogonal convolution (SOC) with exact and fast filter gradients (SPEC §1, §5).

Maths (SPEC §1; Singla & Feizi 2021, and the paper §4, eqs. (1)–(4)):

* Transpose filter ``T(K)[o, i, a, b] = K[i, o, k−1−a, k−1−b]``; under zero "same" padding
  conv with ``T(K)`` is the adjoint of conv with ``K`` (SPEC §1.1).
* Skew filter ``A = ½(W − T(W))`` (so ``T(A) = −A`` exactly, also in floating point, since
  ``fl(a − b) = −fl(b − a)``), normalised ``S = A/σ`` with ``σ`` the smallest of four
  power-iteration estimates of the spectral norms of the reshapes of ``A`` (SPEC §1.2).
  The power vectors are persistent buffers; gradients flow through ``σ = uᵀ R(A) v`` with
  ``u, v`` held constant.
* Output ``z = Σ_{j<T} S^j x / j!`` by Horner, ``u ← x; for i = T−1…1: u ← x + S(u)/i``
  (paper eq. (2), SPEC §1.4); ``T`` = ``train_terms`` in training, ``eval_terms`` otherwise.
* Stride 2: ``pixel_unshuffle`` first; zero channel padding up to ``C``; keep the first
  ``c_out`` channels; add the bias (SPEC §1.3).
* Fast gradient (paper §4, eq. (4), SPEC §1.6): a custom autograd function over ``(x, S)``
  keeps only ``u¹ = Σ_{j≤T−2} S^j x/(j+1)!`` and ``S``.  Backward, with ``g = ∂ℓ/∂z``:
  ``v¹ = Σ_{j≤T−2} (Sᵀ)^j g/(j+1)!`` by the same Horner loop with ``Sᵀ = −S``; exact input
  gradient ``g − S(v¹)``; filter gradient = ONE convolution weight gradient of
  (input ``u¹``, grad-output ``v¹``), i.e. ``Σ_{a,b≤T−2} (Sᵀ)^a g (S^b x)ᵀ/((a+1)!(b+1)!)``
  instead of the exact ``Σ_{a+b≤T−2} (Sᵀ)^a g (S^b x)ᵀ/(a+b+1)!``.  The forward computes
  the same values as the exact mode, bit for bit (checked by the tests).

Implementation (speed, same values): on CPU in float32 a Horner step runs as ONE oneDNN
convolution with the add fused in, ``x + conv(u, S/i)``, when the activations outnumber the
filter entries (the scaled filters ``S/i`` are cheap there); otherwise, and on GPUs,
``x + conv(u, S)·(1/i)``.  A 1×1 filter on 1×1 images is a matrix product (``addmm``).  The
exact mode evaluates the same expressions with ``conv2d`` and a separate add under autograd,
which gives the same floating-point values.  The fast backward reuses the forward
convolution (``Sᵀ = −S``), alternating the fused ``add``/``sub`` so nothing is negated.  On
GPUs the reshape giving σ is selected on the device, so a training step never waits for
the GPU.  The series runs in channels-last memory format on GPUs (no NCHW↔NHWC
conversions around cuDNN's convolutions) and on CPU for images of at least 64 pixels.
* Lipschitz constant (SPEC §5): with ``b ≥ ‖S‖₂`` (guaranteed, :mod:`lipcli.numerics.spectral`)
  and ``exp(S)`` orthogonal, ``‖P_T(S)‖ ≤ 1 + b^T/T! · 1/(1 − b/(T+1))`` (``b < T+1``) and
  always ``‖P_T(S)‖ ≤ Σ_{j<T} b^j/j!``.  Floating-point rounding inside the convolutions of a
  forward pass is not part of this bound (as everywhere in the literature).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.hookspecs import hookimpl
from lipcli.builtins.soc import fused as _fused
from lipcli.sdk.loading import tensors_will_be_loaded
from lipcli.sdk.specs import CONVOLUTION_PROFILE_LABEL, ORTHOGONAL, ConvSpec, Param
from lipcli.numerics.spectral import CONV_RESHAPES, conv_reshape_shape, conv_spectral_norm_upper_bound

__all__ = [
    "SOC",
    "soc_series",
    "soc_series_fast",
    "transpose_filter",
    "truncated_exp_norm_bound",
    "lip_convolutions",
]



# --------------------------------------------------------------------------------------
# Filter algebra
# --------------------------------------------------------------------------------------
def transpose_filter(kernel: Tensor) -> Tensor:
    """``T(K)[o, i, a, b] = K[i, o, k−1−a, k−1−b]`` (SPEC §1.1): swap the channel dims and
    flip both spatial dims.  Conv with ``T(K)`` is the adjoint of conv with ``K`` under zero
    padding ``k//2`` (odd ``k``)."""
    return kernel.transpose(0, 1).flip(2, 3)


#: tile size of the cache-blocked ``X − T(X)`` for large 1×1 filters on CPU
_TILE = 32
#: smallest ``C·C`` for which the blocked form is used (a 2048×2048 1×1 filter: about 4 ms
#: instead of 20–30 ms on the 2-core test machine; 3×3 filters gain nothing from it)
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
    * large ``1×1`` filters: ``T(X) = Xᵀ`` is read through a tile-transposed copy (``32×32``
      tiles made contiguous first), so that neither read walks the matrix with a stride of a
      whole row; the values are the same subtractions, bit for bit (with ``scale``, the
      tile copy is scaled by ``−scale`` and the second pass adds ``scale·X``).

    About 2× faster than ``flip`` + ``sub`` for the ``1024×1024×3×3`` filter of
    LipConvnet-10…40 on the 2-core test machine (20 ms instead of 43 ms)."""
    C, C2, kh, kw = X.shape
    on_cpu = X.device.type == "cpu" and X.is_contiguous() and C == C2
    if (
        on_cpu and kh == 1 and kw == 1 and C % _TILE == 0 and C * C >= _TILE_MIN_ENTRIES
    ):
        nb = C // _TILE
        Xb = X.view(nb, _TILE, nb, _TILE)
        out = torch.empty_like(X)  # written through a view; returned as a base tensor
        if scale is None:
            tiles = Xb.permute(0, 2, 3, 1).contiguous()  # (I, O, o, i)
            torch.sub(Xb, tiles.permute(1, 2, 0, 3), out=out.view(nb, _TILE, nb, _TILE))
            return out
        # scaled (the gradient): the tile copy carries −s, the add +s·X
        s = float(scale) if isinstance(scale, Tensor) else scale
        tiles = torch.empty(nb, nb, _TILE, _TILE, dtype=X.dtype)
        torch.mul(Xb.permute(0, 2, 3, 1), -s, out=tiles)
        torch.add(tiles.permute(1, 2, 0, 3), Xb, alpha=s, out=out.view(nb, _TILE, nb, _TILE))
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
    layout of the filter (reshapes as in :func:`lipcli.numerics.spectral.conv_reshape`)."""
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
        # D is a temporary of the caller: scaled in place (no second filter-sized buffer)
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


#: CPU inputs with at least this many pixels per channel run the series in channels-last
#: memory format (the oneDNN forward convolution is markedly faster there for few channels
#: and large images); ``None`` disables it.  Only a layout choice: values are unchanged
#: up to floating-point rounding, and both gradient modes use the same choice.
CHANNELS_LAST_MIN_PIXELS: int | None = 64

#: CUDA inputs run the series in channels-last memory format when ``True`` (cuDNN's float32/
#: TF32 convolutions otherwise convert every input and output between NCHW and NHWC).  A
#: layout choice only, as above.  Measured on an H200 (a one-off A/B, in the git history of
#: docs/benchmarks.md): convolution kernel time of a LipConvnet-20 step at batch 512 down
#: from 31.2 to 20.2 ms; training steps 13–17 % faster with ``soc-fast`` and 17–23 % with
#: ``soc`` at batch 512, 2–8 % at batch 128 (on a second H200 whose slower host set the pace:
#: ``soc-fast`` unchanged, ``soc`` 17 % faster at batch 512).  The environment variable
#: ``LIPCLI_CUDA_CHANNELS_LAST=0`` turns it off (read when lipcli is imported).
CUDA_CHANNELS_LAST: bool = os.environ.get("LIPCLI_CUDA_CHANNELS_LAST", "1").strip() not in ("0", "false", "no")


def _working_format(x: Tensor) -> torch.memory_format:
    """Memory format in which the series of an input like ``x`` is evaluated."""
    if x.device.type == "cuda":
        return torch.channels_last if CUDA_CHANNELS_LAST else torch.contiguous_format
    if (
        CHANNELS_LAST_MIN_PIXELS is not None
        and x.device.type == "cpu"
        and x.shape[-1] * x.shape[-2] >= CHANNELS_LAST_MIN_PIXELS
    ):
        return torch.channels_last
    return torch.contiguous_format


def _is_matmul_case(u: Tensor, S: Tensor) -> bool:
    """A ``1×1`` filter on ``1×1`` images: the convolution is a plain matrix product
    (``addmm`` is several times faster than the convolution backend there)."""
    return S.shape[-1] == 1 and S.shape[-2] == 1 and u.shape[-1] == 1 and u.shape[-2] == 1


def _mat(S: Tensor) -> Tensor:
    return S.view(S.shape[0], S.shape[1])


def _apply_filter(u: Tensor, S: Tensor, padding: int) -> Tensor:
    """``conv2d(u, S, padding)`` (a matrix product for a 1×1 filter on 1×1 images)."""
    with _conv_region():
        if _is_matmul_case(u, S):
            n = u.shape[0]
            return F.linear(u.reshape(n, -1), _mat(S)).view(n, -1, 1, 1)
        return F.conv2d(u, S, padding=padding)


# --------------------------------------------------------------------------------------
# Fused "convolution + add" (the Horner step) and profiler labels
# --------------------------------------------------------------------------------------
#: label put around every convolution the series computes (conv2d, the fused
#: convolution-plus-add, and 1×1 convolutions computed as matrix products) while a profiler
#: is running, so that ``lip bench profile`` counts them as convolutions
CONV_LABEL = CONVOLUTION_PROFILE_LABEL


def _conv_region() -> Any:
    if torch._C._autograd._profiler_enabled():
        return torch.autograd.profiler.record_function(CONV_LABEL)
    return contextlib.nullcontext()


def _has_fused_conv_add() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(
            torch.ops.mkldnn._convolution_pointwise, "binary"
        )
    except (AttributeError, RuntimeError):  # pragma: no cover - builds without oneDNN
        return False


#: use oneDNN's convolution with a fused elementwise post-op for the Horner steps on CPU
#: (float32): ``other ± conv(u, K)`` in one pass instead of a convolution and a separate add
#: over the activations.  Same values as ``conv2d`` then ``add`` (checked bit for bit by the
#: test suite).  Set to ``False`` to disable.
FUSED_CONV_ADD: bool = _has_fused_conv_add()


def _onednn_float32(x: Tensor) -> bool:
    """Whether the fused oneDNN convolution-plus-add exists for tensors like ``x``."""
    return FUSED_CONV_ADD and x.device.type == "cpu" and x.dtype == torch.float32


def _fusable(u: Tensor, S: Tensor) -> bool:
    """The fused form is used when no autograd graph is recorded through it."""
    return (
        _onednn_float32(u)
        and S.dtype == torch.float32
        and not (torch.is_grad_enabled() and (u.requires_grad or S.requires_grad))
    )


def _conv_plus(u: Tensor, K: Tensor, other: Tensor, padding: int, sign: int = 1) -> Tensor:
    """``other + conv(u, K)`` (``sign = 1``) or ``conv(u, K) − other`` (``sign = −1``), fused
    into the convolution where oneDNN allows it (no autograd through the fused form)."""
    if _fusable(u, K):
        with _conv_region():
            return torch.ops.mkldnn._convolution_pointwise.binary(
                u, other, K, None, [padding, padding], [1, 1], [1, 1], 1,
                "add" if sign > 0 else "sub", None, None, [], None,
            )
    y = _apply_filter(u, K, padding)
    return other + y if sign > 0 else y - other


def _scales_filter(x: Tensor, S: Tensor) -> bool:
    """Where the Horner factor ``1/i`` is applied (SPEC §1.4: ``u ← x + S(u)/i``).

    ``True``: on the filter, ``x + conv(u, S/i)`` — the add then fuses into the
    convolution (oneDNN, CPU float32); chosen when the activations outnumber the filter
    entries (early layers).  ``False``: on the convolution output, ``x + conv(u, S)·(1/i)``
    — cheaper when the filter is the larger tensor (deep layers with few pixels), and
    always on GPUs (no fusion there; fewer kernel launches).  A function of the shapes,
    device and dtype only, so both gradient modes (and every evaluation) take the same path
    and compute the same floating-point values."""
    return _onednn_float32(x) and x.numel() >= S.numel()


# --------------------------------------------------------------------------------------
# Horner evaluation of the truncated exponential (SPEC §1.4) and the fast gradient (§1.6)
# --------------------------------------------------------------------------------------
def _series_forward(x: Tensor, S: Tensor, terms: int, keep_u1: bool = False) -> tuple[Tensor, Tensor | None]:
    """``z = Σ_{j<terms} S^j x/j!`` by Horner, ``u ← x + S(u)/i`` for ``i = terms−1 … 1``;
    also returns ``u¹`` (the state before the last step) when ``keep_u1``.  One code path
    for both gradient modes (differentiable by autograd; fused convolution-plus-add when
    no gradient is recorded), so their values are identical."""
    padding = S.shape[-1] // 2
    u = x
    u1: Tensor | None = None
    if _is_matmul_case(x, S) and not torch.is_autocast_enabled(x.device.type):
        # (under autocast the generic path below keeps the state in full precision)
        n = x.shape[0]
        x2, M = x.reshape(n, -1), _mat(S)
        u2 = x2
        with _conv_region():
            for i in range(terms - 1, 1, -1):
                u2 = torch.addmm(x2, u2, M.T, alpha=1.0 / i)
            if keep_u1:
                u1 = u2.view(x.shape)
            if torch.is_grad_enabled() and (x.requires_grad or S.requires_grad):
                z = torch.addmm(x2, u2, M.T).view(x.shape)
            else:  # written into a 4-d tensor, so that z is not a view (SOC adds its bias in place)
                z = torch.empty_like(x, memory_format=torch.contiguous_format)
                torch.addmm(x2, u2, M.T, out=z.view(n, -1))
        return z, u1
    if _scales_filter(x, S):
        for i in range(terms - 1, 0, -1):
            if i == 1 and keep_u1:
                u1 = u
            u = _conv_plus(u, S if i == 1 else S * (1.0 / i), x, padding)
        return u, u1
    for i in range(terms - 1, 0, -1):
        if i == 1 and keep_u1:
            u1 = u
        u = torch.add(x, _apply_filter(u, S, padding), alpha=1.0 / i)
    return u, u1


def soc_series(x: Tensor, S: Tensor, terms: int) -> Tensor:
    """``Σ_{j<terms} S^j x / j!`` by Horner, differentiable by plain autograd (exact
    gradient, SPEC §1.5).  ``S`` is a square ``(C, C, k, k)`` filter, ``x`` is ``(N, C, H, W)``."""
    return _series_forward(x, S, terms)[0]


def _conv_weight_grad(inp: Tensor, grad_out: Tensor, weight: Tensor, padding: int) -> Tensor:
    """``∂⟨grad_out, conv2d(inp, W)⟩/∂W``: a single convolution weight gradient (only the
    weight branch of the backend's convolution backward is computed; a matrix product for
    1×1 filters on 1×1 images, matching :func:`_apply_filter`)."""
    with _conv_region():
        if _is_matmul_case(inp, weight):
            n = inp.shape[0]
            return (grad_out.reshape(n, -1).T @ inp.reshape(n, -1)).view(weight.shape)
        _, grad_w, _ = torch.ops.aten.convolution_backward(
            grad_out, inp, weight, None, [1, 1], [padding, padding], [1, 1], False, [0, 0], 1,
            [False, True, False],
        )
        return grad_w


def _adjoint_series(
    g: Tensor, S: Tensor, terms: int, need_x: bool
) -> tuple[Tensor, int, Tensor | None]:
    """Backward Horner loop of the fast gradient with ``Sᵀ = −S`` (SPEC §1.6):
    ``v ← g − S(v)/i`` for ``i = terms−1 … 2`` gives ``v¹ = Σ_{j≤T−2} (Sᵀ)^j g/(j+1)!``;
    the input gradient is ``g − S(v¹)`` (exact).  Returns ``(s·v¹, s, grad_x or None)``
    with a sign ``s = ±1`` (the fused loop may end holding ``−v¹``)."""
    padding = S.shape[-1] // 2
    if _is_matmul_case(g, S):
        n = g.shape[0]
        g2, M = g.reshape(n, -1), _mat(S)
        v2 = g2
        with _conv_region():
            for i in range(terms - 1, 1, -1):
                v2 = torch.addmm(g2, v2, M.T, alpha=-1.0 / i)
            gx = torch.addmm(g2, v2, M.T, alpha=-1.0).view(g.shape) if need_x else None
        return v2.view(g.shape), 1, gx
    if _scales_filter(g, S):
        # conv(v, S/i) − g = −(g − S(v)/i): alternate "sub" and "add" so that no filter or
        # activation needs negating; ``sign`` is the sign of the held state relative to v.
        v, sign = g, 1
        for i in range(terms - 1, 1, -1):
            K = S * (1.0 / i)
            if sign > 0:
                v = _conv_plus(v, K, g, padding, sign=-1)   # = −v_new
            else:
                v = _conv_plus(v, K, g, padding, sign=1)    # g + S(−v)/i = v_new
            sign = -sign
        gx = None
        if need_x:
            gx = _conv_plus(v, S, g, padding) if sign < 0 else _conv_plus(v, -S, g, padding)
        return v, sign, gx
    v = g
    for i in range(terms - 1, 1, -1):
        v = torch.add(g, _apply_filter(v, S, padding), alpha=-1.0 / i)
    gx = torch.add(g, _apply_filter(v, S, padding), alpha=-1.0) if need_x else None
    return v, 1, gx


class _FastSOCSeries(torch.autograd.Function):
    """``z = Σ_{j<T} S^j x/j!`` with the fast filter gradient of the paper, eq. (4)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, S: Tensor, terms: int) -> Tensor:  # type: ignore[override]
        z, u1 = _series_forward(x, S, terms, keep_u1=True)
        ctx.save_for_backward(u1, S)
        ctx.terms = terms
        return z

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, None]:  # type: ignore[override]
        u1, S = ctx.saved_tensors
        g = g.contiguous(memory_format=_working_format(u1))
        padding = S.shape[-1] // 2
        need_x, need_S = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        v, sign, grad_x = _adjoint_series(g, S, ctx.terms, need_x)
        grad_S = None
        if need_S:
            grad_S = _conv_weight_grad(u1, v, S, padding)
            if sign < 0:
                grad_S = grad_S.neg_()
        return grad_x, grad_S, None


def soc_series_fast(x: Tensor, S: Tensor, terms: int) -> Tensor:
    """Same values as :func:`soc_series` (bit-identical); exact input gradient, fast filter
    gradient (one weight-gradient convolution, SPEC §1.6).  Requires ``terms ≥ 2``."""
    if terms < 2:
        raise ValueError("the fast SOC gradient needs at least 2 terms")
    return _FastSOCSeries.apply(x, S, terms)


# --------------------------------------------------------------------------------------
# Lipschitz bound of the truncated series (SPEC §5)
# --------------------------------------------------------------------------------------
def truncated_exp_norm_bound(b: float, terms: int) -> float:
    """Guaranteed bound on ``‖Σ_{j<T} S^j/j!‖₂`` for an exactly skew ``S`` with ``‖S‖₂ ≤ b``.

    ``exp(S)`` is orthogonal, so ``‖P_T(S)‖ ≤ 1 + Σ_{j≥T} b^j/j! ≤ 1 + b^T/T!·1/(1 − b/(T+1))``
    when ``b < T+1`` (geometric majorant of the tail); always ``‖P_T(S)‖ ≤ Σ_{j<T} b^j/j!``.
    The smaller valid value is returned, inflated by a relative ``1e-12`` to cover the float
    rounding of these few scalar operations.
    """
    if b < 0 or not math.isfinite(b):
        raise ValueError(f"invalid norm bound {b!r}")
    T = int(terms)
    plain = 0.0
    term = 1.0
    for j in range(T):
        plain += term
        term *= b / (j + 1)
    # here term = b^T / T!
    best = plain
    if b < T + 1:
        best = min(best, 1.0 + term / (1.0 - b / (T + 1)))
    return best * (1.0 + 1e-12)


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

# --------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------
def _select_on_host(device: torch.device) -> bool:
    """Whether the σ-giving reshape is read on the host (free on CPU, a sync on a GPU)."""
    return device.type == "cpu"


#: power-iteration steps run when a layer is built: SPEC §1.2 (a freshly built model refreshes
#: its vectors with the reference's 50 steps before evaluation; 10 steps left σ 1-4 % low)
INIT_POWER_STEPS = 50
#: upper limits of the series terms and power steps (the paper uses 6-15 terms, 1 step): a
#: model file asking for more is refused before any work (model files are untrusted input)
MAX_TERMS = 64
MAX_POWER_ITERS = 1000


class SOC(nn.Module):
    """Skew orthogonal convolution ``(N, c_in, H, W) → (N, c_out, H/s, W/s)`` (SPEC §1).

    Parameters ``weight`` (``C×C×k×k``, ``C = max(c_out, c_in·s²)``, init ``N(0, 1/C)``) and
    ``bias`` (``c_out``, ``U(−1/√C, 1/√C)``); persistent buffers ``power_u{r}``,
    ``power_v{r}`` (r = 0..3) with the power-iteration vectors of the four reshapes of the
    skew filter ``A`` (part of the state dict).  ``fast_grad`` selects the paper's fast filter
    gradient (``soc-fast``) or plain autograd (``soc``); both have the same parameters and a
    bit-identical forward, so a model trained with one evaluates with the other.

    Training forward: ``power_iters`` power steps per reshape, ``S = A/σ`` with gradients
    through ``σ``, ``train_terms`` series terms.  Eval forward: no power step, ``eval_terms``
    terms, ``S`` cached (recomputed only when the weight or a power buffer changes — tracked
    by tensor version counters and storage — or when ``train()``/``eval()``/``refresh()`` is
    called).  In eval mode the cached ``S`` is detached; if gradients to ``weight`` are
    requested in eval mode (grad enabled and ``weight.requires_grad``) ``S`` is recomputed
    with the same operations (same values) so parameter gradients still flow.  Writes that
    bypass version counters (``weight.data[...] = ...``) are not detected: call ``eval()``,
    ``train()`` or ``refresh()`` after them.
    """

    weight: Tensor
    bias: Tensor

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        *,
        train_terms: int = 6,
        eval_terms: int = 15,
        fast_grad: bool = True,
        power_iters: int = 1,
    ) -> None:
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError("channel counts must be positive")
        if stride not in (1, 2):
            raise ValueError(f"SOC supports stride 1 or 2, got {stride}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"SOC needs an odd kernel size, got {kernel_size}")
        if train_terms < 2 or eval_terms < 2:
            raise ValueError("train_terms and eval_terms must be at least 2")
        if train_terms > MAX_TERMS or eval_terms > MAX_TERMS:
            raise ValueError(f"train_terms and eval_terms must be at most {MAX_TERMS}")
        if power_iters < 0:
            raise ValueError("power_iters must be non-negative")
        if power_iters > MAX_POWER_ITERS:
            raise ValueError(f"power_iters must be at most {MAX_POWER_ITERS}")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = int(kernel_size)
        self.stride = int(stride)
        self.train_terms = int(train_terms)
        self.eval_terms = int(eval_terms)
        self.fast_grad = bool(fast_grad)
        self.power_iters = int(power_iters)
        C = max(self.out_channels, self.in_channels * self.stride**2)
        self.channels = C
        k = self.kernel_size
        self.weight = nn.Parameter(torch.randn(C, C, k, k) / math.sqrt(C))
        bound = 1.0 / math.sqrt(C)
        self.bias = nn.Parameter(torch.empty(self.out_channels).uniform_(-bound, bound))
        for r in range(CONV_RESHAPES):
            rows, cols = conv_reshape_shape((C, C, k, k), r)
            u = torch.randn(rows)
            v = torch.randn(cols)
            self.register_buffer(f"power_u{r}", u / torch.linalg.vector_norm(u))
            self.register_buffer(f"power_v{r}", v / torch.linalg.vector_norm(v))
        self._cache_key: tuple | None = None
        self._cache_S: Tensor | None = None
        self._bound_cache: tuple[tuple, float] | None = None
        self._last_reshape: int | Tensor = -1  # see last_sigma_reshape
        # Random start vectors can give a tiny or negative Rayleigh quotient σ, i.e. a
        # useless S in eval mode: a freshly built layer starts from converged-ish vectors
        # (not when a model file's vectors replace them: lipcli.sdk.loading).
        if not tensors_will_be_loaded():
            self.refresh(INIT_POWER_STEPS)

    # ------------------------------------------------------------------ power iteration
    # For the exactly skew D (T(D) = −D) the four reshapes are tied (F flips the tap index):
    #   R1(D) = −F R0(D)ᵀ F,    R3(D) = −F2 R2(D)ᵀ,
    # so all products needed by the four power iterations come from two matrices,
    # M0 = R0(D) and M2 = R2(D) (a view of D), two vectors each per pass.  M0 is never
    # materialised: its products are computed from M2 (see _left_products/_right_products),
    # so each half-step reads D once.
    def _power_vectors(self, r: int) -> tuple[Tensor, Tensor]:
        return getattr(self, f"power_u{r}"), getattr(self, f"power_v{r}")

    def _left_products(self, D: Tensor, X0: Tensor, X2: Tensor) -> tuple[Tensor, Tensor]:
        return _left_products(D, X0, X2)

    def _right_products(self, D: Tensor, P0: Tensor, P2: Tensor) -> tuple[Tensor, Tensor]:
        return _right_products(D, P0, P2)

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
        q, q2 = self._right_products(
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

    @torch.no_grad()
    def refresh(self, steps: int = 50) -> None:
        """Run ``steps`` power-iteration steps on all four reshapes (no gradient) and drop
        the eval cache.  Call before evaluating a freshly built or loaded model."""
        if steps > 0:
            self._power_iterate(_skew_difference(self.weight.detach()), int(steps))
        self._invalidate()

    # ------------------------------------------------------------------ filters
    def _compute_S(self, power_steps: int) -> Tensor:
        """``S = A/σ`` (SPEC §1.2): ``power_steps`` power steps (0: use the stored vectors),
        ``σ = min_r u_rᵀ R_r(A) v_r``, differentiable in ``weight`` with the vectors fixed.

        On CPU the minimising reshape is read on the host; elsewhere it is selected on the
        device (``ρ = min_r ρ_r``; the gradient's rank-one term weights the four reshapes by
        an exact one-hot vector), so a training step needs no GPU→host synchronisation."""
        W = self.weight
        C, k = self.channels, self.kernel_size
        with torch.no_grad():
            D = _skew_difference(W.detach())
            if power_steps > 0:
                quotients = self._power_iterate(D, power_steps)
            else:
                quotients = self._rayleigh_quotients(D)
            rhos = torch.stack([q[0] for q in quotients])
            if _select_on_host(D.device):
                r = int(torch.argmin(rhos))
                self._last_reshape = r
                rho, u, v = quotients[r]
                factors = [_rank_one_factors(r, u, v, C, k)]
            else:
                index = torch.argmin(rhos)
                self._last_reshape = index
                rho = rhos.min()
                onehot = (torch.arange(CONV_RESHAPES, device=D.device) == index).to(D.dtype)
                factors = []
                for r, (_, u, v) in enumerate(quotients):
                    eu, ev = _rank_one_factors(r, u, v, C, k)
                    factors.append((eu * onehot[r], ev))
        return _NormalisedSkew.apply(W, D, rho, factors)

    @property
    def last_sigma_reshape(self) -> int:
        """Index of the reshape that gave σ in the last filter computation (diagnostics;
        reading it synchronises with the device)."""
        r = self._last_reshape
        return int(r) if isinstance(r, Tensor) else r

    def _cache_token(self) -> tuple:
        w = self.weight
        token: list = [w._version, w.data_ptr(), w.dtype, w.device]
        for r in range(CONV_RESHAPES):
            u, v = self._power_vectors(r)
            token += [u._version, u.data_ptr(), v._version, v.data_ptr()]
        return tuple(token)

    def _invalidate(self) -> None:
        self._cache_key = None
        self._cache_S = None
        self._bound_cache = None

    def _eval_filter(self) -> Tensor:
        """The (detached) ``S`` used at evaluation, cached."""
        token = self._cache_token()
        if self._cache_S is None or self._cache_key != token:
            with torch.no_grad():
                S = self._compute_S(0)
            self._cache_S = S
            self._cache_key = self._cache_token()
        assert self._cache_S is not None
        return self._cache_S

    def skew_filter(self) -> Tensor:
        """``S = ½(W − T(W))/σ`` as used at evaluation (σ from the stored power vectors, no
        power step; detached, cached)."""
        return self._eval_filter()

    def train(self, mode: bool = True) -> "SOC":
        self._invalidate()
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "SOC":  # .to(), .double(), ...
        self._invalidate()
        return super()._apply(fn, recurse)

    # ------------------------------------------------------------------ forward
    def _prepare_input(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"SOC expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        extra = self.channels - x.shape[1]
        if extra > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, extra))
        return x.contiguous(memory_format=_working_format(x))

    def _series(self, x: Tensor, S: Tensor, terms: int) -> Tensor:
        if self.fast_grad and torch.is_grad_enabled() and (x.requires_grad or S.requires_grad):
            return soc_series_fast(x, S, terms)
        return soc_series(x, S, terms)

    def _linear(self, x: Tensor, S: Tensor, terms: int) -> Tensor:
        """The layer without its bias: unshuffle, pad, series, truncate."""
        z = self._series(self._prepare_input(x), S, terms)
        if self.channels > self.out_channels:
            z = z[:, : self.out_channels]
        return z

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            S = self._compute_S(self.power_iters)
            terms = self.train_terms
        else:
            if torch.is_grad_enabled() and self.weight.requires_grad:
                S = self._compute_S(0)
            else:
                S = self._eval_filter()
            terms = self.eval_terms
        z = self._linear(x, S, terms)
        # z is a fresh tensor (or a channel slice of one) that nothing else holds: add the
        # bias in place (no extra activation-sized buffer; same values)
        return z.add_(self.bias.view(1, -1, 1, 1))

    # ------------------------------------------------------------------ Lipschitz
    def spectral_bound(self, rtol: float = 5e-3, select_rtol: float | None = None) -> float:
        """Guaranteed upper bound ``b ≥ ‖S‖₂`` for the ``S`` actually used at evaluation:
        ``√(kh·kw)·min_r ‖R_r(S)‖₂`` (SPEC §5) with the reshape norms bounded from above in
        float64 (the float32 ``S`` is cast exactly), see :mod:`lipcli.numerics.spectral`; ``b`` is
        within about ``rtol`` of that minimum.  ``S`` is exactly skew, so only two of the
        four reshapes need bounding.  ``select_rtol`` (default ``rtol``) lets the cheaper of
        the two be bounded when its estimated norm is within that tolerance of the smaller
        (b only enters the truncation tail ``b^T/T!``, so e.g. 0.1 trades about 1e-4 of a
        layer bound for time)."""
        S = self._eval_filter()
        starts = [self._power_vectors(r)[1] for r in range(CONV_RESHAPES)]
        return conv_spectral_norm_upper_bound(
            S, rtol=rtol, select_rtol=select_rtol, skew=True, start_vectors=starts
        )

    def lipschitz_upper_bound(self) -> float:
        """Guaranteed bound on the l2 Lipschitz constant at ``eval_terms`` (SPEC §5):
        ``1 + b^T/T!·1/(1 − b/(T+1))`` with ``b`` = :meth:`spectral_bound` (or the plain
        ``Σ_{j<T} b^j/j!`` when smaller or when ``b ≥ T+1``).  Unshuffle, channel padding
        and truncation have norm ≤ 1; the bias does not matter.  Cached until the weight
        or a power vector changes."""
        key = (self._cache_token(), self.eval_terms)
        if self._bound_cache is not None and self._bound_cache[0] == key:
            return self._bound_cache[1]
        value = truncated_exp_norm_bound(self.spectral_bound(), self.eval_terms)
        self._bound_cache = (key, value)
        return value

    def lipschitz_estimate(self, input_shape: tuple[int, int, int], iters: int = 50) -> float:
        """Power-method estimate (a lower estimate) of the operator norm of
        ``x ↦ layer(x) − bias`` at ``eval_terms`` for inputs of shape ``(c_in, H, W)``."""
        S = self._eval_filter()
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn((1, *input_shape), generator=gen, dtype=S.dtype).to(S.device)
        estimate = 0.0
        with torch.enable_grad():
            for _ in range(max(1, iters)):
                x = (x / torch.linalg.vector_norm(x)).detach().requires_grad_(True)
                y = self._linear_plain(x, S)
                estimate = float(torch.linalg.vector_norm(y.detach()))
                (x_next,) = torch.autograd.grad(y, x, y.detach())
                x = x_next
        return estimate

    def _linear_plain(self, x: Tensor, S: Tensor) -> Tensor:
        z = soc_series(self._prepare_input(x), S, self.eval_terms)
        return z[:, : self.out_channels]

    def export_module(self) -> nn.Module:
        """``lip export``: the eval-mode layer as its fixed series of plain convolutions with
        the current filter (:class:`lipcli.builtins.soc.export.ExportedSOC`)."""
        from lipcli.builtins.soc.export import ExportedSOC

        return ExportedSOC.from_layer(self)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, train_terms={self.train_terms}, "
            f"eval_terms={self.eval_terms}, fast_grad={self.fast_grad}"
        )


# --------------------------------------------------------------------------------------
# Plugin hook
# --------------------------------------------------------------------------------------
_PARAMS = (
    Param(name="train_terms", type=int, default=6,
          help="terms of the exponential series during training (paper §4, eq. 1)"),
    Param(name="eval_terms", type=int, default=15,
          help="terms of the exponential series at evaluation/certification (paper §4, eq. 1)"),
    Param(name="power_iters", type=int, default=1,
          help="power-iteration steps per training forward for the filter norm σ"),
)


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    """``soc-fast`` (default: SOC with the paper's fast filter gradient) and ``soc``
    (exact-gradient baseline); same parameters, same forward."""
    return [
        ConvSpec(
            name="soc-fast",
            factory=functools.partial(SOC, fast_grad=True),
            description="Skew orthogonal convolution with the fast one-conv filter gradient",
            params=_PARAMS,
            promises=(ORTHOGONAL,),
        ),
        ConvSpec(
            name="soc",
            factory=functools.partial(SOC, fast_grad=False),
            description="Skew orthogonal convolution, exact autograd gradient (baseline)",
            params=_PARAMS,
            promises=(ORTHOGONAL,),
        ),
    ]
