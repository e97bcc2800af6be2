"""The SOC series: Horner evaluation of the truncated exponential, its fast gradient, and the
Lipschitz bound of the truncation (SPEC §1.4–§1.6, §5).

Maths (SPEC §1; Singla & Feizi 2021, and the paper §4, eqs. (1)–(4)):

* Output ``z = Σ_{j<T} S^j x / j!`` by Horner, ``u ← x; for i = T−1…1: u ← x + S(u)/i``
  (paper eq. (2), SPEC §1.4); ``T`` = ``train_terms`` in training, ``eval_terms`` otherwise.
* Fast gradient (paper §4, eq. (4), SPEC §1.6): a custom autograd function over ``(x, S)``
  keeps only ``u¹ = Σ_{j≤T−2} S^j x/(j+1)!`` and ``S``.  Backward, with ``g = ∂ℓ/∂z``:
  ``v¹ = Σ_{j≤T−2} (Sᵀ)^j g/(j+1)!`` by the same Horner loop with ``Sᵀ = −S``; exact input
  gradient ``g − S(v¹)``; filter gradient = ONE convolution weight gradient of
  (input ``u¹``, grad-output ``v¹``), i.e. ``Σ_{a,b≤T−2} (Sᵀ)^a g (S^b x)ᵀ/((a+1)!(b+1)!)``
  instead of the exact ``Σ_{a+b≤T−2} (Sᵀ)^a g (S^b x)ᵀ/(a+b+1)!``.  The forward computes
  the same values as the exact mode, bit for bit (checked by the tests).
* Lipschitz constant (SPEC §5): with ``b ≥ ‖S‖₂`` and ``exp(S)`` orthogonal,
  ``‖P_T(S)‖ ≤ 1 + b^T/T! · 1/(1 − b/(T+1))`` (``b < T+1``) and always
  ``‖P_T(S)‖ ≤ Σ_{j<T} b^j/j!`` (:func:`truncated_exp_norm_bound`).

Implementation (speed, same values): on CPU in float32 a Horner step runs as ONE oneDNN
convolution with the add fused in, ``x + conv(u, S/i)``, when the activations outnumber the
filter entries (the scaled filters ``S/i`` are cheap there); otherwise, and on GPUs,
``x + conv(u, S)·(1/i)``.  A 1×1 filter on 1×1 images is a matrix product (``addmm``).  The
exact mode evaluates the same expressions with ``conv2d`` and a separate add under autograd,
which gives the same floating-point values.  The fast backward reuses the forward
convolution (``Sᵀ = −S``), alternating the fused ``add``/``sub`` so nothing is negated.  The
series runs in channels-last memory format on GPUs (no NCHW↔NHWC conversions around
cuDNN's convolutions) and on CPU for images of at least 64 pixels
(:mod:`lipcli.builtins.soc.settings`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lipcli.builtins.soc import settings
from lipcli.sdk.specs import CONVOLUTION_PROFILE_LABEL

__all__ = ["soc_series", "soc_series_fast", "soc_series_dense", "dense_applies", "truncated_exp_norm_bound"]


# --------------------------------------------------------------------------------------
# Memory format and the convolution of one step
# --------------------------------------------------------------------------------------
def _working_format(x: Tensor) -> torch.memory_format:
    """Memory format in which the series of an input like ``x`` is evaluated (the settings
    of :mod:`lipcli.builtins.soc.settings`, read at every call)."""
    if x.device.type == "cuda":
        return torch.channels_last if settings.CUDA_CHANNELS_LAST else torch.contiguous_format
    min_pixels = settings.CHANNELS_LAST_MIN_PIXELS
    if min_pixels is not None and x.device.type == "cpu" and x.shape[-1] * x.shape[-2] >= min_pixels:
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
    if not torch.compiler.is_compiling() and torch._C._autograd._profiler_enabled():
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


def _register_flop_formula() -> None:
    """Teach torch's flop counter (:class:`torch.utils.flop_counter.FlopCounterMode`, which
    ``lip bench certify`` reports) the oneDNN convolution the fused Horner step calls: the
    multiply-adds of its convolution, as for ``conv2d`` (the fused add is elementwise and not
    counted, like a bias).  Without it the counter skips those convolutions."""
    if not FUSED_CONV_ADD:
        return
    from torch.utils import flop_counter

    packet = torch.ops.mkldnn._convolution_pointwise
    if packet in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(packet)
    def _onednn_conv_flops(*args: Any, out_shape: Any = None, **_kwargs: Any) -> int:
        weight = args[2] if len(args) >= 13 else args[1]  # .binary(X, other, W, ...) / (X, W, ...)
        return flop_counter.conv_flop_count(list(args[0]), list(weight), list(out_shape))


_register_flop_formula()


def _onednn_float32(x: Tensor) -> bool:
    """Whether the fused oneDNN convolution-plus-add exists for tensors like ``x`` (not
    inside ``torch.compile``: the compiler fuses the add itself)."""
    return (FUSED_CONV_ADD and x.device.type == "cpu" and x.dtype == torch.float32
            and not torch.compiler.is_compiling())


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
# The series on tiny CPU images as matrix products (settings.CPU_DENSE_SMALL_IMAGES, opt-in)
# --------------------------------------------------------------------------------------
def dense_applies(x: Tensor, S: Tensor) -> bool:
    """Whether the opt-in dense form is used for ``x`` (``N, C, H, W``) and the filter ``S``:
    :data:`~lipcli.builtins.soc.settings.CPU_DENSE_SMALL_IMAGES`, CPU, every output pixel
    within the filter's reach of every input pixel, and fewer pixels than taps."""
    H, W = x.shape[-2:]
    kh, kw = S.shape[-2:]
    return (settings.CPU_DENSE_SMALL_IMAGES and x.device.type == "cpu" and H * W < kh * kw
            and H - 1 <= kh // 2 and W - 1 <= kw // 2 and (H, W) != (1, 1))


def dense_matrix(S: Tensor, H: int, W: int) -> Tensor:
    """The ``(C·H·W) × (C·H·W)`` matrix of ``conv2d(·, S, padding=k//2)`` on ``H×W`` images
    whose every tap pair is inside the filter (:func:`dense_applies`): ``M[(o,p),(i,q)] =
    S[o, i, q_y − p_y + k//2, q_x − p_x + k//2]`` (a gather of ``S``, differentiable; exactly
    skew when ``S`` is)."""
    kh, kw = S.shape[-2:]
    py, px = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    py, px = py.reshape(-1), px.reshape(-1)
    A = (py[None, :] - py[:, None] + kh // 2).to(S.device)
    B = (px[None, :] - px[:, None] + kw // 2).to(S.device)
    C, P = S.shape[0], H * W
    return S[:, :, A, B].permute(0, 2, 1, 3).reshape(C * P, S.shape[1] * P)


def soc_series_dense(x: Tensor, S: Tensor, terms: int, fast: bool) -> Tensor:
    """:func:`soc_series` (``fast``: :func:`soc_series_fast`) of ``x`` computed with the dense
    matrix of ``S`` as a ``1×1`` filter on ``1×1`` images (matrix products); the same map up
    to floating-point rounding."""
    n, C, H, W = x.shape
    M = dense_matrix(S, H, W)
    x1 = x.contiguous().view(n, C * H * W, 1, 1)
    M1 = M.view(M.shape[0], M.shape[1], 1, 1)
    z = soc_series_fast(x1, M1, terms) if fast else soc_series(x1, M1, terms)
    return z.view(n, C, H, W)


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

