"""The ``ortho`` head: an orthogonal last layer, ``logits = W y + b`` with orthonormal rows.

The paper's public code (Singla & Feizi; ``--last-layer ortho``) ends LipConvnet with an
orthogonal convolution from the ``D`` features to the ``c`` classes: a ``D x D`` orthogonal
map of which ``c`` outputs are kept, i.e. a ``c x D`` matrix with orthonormal rows (for
``c <= D``; orthonormal columns for ``c > D``, the zero-padded case).  Here the same function
class is parametrised directly: a free ``c x D`` parameter ``weight = V`` and

    W = Q(V)  with  Vᵀ = Q R  the thin QR factorisation, signs fixed so that diag(R) > 0

(for ``c > D``: ``W = Q`` of ``V`` itself, orthonormal columns).  The positive-diagonal QR is
unique and smooth wherever ``V`` has full rank (LAPACK's raw QR flips signs discontinuously).
The QR runs in float64 and ``W`` is then rounded to float32: the matrix the head applies is
float32 by definition, whatever the module's dtype, so a float64 copy of the head (as the
``margin`` certificate evaluates it) applies the very same matrix.

Lipschitz constant: ``||W||₂ = 1`` in exact arithmetic; the float32 rounding moves it by
~1e-7.  :meth:`OrthoHead.lipschitz_upper_bound` returns a GUARANTEED bound on ``||W||₂`` of
the applied float32 matrix (:func:`lipcli.numerics.spectral.spectral_norm_upper_bound`, which covers
its own rounding), so nothing rests on the QR being exact.  Certified by the generic
``margin`` certificate (radius ``margin / (√2 · L)``); since ``||w_l - w_j|| = √2`` for
orthonormal rows, that equals lipcli's exact linear (``lln``) certificate up to ~1e-7.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.numerics.spectral import spectral_norm_upper_bound

#: tightness requested from the spectral-norm certificate (the Gram matrix is c x c)
_BOUND_RTOL = 1e-9


def orthonormalize(v: torch.Tensor) -> torch.Tensor:
    """Orthonormal rows (``rows <= cols``) or columns of ``v`` by the positive-diagonal QR,
    in float64."""
    v64 = v.to(torch.float64)
    wide = v64.shape[0] <= v64.shape[1]
    q, r = torch.linalg.qr(v64.T if wide else v64, mode="reduced")
    signs = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
    q = q * signs  # column k times sign(R_kk): R gets a positive diagonal
    return q.T if wide else q


class OrthoHead(nn.Module):
    """``logits = W y + b`` with ``W`` orthonormalised from the parameter ``weight``.

    Parameters ``weight`` (``num_classes x in_features``, standard normal / sqrt(D) init) and
    ``bias`` (zeros).  Weight decay (lipcli's trainer) applies to ``weight`` as for the LLN
    head, not to ``bias``.
    """

    no_weight_decay: tuple[str, ...] = ("bias",)

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        if in_features < 1 or num_classes < 1:
            raise ValueError(f"ortho head: bad sizes in_features={in_features}, num_classes={num_classes}")
        self.in_features = in_features
        self.num_classes = num_classes
        self.weight = nn.Parameter(torch.randn(num_classes, in_features) / math.sqrt(in_features))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def normalized_weight(self) -> torch.Tensor:
        """The float32 matrix the forward pass applies (orthonormal rows up to rounding); the
        name is the one lipcli's linear-head tools read (``lipcli.builtins.lln.certificate``)."""
        return orthonormalize(self.weight).to(torch.float32)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.linear(y, self.normalized_weight().to(y.dtype), self.bias.to(y.dtype))

    @torch.no_grad()
    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED upper bound on ``||W||₂`` of the applied float32 matrix (the l2
        Lipschitz constant of ``y -> logits``; the bias does not count)."""
        return spectral_norm_upper_bound(self.normalized_weight().double(), rtol=_BOUND_RTOL)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}"

    def export_module(self) -> nn.Module:
        """``lip export`` (:mod:`lipcli.sdk.export`): a plain linear map with the
        orthonormalised float32 ``W`` computed once (the matrix the forward pass applies, in
        the module's dtype) and the bias."""
        with torch.no_grad():
            return ExportedOrtho(self.normalized_weight().to(self.bias.dtype), self.bias)


class ExportedOrtho(nn.Module):
    """``y Wᵀ + b`` with ``W`` and ``b`` stored as buffers (what ``lip export`` writes)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone().contiguous())
        self.register_buffer("bias", bias.detach().clone().contiguous())

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return F.linear(y, self.weight, self.bias)
