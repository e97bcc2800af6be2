r"""The paper's own certificate rule for its ``crc_full`` head, for ``lip import --compare``.

What the paper's code reports for a CRC head (singlasahil14/improved_l2_robustness at
65dd5f2: ``test_robust.py`` evaluates ``crc_full`` models with
``utils.evaluate_certificates_precise``, which calls ``CRC_Full.certificates`` in eval mode in
float32 and divides by ``lipschitz_constant(exact=True)``).  Re-implemented here from that
description (read, not copied), on lipcli's imported ``mlp`` head ``h(y) = W₂ softplus(W₁y +
b₁) + b₂``, per image and each of its top-9 other classes ``j``:

* **curvature** ``m_j = ¼·max(|uᵀW₁ᵀ diag(w⁻) W₁u|, |uᵀW₁ᵀ diag(w⁺) W₁u|)`` with ``w = W₂[y] −
  W₂[j]`` split by sign and ``u`` after 20 power steps from a random normal start, clamped
  below at 1e-4: an *estimate* (a Rayleigh quotient is at most the largest eigenvalue, so it
  can be below the true bound lipcli's ``crc-lip`` proves);
* **dual search**: 5 bisection steps on ``η`` in ``[0, 1/m_j]`` (``[−1/m_j, 0]`` when the
  margin is negative), the inner minimiser ``δ`` warm-started across them and refined by at
  most 6 Newton steps whose systems ``(I + ηW₁ᵀ diag(w ⊙ σ″) W₁) s = ∇F`` are solved by a
  10-term Neumann series (stopping early when every ``‖∇F‖ < 1e-7``); ``η`` moves up where
  ``g(y + δ) > 0``;
* **certificate** ``√(‖δ‖² + 2η g(y + δ))`` (0 when that is ``≤ 1e-6``, or when the last
  ``‖∇F‖`` is not below 1e-6: no convergence, no certificate), signed by the margin, divided by
  the product of per-layer power-iteration estimates; the image's radius is the smallest over
  ``j``, certified at ``r`` when it is ``> r``.

It differs from a sound dual bound in three places: the estimated curvature, no
``‖∇F‖²/(2μ)`` correction for the unsolved inner problem, and float32 throughout.  The random
starts come from a generator seeded with ``seed`` (the paper's code draws from torch's global
generator), so a run is reproducible; the same draws as ``torch.manual_seed(seed)`` before
the paper's call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["paper_crc_certificates"]

#: ``CRC_Full``'s defaults in the paper's code (``last_layers.py``), as ``LipConvNet`` builds it
HESSIAN_BOUND = 0.25  # its Softplus(beta=1): max σ″
THRESHOLD = 20.0  # its Softplus: linear above, 0 below -threshold
EVAL_ITERS, OUTER_ITERS, INNER_ITERS, TAYLOR_ITERS = 20, 5, 5, 10
GRAD_TOL, TOLERANCE_MULTIPLIER, MIN_CURV, EPS = 1e-6, 0.1, 1e-4, 1e-6
NUM_OTHER = 9


def _softplus(z: torch.Tensor) -> torch.Tensor:
    """The paper's ``Softplus(beta=1, threshold=20)``: exactly 0 below -20 (not ``e^z``)."""
    tail = F.softplus(-z.abs()) * (z.abs() < THRESHOLD)
    return torch.where(z >= 0, z + tail, tail)


