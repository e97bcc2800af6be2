"""The CRC-Lip certificate as ``lip export --certify`` writes it: the closed form.

The exported program cannot run the dual (CRC) solve (an iterative, data-dependent search),
so it computes the **closed-form** certificate of :mod:`lipcli.builtins.crc.closed_form` (SPEC §4):
per competing class ``j`` of the float64 prediction ``l``,

    r_lj = 2 g_lo / (√(‖∇g‖_hi² + 2 m_lj g_lo) + ‖∇g‖_hi),     radius = min_j r_lj,

with the same float64 rounding bounds (``g_lo`` a lower bound on the margin, ``‖∇g‖_hi`` an
upper bound on its gradient norm) and the **guaranteed** curvature bounds ``m_lj``
(:class:`~lipcli.builtins.crc.bounds.CurvatureBounds`) computed at export time and stored in
the program as a ``c × c`` table.  Since ``lip certify`` takes per pair the larger of this
value and the dual one, the exported radius is a lower bound of ``lip certify``'s, and equal
to what ``CRCCertifier(dual=False)`` gives with the same bounds.

Bounds computed at export: ``‖W₁‖₂²`` and the class-split bounds (``2c`` verified eigenvalue
bounds), and the exact per-pair bounds when the head has at most
:data:`EXACT_PAIRS_MAX_CLASSES` classes (``c(c−1)`` more); never read from the model file.

Softplus and sigmoid are evaluated by the target runtime (ONNX has no ``log1p``: the
exporter writes ``log(1 + e⁻|ᶻ|)``, whose absolute error, a few units of 1e-16, is inside
the ``8u(σ + 1)`` per-unit allowance of the bounds).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn

from lipcli.builtins.crc.bounds import CurvatureBounds
from lipcli.builtins.crc.closed_form import closed_form_radius, pair_margins
from lipcli.builtins.crc.weights import mlp_weights
from lipcli.sdk.certificates import make_cache
from lipcli.sdk.export import ExportedCertificate

#: heads with at most this many classes get exact per-pair curvature bounds at export
EXACT_PAIRS_MAX_CLASSES = 10


class CRCClosedForm(nn.Module):
    """Features ``(N, D)`` -> ``(predictions, radius float64)``: the closed-form CRC-Lip
    certificate over all classes in plain torch operations (see the module docstring)."""

    def __init__(self, head: nn.Module, table: torch.Tensor, w1_sq_bound: float) -> None:
        super().__init__()
        w = mlp_weights(head)
        for name in ("w1", "b1", "w2", "b2", "w1_row_norm", "w2_abs", "w2_row_norm"):
            self.register_buffer(name, getattr(w, name).detach().cpu().clone())
        # curvature[l, j] = m_lj = Λ(j, l) = table[j, l]
        self.register_buffer("curvature", table.detach().to(torch.float64).cpu().T.contiguous())
        self.register_buffer("classes", torch.arange(w.num_classes))
        self.hidden, self.dim = w.hidden, w.dim
        self.w1_frob = float(w.w1_frob)
        self.w1_sq_bound = float(w1_sq_bound)

    def _pair_gradients(self, s1: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """‖∇g_lj(y)‖ ``(B, c)``, as the certifier computes it but in one batch (no loop whose
        length depends on the batch size, which would not trace)."""
        diff = (self.w2.index_select(0, pred).unsqueeze(1) - self.w2.unsqueeze(0)) * s1.unsqueeze(1)
        return (diff @ self.w1).norm(dim=2)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = pair_margins(self, features.to(torch.float64), self.w1_sq_bound, self._pair_gradients)
        r = closed_form_radius(t.g_lo, t.gn_hi, self.curvature.index_select(0, t.pred))
        r = torch.where(self.classes.unsqueeze(0) == t.pred.unsqueeze(1), torch.full_like(r, math.inf), r)
        radius = r.amin(dim=1)
        radius = torch.where(torch.isnan(radius), torch.zeros_like(radius), radius)
        return t.pred, radius.clamp_min(0.0)


def export_crc_certificate(head: nn.Module, closed_form_certifier: Callable[[], Any]) -> ExportedCertificate:
    """The :class:`~lipcli.sdk.export.ExportedCertificate` of a CRC-Lip head;
    ``closed_form_certifier()`` makes lipcli's own closed-form certifier (``CRCCertifier(
    curvature="global", dual=False, trust_cache=True)``, passed in by the certifier so that
    this module does not import it back), the reference the exported one is compared with."""
    weights = mlp_weights(head)
    w1_sq = CurvatureBounds.compute_w1_sq_bound(weights)
    weights.w1_sq_bound = w1_sq
    bounds = CurvatureBounds(weights, w1_sq)
    bounds.compute_class_bounds()
    c = weights.num_classes
    exact = c <= EXACT_PAIRS_MAX_CLASSES
    if exact:
        for a in range(c):
            for b in range(c):
                if a != b:
                    bounds.compute_exact(a, b)
    cache = make_cache("crc-lip", head, **bounds.to_cache())
    module = CRCClosedForm(head, bounds.table, w1_sq)

    def reference(features: torch.Tensor) -> torch.Tensor:
        # lipcli's own closed form with exactly these (just computed, so trusted) bounds
        certifier = closed_form_certifier()
        certifier.prepare(head, dict(cache))
        return certifier.certify(head, features).radius

    level = "exact per-pair" if exact else "class-split"
    return ExportedCertificate(
        module=module,
        reference=reference,
        kind="crc-lip",
        description=(
            "closed-form CRC-Lip certificate over all classes with guaranteed (verified) "
            f"{level} curvature bounds, float64 with rounding bounds; a lower bound of lip "
            "certify's (which also runs the dual solve)"
        ),
        record={
            "form": "closed",
            "curvature_level": level,
            "w1_sq_bound": w1_sq,
        },
    )
