"""The ``lln`` certificate: exact margin certificate of a linear head (SPEC §4).

For logits ``f(y) = y Ŵᵀ + b`` (rows ``ŵ_i`` of ``Ŵ``; for the LLN head ``ŵ_i = W_i/||W_i||``)
and predicted class ``l``, the set where class ``j`` beats ``l`` is the half space
``(ŵ_j - ŵ_l)ᵀ y' + b_j - b_l >= 0``; its l2 distance from ``y`` is
``(f_l(y) - f_j(y)) / ||ŵ_l - ŵ_j||``.  The feature-space certificate is therefore

    r(y) = min_{j != l} (f_l(y) - f_j(y)) / ||ŵ_l - ŵ_j||                       (SPEC §4)

which is the *exact* distance to the decision boundary of the linear head.  Unlike the
reference (minimum over the 9 highest other logits, unsound for 100 classes) the minimum is
over **all** classes unless ``top_k`` is given (then the result is marked heuristic).

Arithmetic is float64 on the weights the forward pass applies (``head.normalized_weight()``
when the head has it, else ``head.weight``).  The tiny float64 rounding error of the margin is
bounded and subtracted, and the result is clamped at 0 (a tie or negative margin certifies
nothing).
"""

from __future__ import annotations

import torch
from torch import nn

from lipcli.sdk.certificates import (
    HEURISTIC_NOTE,
    CertifyResult,
    cache_matches,
    competing_classes,
    make_cache,
)
from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U64  # float64
from lipcli.sdk.specs import SOUND
from lipcli.sdk.export import ExportedCertificate



def linear_head_weights(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Ŵ, b)`` in float64: the exact matrix and bias the head's forward pass applies."""
    with torch.no_grad():
        if hasattr(head, "normalized_weight"):
            weight = head.normalized_weight()
        else:
            weight = head.weight
        bias = head.bias if getattr(head, "bias", None) is not None else None
        weight = weight.detach().to(torch.float64)
        if bias is None:
            bias = torch.zeros(weight.shape[0], dtype=torch.float64, device=weight.device)
        return weight, bias.detach().to(torch.float64)