def _curvature(w1: torch.Tensor, w2_diff: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``max(m, M)`` per row of ``w2_diff`` (P, H): the power-iteration estimate (module doc)."""
    neg, pos = w2_diff.clamp(max=0), w2_diff.clamp(min=0)
    shape = (w2_diff.shape[0], w1.shape[1])
    u_neg = F.normalize(torch.randn(shape, generator=gen, dtype=w1.dtype), dim=1)
    u_pos = F.normalize(torch.randn(shape, generator=gen, dtype=w1.dtype), dim=1)
    for _ in range(EVAL_ITERS):
        u_neg = F.normalize(((u_neg @ w1.T) * neg) @ w1, dim=1)
        u_pos = F.normalize(((u_pos @ w1.T) * pos) @ w1, dim=1)
    m = HESSIAN_BOUND * ((u_neg @ w1.T) ** 2 * neg).sum(1).abs()
    big_m = HESSIAN_BOUND * ((u_pos @ w1.T) ** 2 * pos).sum(1).abs()
    return torch.maximum(m, big_m)


def _newton_step(w1: torch.Tensor, diag: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``(I + W₁ᵀ diag W₁)⁻¹ rhs`` by the paper's 10-term Neumann series."""
    s = rhs
    for _ in range(TAYLOR_ITERS):
        s = rhs - ((s @ w1.T) * diag) @ w1
    return s


def _dual_search(x, w1, b1, w2_diff, b2_diff, eta_lo, eta_hi):
    """The bisection on ``η`` with warm-started Newton steps; ``(η, δ, last ‖∇F‖)``."""
    delta = torch.zeros_like(x)
    for _ in range(OUTER_ITERS):
        eta = 0.5 * (eta_lo + eta_hi)
        for j in range(INNER_ITERS + 1):
            z = (x + delta) @ w1.T + b1
            sig = torch.sigmoid(z)
            grad_dual = delta + eta[:, None] * ((sig * w2_diff) @ w1)
            norm = grad_dual.norm(dim=1)
            if j == INNER_ITERS or bool((norm < TOLERANCE_MULTIPLIER * GRAD_TOL).all()):
                break
            delta = delta - _newton_step(w1, eta[:, None] * w2_diff * sig * (1 - sig), grad_dual)
        above = (_softplus(z) * w2_diff).sum(1) + b2_diff > 0
        eta_lo = torch.where(above, eta, eta_lo)
        eta_hi = torch.where(above, eta_hi, eta)
    return eta, delta, norm


@torch.no_grad()
def paper_crc_certificates(head: torch.nn.Module, features: torch.Tensor, predictions: torch.Tensor,
                           seed: int = 0) -> torch.Tensor:
    """The paper's signed certificates ``(N, k)`` of ``predictions`` against each image's top-k
    other classes (``k = min(9, classes − 1)``), in the head's feature space (not yet divided
    by the body's constant); ``head`` has ``fc1``, ``fc2`` (lipcli's ``mlp``)."""
    w1, b1 = head.fc1.weight.float(), head.fc1.bias.float()
    w2, b2 = head.fc2.weight.float(), head.fc2.bias.float()
    x = features.flatten(1).float()
    logits = _softplus(x @ w1.T + b1) @ w2.T + b2
    n, k = x.shape[0], min(NUM_OTHER, w2.shape[0] - 1)
    rows = torch.arange(n)
    others = logits.clone()
    others[rows, predictions] = -torch.inf
    other = others.topk(k, dim=1).indices
    margin = (logits[rows, predictions][:, None] - logits[rows[:, None], other]).flatten()
    w2_diff = (w2[predictions][:, None, :] - w2[other]).reshape(n * k, -1)
    b2_diff = (b2[predictions][:, None] - b2[other]).reshape(-1)
    xs = x.repeat_interleave(k, dim=0)
    curv = _curvature(w1, w2_diff, torch.Generator().manual_seed(seed)).clamp(min=MIN_CURV)
    eta_lo = (margin < 0) * (-1.0 / curv)
    eta_hi = (margin > 0) * (1.0 / curv)
    eta, delta, norm = _dual_search(xs, w1, b1, w2_diff, b2_diff, eta_lo, eta_hi)
    g = (_softplus((xs + delta) @ w1.T + b1) * w2_diff).sum(1) + b2_diff
    certs = ((delta * delta).sum(1) + 2 * eta * g) * (norm < GRAD_TOL)
    certs = (certs > EPS) * certs.clamp(min=EPS).sqrt()
    return certs.view(n, k) * torch.sign(margin).view(n, k)
