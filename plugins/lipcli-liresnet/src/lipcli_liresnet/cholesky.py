"""The Cholesky-orthogonalised dense layers of LiResNet's authors (Hu et al., *Effectively
Leveraging Capacity for Improved Deterministic Robustness Certification*, ICLR 2024;
``hukkai/liresnet``: ``models/cholesky_grad.py``, the neck ``Map2Vec`` and the dense stack
``LiResMLP`` of ``models/model.py`` and ``models/blocks.py``), which the BRONet authors reuse
(``ntuaislab/BRONet``, ``bronet/models/neck.py``, ``bronet/models/dense.py``): lipcli's
``liresnet:layers=cholesky`` and lipcli-bro's ``bronet`` architectures build them.

:class:`CholeskyLinear` and :class:`CholeskyPatchConv` apply ``W = L⁻¹X`` with ``LLᵀ = XXᵀ + ε I``,
``ε = ridge · mean(diag XXᵀ)`` (the authors' ``1e-3``; :func:`cholesky_orthogonal`; their neck
computes the same ``ε`` as a Python float, ``mean/1000``: equal to rounding).  Then
``WWᵀ = L⁻¹(LLᵀ − εI)L⁻ᵀ = I − ε(LᵀL)⁻¹ ⪯ I`` (eigenvalues ``1 − ε/(λ_i(XXᵀ) + ε)``): a contraction in exact arithmetic; the bound
(``lipschitz_upper_bound()``) is :func:`lipcli.numerics.spectral.spectral_norm_upper_bound` of
the float ``W`` the forward pass applies.  The patch convolution (``p × p`` filter, stride ``p``,
no padding, no bias) acts on disjoint patches, so its norm is exactly that of its
``out × in·p²`` matrix.  With ``quasi_residual_scale = s`` a square :class:`CholeskyLinear`
orthogonalises ``X = I + (W ⊙ γ)·s`` (``LiResMLP``: ``W ~ N(0, 1)/n``, ``γ`` one per row, ``s`` =
(number of dense layers)^-1/2).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.spectral import spectral_norm_upper_bound

__all__ = ["AUTHORS_CHOLESKY_RIDGE", "CholeskyLinear", "CholeskyPatchConv", "cholesky_orthogonal"]

#: the authors' Cholesky regularisation (``cholesky_grad.py``: ``mean(diag)·1e-3``)
AUTHORS_CHOLESKY_RIDGE = 1e-3


def cholesky_orthogonal(X: Tensor, ridge: float = AUTHORS_CHOLESKY_RIDGE) -> Tensor:
    """``L⁻¹X`` with ``LLᵀ = XXᵀ + ridge·mean(diag XXᵀ)·I`` (batched over leading dimensions),
    in the order of operations of the authors' ``CholeskyOrthfn.forward``."""
    S = X @ X.mT
    eps = S.diagonal(dim1=-2, dim2=-1).mean(-1).mul(ridge)
    eye = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    S = S + eps[..., None, None] * eye
    L = torch.linalg.cholesky(S)
    return torch.linalg.solve_triangular(L, X, upper=False)


class _CachedBound(nn.Module):
    """Caches ``lipschitz_upper_bound()`` (and, in eval mode, the applied matrix) until a
    parameter changes (keyed by the parameters' version counters and storage)."""

    def _key(self) -> tuple:
        return tuple((p._version, p.data_ptr(), p.dtype, p.device) for p in self.parameters())

    def lipschitz_upper_bound(self) -> float:
        key = self._key()
        cached = getattr(self, "_bound_cache", None)
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = (key, float(self._bound()))
            self._bound_cache = cached
        return cached[1]

    def _bound(self) -> float:
        raise NotImplementedError


class _CholeskyMatrix(_CachedBound):
    """A parameter ``weight`` (``X``, ``(out, in)``) applied as :func:`cholesky_orthogonal`."""

    def __init__(self, out_features: int, in_features: int, ridge: float, scale: float) -> None:
        super().__init__()
        if not 0.0 < ridge < 1.0:
            raise ValueError(f"the Cholesky ridge must be in (0, 1), got {ridge}")
        self.ridge = float(ridge)
        weight = torch.randn(out_features, in_features) * scale
        if out_features == in_features:
            weight = weight + torch.eye(out_features)  # the authors' quasi-residual start
        self.weight = nn.Parameter(weight)

    def source(self) -> Tensor:
        """``X``, the matrix the Cholesky orthogonalisation acts on: ``weight`` (a subclass may
        parametrise it)."""
        return self.weight

    def matrix(self) -> Tensor:
        """The matrix applied (cached in eval mode until a parameter changes)."""
        if self.training and torch.is_grad_enabled():
            return cholesky_orthogonal(self.source(), self.ridge)
        key = self._key()
        cached = getattr(self, "_matrix_cache", None)
        if cached is None or cached[0] != key:
            with torch.no_grad():
                cached = (key, cholesky_orthogonal(self.source(), self.ridge))
            self._matrix_cache = cached
        return cached[1]

    def _bound(self) -> float:
        return spectral_norm_upper_bound(self.matrix().detach(), rtol=1e-5)


