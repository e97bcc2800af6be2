"""The ``lot`` head: the LOT authors' last layer without ``--lln`` (``lip_convnets.py``:
``last_layer = LOT(D, K, kernel_size=1)`` applied to the ``(N, D, 1, 1)`` features).

On a ``1 × 1`` image a 1×1 LOT layer is one matrix: the polar factor of its ``K × D`` filter by
the same Newton–Schulz iterations as every LOT layer (:func:`lipcli_lot.lot.lot_polar`).  So the head is the linear map
``logits = Ŵ y + b``, ``‖Ŵ‖₂ ≤ 1`` in exact arithmetic for any iteration count (``lot.py``).

Certified by lipcli's ``lln`` certificate, the exact distance to the decision boundary of a
linear head (``min_j (f_l − f_j)/‖ŵ_l − ŵ_j‖``), computed on :meth:`LOTHead.normalized_weight`:
the matrix the forward pass applies.  That matrix is float32 by definition (computed from the
float32 weight whatever the module's dtype), so a float64 copy of the head applies the very
same matrix.  :meth:`LOTHead.lipschitz_upper_bound` is the verified bound of that matrix
(:func:`lipcli_lot.lot.polar_norm_upper_bound`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .lot import lot_polar, polar_norm_upper_bound


class LOTHead(nn.Module):
    """``logits = Ŵ y + b`` with ``Ŵ`` LOT's polar factor of the parameter ``weight``
    (``num_classes × in_features``, initialised as ``nn.Conv2d``'s 1×1 filter, as the authors'
    head is) and ``bias``."""

    no_weight_decay: tuple[str, ...] = ("bias",)

    def __init__(self, in_features: int, num_classes: int, iterations: int = 10, eps: float = 1e-4) -> None:
        super().__init__()
        self.in_features, self.num_classes = int(in_features), int(num_classes)
        self.iterations, self.eps = int(iterations), float(eps)
        layer = nn.Linear(self.in_features, self.num_classes)  # nn.Conv2d's 1x1 initialisation
        self.weight = nn.Parameter(layer.weight.detach().clone())
        self.bias = nn.Parameter(layer.bias.detach().clone())

    def normalized_weight(self) -> Tensor:
        """``Ŵ`` (float32): the matrix the forward pass applies (the name lipcli's linear-head
        certificate reads)."""
        return lot_polar(self.weight.float(), self.iterations, self.eps)

    def forward(self, y: Tensor) -> Tensor:
        return F.linear(y, self.normalized_weight().to(y.dtype), self.bias.to(y.dtype))

    @torch.no_grad()
    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound on ``‖Ŵ‖₂`` of the applied float32 matrix (the bias does not count)."""
        return polar_norm_upper_bound(self.normalized_weight()[None])

    def export_module(self) -> nn.Module:
        """``lip export``: a plain ``nn.Linear`` holding ``Ŵ`` (computed once) and the bias."""
        layer = nn.Linear(self.in_features, self.num_classes).to(self.bias.dtype)
        with torch.no_grad():
            layer.weight.copy_(self.normalized_weight())
            layer.bias.copy_(self.bias)
        return layer.requires_grad_(False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_classes={self.num_classes}, "
                f"iterations={self.iterations}, eps={self.eps:g}")