def pairwise_row_distances(weight: torch.Tensor) -> torch.Tensor:
    """``(c, c)`` matrix of ``||ŵ_a - ŵ_b||`` in float64, rounding-safe (never too small).

    Computed from the differences themselves: the Gram-matrix shortcut
    ``||a||² + ||b||² - 2aᵀb`` (which ``torch.cdist`` switches to for more than 25 rows)
    cancels catastrophically for nearly equal rows and could *under*-estimate the distance,
    i.e. over-claim the radius.
    """
    w = weight.to(torch.float64)
    c, dim = w.shape
    out = torch.empty(c, c, dtype=torch.float64, device=w.device)
    step = max(1, (1 << 22) // max(1, c * dim))
    for s in range(0, c, step):
        out[s : s + step] = (w[s : s + step].unsqueeze(1) - w.unsqueeze(0)).norm(dim=2)
    # the difference, squares, sum and square root round: inflate by (D + 4) ulps
    return out * (1 + (dim + 4) * _U64)


def lln_radius(
    weight: torch.Tensor,
    bias: torch.Tensor,
    features: torch.Tensor,
    candidates: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions and exact linear-head radii ``min_j (f_l - f_j)/||ŵ_l - ŵ_j||`` (float64).

    Args:
        weight: ``(c, D)`` rows ``ŵ_i`` (any norms; the formula does not assume unit rows).
        bias: ``(c,)``.
        features: ``(B, D)``.
        candidates: optional ``(B, c)`` boolean mask of competing classes (default: all
            ``j != l``).
    Returns:
        ``(predictions LongTensor[B], radius float64[B] >= 0)``.  Pairs with
        ``ŵ_l = ŵ_j`` never change their order and are ignored.
    """
    w = weight.to(torch.float64)
    b = bias.to(torch.float64)
    y = features.to(device=w.device, dtype=torch.float64)
    logits = y @ w.T + b
    pred = logits.argmax(dim=1)
    rows = torch.arange(y.shape[0], device=w.device)
    if candidates is None:
        candidates, _ = competing_classes(logits, pred, None)
    margin = logits[rows, pred].unsqueeze(1) - logits  # (B, c)
    # rounding error of each logit: gamma_{D+2} * (|y| |w|ᵀ + |b|), bounded per row by C-S
    mag = y.norm(dim=1, keepdim=True) * w.norm(dim=1) + b.abs()
    err = (y.shape[1] + 4) * _U64 * (mag[rows, pred].unsqueeze(1) + mag)
    dist = pairwise_row_distances(w)[pred]  # (B, c): ||ŵ_l - ŵ_j||
    ratio = (margin - err) / dist * (1 - 4 * _U64)  # the division rounds once more
    ratio = torch.where(dist > 0, ratio, torch.full_like(ratio, float("inf")))
    ratio = ratio.masked_fill(~candidates, float("inf"))
    radius = ratio.min(dim=1).values  # +inf only if no competing class can ever win
    return pred, radius.clamp_min(0.0)


class LLNCertifier:
    """Exact certificate of a linear (LLN) head, all classes by default (SPEC §4)."""

    name = "lln"
    promises = (SOUND,)

    def __init__(self) -> None:
        self.cache: dict = {}

    def prepare(self, head: nn.Module, cache: dict | None = None) -> dict:
        """Nothing to precompute; returns ``{"method", "version", "fingerprint"}``."""
        self.cache = cache if cache_matches(cache, self.name, head) else make_cache(self.name, head)
        return self.cache

    def certify(
        self, head: nn.Module, features: torch.Tensor, *, top_k: int | None = None
    ) -> CertifyResult:
        weight, bias = linear_head_weights(head)
        y = features.detach().to(device=weight.device, dtype=torch.float64)
        logits = y @ weight.T + bias
        pred = logits.argmax(dim=1)
        candidates, exact = competing_classes(logits, pred, top_k)
        pred, radius = lln_radius(weight, bias, y, candidates)
        num_classes = weight.shape[0]
        notes = ["lln: exact linear margin certificate, float64"]
        if not exact:
            notes.append(HEURISTIC_NOTE.format(k=top_k, c=num_classes - 1))
        return CertifyResult(
            predictions=pred.cpu(),
            radius=radius.cpu(),
            exact_classes=exact,
            notes=notes,
            stats={"inputs": int(y.shape[0])},
        )


    def export_certificate(self, head: nn.Module):
        """``lip export --certify``: this certificate as plain float64 torch operations
        (:class:`LLNRadius`, the same arithmetic as :func:`lln_radius` over all classes, with
        ``Ŵ``, ``b`` and the rounding-safe row distances as constants)."""
        weight, bias = linear_head_weights(head)
        module = LLNRadius(weight.cpu(), bias.cpu(), pairwise_row_distances(weight).cpu())
        return ExportedCertificate(
            module=module,
            reference=lambda features: self.certify(head, features).radius,
            kind=self.name,
            description="exact linear margin certificate of the LLN head over all classes "
            "(float64, rounding bounded and subtracted); equal to lip certify's",
        )


class LLNRadius(nn.Module):
    """Features ``(N, D)`` -> ``(predictions, radius float64)``: :func:`lln_radius` over all
    classes in plain torch operations (what ``lip export --certify`` writes)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, distances: torch.Tensor) -> None:
        super().__init__()
        w = weight.to(torch.float64)
        self.register_buffer("weight", w)
        self.register_buffer("bias", bias.to(torch.float64))
        self.register_buffer("row_norm", w.norm(dim=1))
        self.register_buffer("distances", distances.to(torch.float64))
        self.register_buffer("classes", torch.arange(w.shape[0]))
        self.dim = int(w.shape[1])

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = features.to(torch.float64)
        logits = y @ self.weight.T + self.bias
        pred = logits.argmax(dim=1)
        own = pred.unsqueeze(1)
        margin = logits.gather(1, own) - logits
        mag = y.norm(dim=1, keepdim=True) * self.row_norm + self.bias.abs()
        err = (self.dim + 4) * _U64 * (mag.gather(1, own) + mag)
        dist = self.distances.index_select(0, pred)
        ratio = (margin - err) / dist * (1 - 4 * _U64)
        inf = torch.full_like(ratio, float("inf"))
        ratio = torch.where(dist > 0, ratio, inf)
        ratio = torch.where(self.classes.unsqueeze(0) == own, inf, ratio)
        return pred, ratio.amin(dim=1).clamp_min(0.0)