class CholeskyLinear(_CholeskyMatrix):
    """``x ↦ W x + b`` on ``(N, in)`` vectors, ``W`` Cholesky-orthogonalised (module docstring).

    With ``quasi_residual_scale = s`` (square layers; the authors' ``LiResMLP``) the matrix
    orthogonalised is ``X = I + (W ⊙ γ)·s`` with ``W`` (``weight``) started at ``N(0, 1)/D`` and
    ``γ`` (``gamma``, one per row) at 1, as their dense stack trains it (``s = n^-1/2`` for
    ``n`` layers); the bound is of the matrix applied, whatever ``X`` is."""

    def __init__(self, in_features: int, out_features: int, ridge: float = AUTHORS_CHOLESKY_RIDGE,
                 quasi_residual_scale: float | None = None) -> None:
        scale = 1.0 / in_features if in_features == out_features else in_features ** -0.5
        super().__init__(out_features, in_features, ridge, scale)
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.quasi_residual_scale = quasi_residual_scale
        if quasi_residual_scale is not None:
            if in_features != out_features or not 0.0 < quasi_residual_scale <= 1.0:
                raise ValueError("a quasi-residual Cholesky layer is square with a scale in (0, 1], got "
                                 f"{in_features} -> {out_features}, scale {quasi_residual_scale}")
            with torch.no_grad():
                self.weight.copy_(torch.randn(out_features, in_features) / in_features)
            self.gamma = nn.Parameter(torch.ones(out_features, 1))
            self.register_buffer("identity", torch.eye(out_features), persistent=False)

    def source(self) -> Tensor:
        if self.quasi_residual_scale is None:
            return self.weight
        return self.identity + self.weight * self.gamma * self.quasi_residual_scale

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.matrix(), self.bias)

    def export_module(self) -> nn.Module:
        """``lip export``: ``nn.Linear`` with the evaluation matrix and the bias baked in."""
        linear = nn.Linear(self.in_features, self.out_features).to(self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.matrix())
            linear.bias.copy_(self.bias)
        return linear

    def extra_repr(self) -> str:
        quasi = "" if self.quasi_residual_scale is None else f", quasi_residual scale={self.quasi_residual_scale:g}"
        return f"{self.in_features}, {self.out_features}, ridge={self.ridge:g}{quasi}"


class CholeskyPatchConv(_CholeskyMatrix):
    """The ``p × p`` stride-``p`` convolution ``C → C`` of the authors' neck, its filter the
    Cholesky-orthogonalised ``C × C·p²`` matrix (module docstring)."""

    def __init__(self, channels: int, patch: int, ridge: float = AUTHORS_CHOLESKY_RIDGE) -> None:
        if patch < 1:
            raise ValueError(f"the neck's patch size must be at least 1, got {patch}")
        super().__init__(channels, channels * patch * patch, ridge, 1.0 / (math.sqrt(channels) * patch))
        self.channels, self.patch = channels, patch

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] % self.patch or x.shape[-2] % self.patch:
            raise ValueError(f"the neck needs an image side divisible by {self.patch}, got {tuple(x.shape[-2:])}")
        c, p = self.channels, self.patch
        return F.conv2d(x, self.matrix().reshape(c, c, p, p), stride=p)

    def export_module(self) -> nn.Module:
        """``lip export``: ``nn.Conv2d`` (``p × p``, stride ``p``, no bias), the evaluation filter baked in."""
        c, p = self.channels, self.patch
        conv = nn.Conv2d(c, c, p, stride=p, bias=False).to(self.weight.dtype)
        with torch.no_grad():
            conv.weight.copy_(self.matrix().reshape(c, c, p, p))
        return conv

    def extra_repr(self) -> str:
        return f"{self.channels}, patch={self.patch}, ridge={self.ridge:g}"
