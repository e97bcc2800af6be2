"""Dense matrices of circular convolutions, with guaranteed error bounds (plugin SDK, for the
eval lowering of :mod:`lipcli.sdk.lowering`).

A circular convolution on an ``H × W`` torus (``N = HW`` pixels), after the optional
``pixel_unshuffle`` of stride 2, is *block circulant*: with channel-major flattening its
matrix is ``M[(o, p), (i, q)] = G[o, i, (p − q) mod (H, W)]`` for a real kernel ``G`` of shape
``(out, in, H, W)`` (:func:`circulant_matrix`, exact copies of ``G``'s entries; the stride-2
rearrangement is a permutation of the columns, :func:`unshuffle_columns`, exact).  Two ways
to get ``G``:

* **From a filter** ``K`` (``out × in × k × k``, cross-correlation as ``conv2d``,
  circular padding; BCOP): ``G[o, i, δ] = Σ K[o, i, a, b]`` over the taps with
  ``(k//2 − a, k//2 − b) ≡ δ`` — one tap per entry unless ``k > H`` or ``k > W`` (taps alias
  on a small torus).  :func:`circular_conv_kernel` sums the aliased float32 taps in float64:
  entry error ``≤ γ_{m−1}·Σ|taps|`` (``m`` taps), zero when nothing aliases.
* **From per-frequency matrices** ``Q̂(f)`` (half-plane bins ``f_x ≤ W/2``, the operator of
  :class:`lipcli.sdk.fourier.FourierConvBase`).  The map ``x ↦ irfft2(Q̂ · rfft2(x))`` in
  exact arithmetic, for the float matrices ``Q̂`` as stored (the map whose norm the Fourier
  layers' bound covers, :mod:`lipcli.sdk.fourier`), is ``y[o, p] = (1/N) Σ_{f∈half} w_f
  Re(Σ_i Q̂(f)[o, i] x̂_i(f) e^{2πi f·p})`` (``c2r`` keeps the real part of the DC and Nyquist
  columns; ``w_f = 1`` there, ``2`` otherwise), so
  ``G[o, i, δ] = (1/N) Σ_{f∈half} w_f (Re Q̂ cos θ_{f,δ} − Im Q̂ sin θ_{f,δ})`` with
  ``θ_{f,δ} = 2π(f_y δ_y/H + f_x δ_x/W)`` — whether or not ``Q̂(−f) = conj Q̂(f)`` holds in
  floating point.  :func:`fourier_kernel` computes it as one float64 matrix product.

**Error bounds** (:mod:`lipcli.numerics.rounding`).  The cos/sin table is not libm's: the
angles ``2πr/N`` (``r`` an exact integer) are evaluated by Taylor series in 60-digit
``decimal`` arithmetic and rounded once to float64 (:func:`trig_table`), so every entry is
within ``τ = 1.01u`` of the exact value.  With ``V = [Re Q̂ | Im Q̂]`` (exact in float64),
``T = [[w·cos], [−w·sin]]`` (``|T̂| ≤ w``, ``|T̂ − T| ≤ wτ``) and ``n`` the inner length, the
product is off entrywise by at most ``γ_n s`` and the table by ``τ s``, with
``s[o, i] = Σ_f w_f(|Re Q̂| + |Im Q̂|)``; dividing by ``N`` adds ``u(1 + γ_n)s/N``.  So
``|Ĝ − G| ≤ κ s/N`` with ``κ = γ_n + τ + u(1 + γ_n)`` (plus ``n·η`` per entry for
underflow).  The error of the whole matrix is itself block circulant with kernel ``ε``:
``‖M − P‖₂ ≤ ‖M − P‖_F = √N ‖ε‖_F``, here ``≤ κ‖s‖_F + √(out·in·N)·n·η``.  For a filter,
``√N·γ_{m−1}·‖fold(|K|)‖_F``.  Every scalar of the bound is rounded up.

**When dense pays** (:func:`dense_lowering_at_gain`).  :func:`lipcli.sdk.lowering.dense_lowering`
asks a matrix product to cost at most ``1/DENSE_MIN_GAIN`` of the literal form's
operations, a margin calibrated on SOC's series of real convolutions.  The literal forms of
the circular-convolution layers are slower per operation than one matrix product (FFTs and
complex products of a few pixels; circular padding gathers), so for them the dense form
pays already at equal operation counts: in an interleaved comparison on the strided layers of
LipConvnet-5 width 16 (batch 256, float32, 2-core CPU; Cayley, BRO, LOT, BCOP) the dense matrix
was at least as fast at ``2 × 2`` inputs (equal operations), clearly faster at ``4 × 4`` and slower
at ``8 × 8`` (1.8–5× the operations); ``lip bench certify --conv NAME`` times a whole network both
ways.  These layers therefore ask for :data:`CIRCULAR_MIN_GAIN`.
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal, localcontext
from typing import Any

import torch
from torch import Tensor

from lipcli.numerics.rounding import ETA, UNIT_ROUNDOFF, gamma, norm_from_squares, round_up
from lipcli.sdk.lowering import DenseOperator, dense_lowering

__all__ = ["CIRCULAR_MIN_GAIN", "circulant_matrix", "dense_lowering_at_gain", "literal_facts", "circular_conv_kernel", "circular_conv_matrix", "fourier_kernel",
           "fourier_matrix", "trig_table", "unshuffle_columns"]

#: a circular-convolution layer goes dense when one matrix product costs at most its
#: literal form's operations (module docstring)
CIRCULAR_MIN_GAIN = 1

#: π to 64 digits (the Taylor series below runs at 60 digits)
_PI = Decimal("3.141592653589793238462643383279502884197169399375105820974944592")
#: ``|table − exact| ≤ TRIG_ERROR`` for every entry of :func:`trig_table` (round to nearest,
#: ``u`` relative on values ``≤ 1``, plus the decimal series' ``< 10⁻⁵⁰``)
TRIG_ERROR = 1.01 * UNIT_ROUNDOFF


def _cos_sin_decimal(r: int, n: int) -> tuple[float, float]:
    """``cos, sin`` of ``2πr/n`` to 60 digits, each rounded once to float64."""
    with localcontext() as ctx:
        ctx.prec = 60
        x = 2 * _PI * r / n
        if x > _PI:
            x -= 2 * _PI  # |x| ≤ π: terms x^k/k! shrink fast, little cancellation
        term, c, s = Decimal(1), Decimal(0), Decimal(0)
        for k in range(1, 80):  # term = x^(k-1)/(k-1)!; |x|^80/80! < 1e-78
            if k % 4 == 1:
                c += term
            elif k % 4 == 2:
                s += term
            elif k % 4 == 3:
                c -= term
            else:
                s -= term
            term = term * x / k
        return float(c), float(s)  # str → float conversion: correctly rounded


@functools.lru_cache(maxsize=32)
def _trig_values(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    values = [_cos_sin_decimal(r, n) for r in range(n)]
    return tuple(c for c, _ in values), tuple(s for _, s in values)


def trig_table(n: int) -> tuple[Tensor, Tensor]:
    """``cos(2πr/n), sin(2πr/n)`` for ``r < n`` (float64, each within :data:`TRIG_ERROR`)."""
    cos, sin = _trig_values(int(n))
    return torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)


def fourier_kernel(op: Tensor, size: tuple[int, int]) -> tuple[Tensor, float]:
    """``(Ĝ, e)``: the spatial kernel ``(out, in, H, W)`` (float64) of the map
    ``x ↦ irfft2(op · rfft2(x))`` for the half-plane matrices ``op``
    (``(H·(W//2+1), out, in)``, complex) and ``e ≥ ‖circulant(Ĝ) − P‖₂`` (module docstring)."""
    H, W = (int(v) for v in size)
    N, bins = H * W, W // 2 + 1
    q = op.detach().resolve_conj().to(torch.complex128)
    nf, out, cin = q.shape
    if nf != H * bins:
        raise ValueError(f"{nf} frequency matrices do not fit a {H}x{W} image")
    dev = q.device
    fy = torch.arange(H, device=dev).repeat_interleave(bins)  # bin order: (f_y, f_x) row-major
    fx = torch.arange(bins, device=dev).repeat(H)
    dy = torch.arange(H, device=dev).repeat_interleave(W)  # δ order: (δ_y, δ_x) row-major
    dx = torch.arange(W, device=dev).repeat(H)
    r = torch.remainder(fy[:, None] * dy[None, :] * W + fx[:, None] * dx[None, :] * H, N)  # exact
    cos, sin = (t.to(dev) for t in trig_table(N))
    w = torch.full((bins,), 2.0, dtype=torch.float64, device=dev)
    w[0] = 1.0
    if W % 2 == 0:
        w[-1] = 1.0
    w = w.repeat(H)[:, None]  # (nf, 1), exact powers of two
    table = torch.cat([w * cos[r], -w * sin[r]], dim=0)  # (2·nf, N)
    V = torch.cat([q.real, q.imag], dim=0).reshape(2 * nf, out * cin).T  # (out·in, 2·nf)
    G = (V @ table) / N
    n = 2 * nf
    kappa = gamma(n) + TRIG_ERROR + UNIT_ROUNDOFF * (1.0 + gamma(n))
    s = (V.abs() @ torch.cat([w, w], dim=0)).squeeze(1) * (1.0 + 2.0 * gamma(n + 2))  # ≥ Σ w(|Re| + |Im|)
    s_fro = norm_from_squares(float(s.square().sum()), s.numel())
    err = kappa * s_fro * (1.0 + 4.0 * UNIT_ROUNDOFF) + math.sqrt(out * cin * N) * n * ETA
    return G.reshape(out, cin, H, W), round_up(err)


def circular_conv_kernel(K: Tensor, size: tuple[int, int]) -> tuple[Tensor, float]:
    """``(Ĝ, e)``: the kernel ``(out, in, H, W)`` (float64) of the circular cross-correlation
    with filter ``K`` on an ``H × W`` torus (aliased taps summed) and ``e ≥ ‖circulant(Ĝ) −
    P‖₂`` (``0`` when no taps alias; module docstring)."""
    H, W = (int(v) for v in size)
    out, cin, kh, kw = K.shape
    K = K.detach().to(torch.float64)
    G = K.new_zeros(out, cin, H, W)
    A = K.new_zeros(out, cin, H, W)
    count = [[0] * W for _ in range(H)]
    for a in range(kh):
        for b in range(kw):
            y, x = (kh // 2 - a) % H, (kw // 2 - b) % W
            G[:, :, y, x] += K[:, :, a, b]
            A[:, :, y, x] += K[:, :, a, b].abs()
            count[y][x] += 1
    m = max(max(row) for row in count)
    if m <= 1:
        return G, 0.0  # exact copies
    g = gamma(m - 1)
    a_fro = norm_from_squares(float(A.square().sum()), A.numel()) * (1.0 + 2.0 * g)  # ≥ ‖fold(|K|)‖_F
    err = math.sqrt(H * W) * g * a_fro * (1.0 + 4.0 * UNIT_ROUNDOFF) + math.sqrt(A.numel() * H * W) * m * ETA
    return G, round_up(err)


def circulant_matrix(G: Tensor) -> Tensor:
    """``M[(o, p), (i, q)] = G[o, i, (p − q) mod (H, W)]``, shape ``(out·H·W, in·H·W)``:
    exact copies of ``G``'s entries (module docstring)."""
    out, cin, H, W = G.shape
    iy = torch.remainder(torch.arange(H, device=G.device)[:, None] - torch.arange(H, device=G.device)[None, :], H)
    ix = torch.remainder(torch.arange(W, device=G.device)[:, None] - torch.arange(W, device=G.device)[None, :], W)
    M = G[:, :, iy[:, None, :, None], ix[None, :, None, :]]  # (out, in, H(p), W(p), H(q), W(q))
    return M.permute(0, 2, 3, 1, 4, 5).reshape(out * H * W, cin * H * W)


def unshuffle_columns(M: Tensor, in_channels: int, stride: int, size: tuple[int, int]) -> Tensor:
    """The columns of ``M`` (indexed by the ``pixel_unshuffle``d input ``(in·s², H, W)``)
    re-indexed by the original input ``(in, s·H, s·W)``: a permutation (exact)."""
    if stride == 1:
        return M
    H, W = size
    s = int(stride)
    M = M.reshape(M.shape[0], in_channels, s, s, H, W)  # channel c·s² + dy·s + dx
    return M.permute(0, 1, 4, 2, 5, 3).reshape(M.shape[0], in_channels * H * s * W * s)


def fourier_matrix(op: Tensor, size: tuple[int, int], in_channels: int, stride: int) -> tuple[Tensor, float]:
    """``(M, e)`` for a Fourier-domain layer with half-plane matrices ``op`` on the
    (rearranged) ``size`` (``1 × 1``: ``op`` is the real ``(1, out, in·s²)`` matrix, copied
    exactly, ``e = 0``)."""
    if tuple(size) == (1, 1):
        return unshuffle_columns(op.detach()[0].real.to(torch.float64), in_channels, stride, (1, 1)), 0.0
    G, err = fourier_kernel(op, size)
    return unshuffle_columns(circulant_matrix(G), in_channels, stride, size), err


def circular_conv_matrix(K: Tensor, size: tuple[int, int], in_channels: int,
                         stride: int) -> tuple[Tensor, float]:
    """``(M, e)`` for a circular convolution with filter ``K`` on the (rearranged) ``size``."""
    G, err = circular_conv_kernel(K, size)
    return unshuffle_columns(circulant_matrix(G), in_channels, stride, size), err


def dense_lowering_at_gain(layer: Any, context: Any, literal_flops: int, output_shape: tuple[int, ...],
                           min_gain: float = CIRCULAR_MIN_GAIN) -> DenseOperator | None:
    """:func:`lipcli.sdk.lowering.dense_lowering` with the circular layers' gain ``min_gain``
    (module docstring) and their build cost: one float64 product ``2·d_in·d_out`` for the
    kernel ``G`` and as many copies for the block-circulant matrix, ``4·d_in·d_out``."""
    if context is None:
        return None
    d = math.prod(int(v) for v in context.input_shape) * math.prod(output_shape)
    return dense_lowering(layer, context, literal_flops, output_shape, build_flops=4 * d,
                          min_gain=min_gain)


def literal_facts(lowering: str, input_shape: tuple[int, ...], output_shape: tuple[int, ...],
                  literal_flops: int) -> dict[str, Any]:
    """The ``export_lowering`` description of a layer that stays literal: its form, shapes,
    operations per input and what the dense form would have cost."""
    d = math.prod(input_shape) * math.prod(output_shape)
    return {"lowering": lowering, "input_shape": list(input_shape), "output_shape": list(output_shape),
            "series_flops_per_image": int(literal_flops), "dense_flops_per_image": 2 * d,
            "dense_mib": 4 * d / 2**20}
