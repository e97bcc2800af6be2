"""The closed-form CRC-Lip certificate and the rounding-safe margins it reads (SPEC §4).

With ``K >= m_lj`` (``∇²g ⪰ -K I`` everywhere, :mod:`lipcli.builtins.crc.bounds`) and
``g(y) > 0``: ``g(y + δ) >= g(y) - ‖∇g‖‖δ‖ - (K/2)‖δ‖²``, so
``r_fast = (√(‖∇g‖² + 2Kg) - ‖∇g‖)/K = 2g / (√(‖∇g‖² + 2Kg) + ‖∇g‖)`` (``g/‖∇g‖`` at
``K = 0``) is a sound lower bound on the distance to ``{g = 0}``.  :func:`pair_margins`
computes ``g`` (a lower bound) and ``‖∇g‖`` (an upper bound) in float64 with every rounding
error bounded; :func:`closed_form_radius` evaluates the formula.  Used by the certifier and by
``lip export --certify`` (:mod:`lipcli.builtins.crc.export`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lipcli.builtins.crc.weights import hidden_error, softplus64
from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U64  # float64


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
    gn_hi: torch.Tensor | None  # (B, c) upper bounds on ‖∇g_lj(y)‖ (None: not computed)


def gradient_norm_error(w, w1_sq_bound: float, max_zerr, w2n_l, w2n_j, gn):
    """Bound on ``|computed ‖∇g_lj(y)‖ - exact ‖∇g_lj(y)‖|`` (either sign) for a gradient
    norm ``gn`` computed in float64 as ``‖((W₂[l] - W₂[j]) ⊙ σ'(z₀)) W₁‖`` from the rounded
    ``z₀`` (elementwise error ``<= max_zerr``); ``w2n_l, w2n_j`` are ``‖W₂[l]‖, ‖W₂[j]‖``.
    Broadcasts; used by :func:`pair_margins` and the certifier's pruned search."""
    u = _U64
    return ((w.hidden + 4) * u * w.w1_frob + math.sqrt(w1_sq_bound) * (0.25 * max_zerr + 8 * u)) * (
        w2n_l + w2n_j
    ) + 8 * u * gn


def point_margins(w, y: torch.Tensor) -> PairMargins:
    """:func:`pair_margins` without the gradient norms (``gn_hi`` is ``None``)."""
    u, hidden = _U64, w.hidden
    z0 = y @ w.w1.T + w.b1
    y_norm = y.norm(dim=1, keepdim=True)
    z0_err = (w.dim + 4) * u * (w.w1_row_norm * y_norm + w.b1.abs()) + 2 * u * z0.abs()
    sp = softplus64(z0)
    s1 = torch.sigmoid(z0)
    logits = sp @ w.w2.T + w.b2
    pred = logits.argmax(dim=1)
    own = pred.unsqueeze(1)
    hid_err = hidden_error(z0, z0_err, sp, hidden) @ w.w2_abs.T  # (B, c)
    bias_err = 4 * u * w.b2.abs()
    top = logits.gather(1, own)
    g = top - logits
    g_err = hid_err.gather(1, own) + hid_err + bias_err.index_select(0, pred).unsqueeze(1) + bias_err
    g_err = g_err + 4 * u * (top.abs() + logits.abs())
    return PairMargins(z0, z0_err, s1, logits, pred, g, g - g_err, None)


def pair_margins(w, y: torch.Tensor, w1_sq_bound: float, pair_gradients) -> PairMargins:
    """Logits, predictions, margin lower bounds and gradient-norm upper bounds at ``y``
    (float64, every rounding error bounded), the inputs of the closed form and the dual.

    ``w`` has the fields of :class:`MLPWeights` (``w1, b1, w2, b2, w1_row_norm, w2_abs,
    w2_row_norm, w1_frob, hidden, dim``): the certifier's weights, or the exported
    certificate module holding them as buffers.  ``pair_gradients(s1, pred)`` gives
    ``‖∇g_lj(y)‖`` ``(B, c)`` (its matrix-product rounding is covered by the bound below).
    Written with ``gather``/``index_select`` so that ``torch.export`` and ONNX can trace it."""
    t = point_margins(w, y)
    gn = pair_gradients(t.s1, t.pred)
    max_zerr = t.z0_err.amax(dim=1, keepdim=True)
    gn_err = gradient_norm_error(
        w, w1_sq_bound, max_zerr, w.w2_row_norm.index_select(0, t.pred).unsqueeze(1), w.w2_row_norm.unsqueeze(0), gn
    )
    t.gn_hi = gn + gn_err
    return t
