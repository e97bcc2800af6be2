"""The layers of the BRONet authors' backbone network (``bronet/`` of ntuaislab/BRONet, commit
9d59c9bd15e8) around its BRO convolutions, each with a guaranteed Lipschitz bound
(``lipschitz_upper_bound()``) computed from the very float tensors its forward pass applies.

:class:`StemConv`
    The authors' first layer (``bronet/models/stem.py``): a free ``k × k`` convolution with
    stride 2, zero padding ``k//2`` and a bias (orthogonal initialisation).  Not 1-Lipschitz by
    construction: the authors bound it by power iteration (an estimate).  Here the bound is
    proven: a stride-2 convolution keeps a subset of the outputs of the stride-1 "same"
    convolution with the same filter (a coordinate projection, norm ≤ 1), so
    ``lipcli.numerics.conv.conv_spectral_norm_upper_bound`` of the filter bounds it; so does the
    bound of the equivalent stride-1 filter on the space-to-depth input
    (:func:`space_to_depth_filter`: ``pixel_unshuffle(2)`` is a permutation, and the stride-2
    convolution is exactly the zero-padded "same" convolution of that ``4·in``-channel filter).
    Given the image size, a third, tight bound (:func:`torus_conv_norm_upper_bound` of that
    stride-1 filter: a certified bound on the norm of the circular convolution on the torus
    that contains the zero-padded image) is computed too.  The smallest is used.
    :meth:`StemConv.lipschitz_training_estimate` is the
    authors' power iteration (one step per call, vector kept), for training losses only.
:class:`CholeskyLinear` and :class:`CholeskyPatchConv`
    The authors' Cholesky-orthogonalised dense layers (``bronet/models/dense.py``,
    ``LiResMLP``; ``bronet/models/neck.py``, ``Map2Vec`` with ``cholesky``): the matrix applied
    is ``W = L⁻¹X`` with ``LLᵀ = XXᵀ + ε I``, ``ε = ridge · mean(diag XXᵀ)`` (their ``1e-3``;
    :func:`cholesky_orthogonal`; their neck computes the same ``ε`` as a Python float,
    ``mean/1000``: equal to rounding).  Then ``WWᵀ = L⁻¹(LLᵀ − εI)L⁻ᵀ = I − ε(LLᵀ)⁻¹ ⪯ I``: a
    contraction in exact arithmetic; the bound is
    ``lipcli.numerics.spectral.spectral_norm_upper_bound`` of the float ``W`` used.  The patch
    convolution (``p × p`` filter, stride ``p``, no padding, no bias) acts on disjoint patches,
    so its norm is exactly that of its ``out × in·p²`` matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.numerics.conv import conv_spectral_norm_upper_bound
from lipcli.numerics.rounding import UNIT_ROUNDOFF, gamma, round_up
from lipcli.numerics.spectral import spectral_norm_upper_bound

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


def space_to_depth_filter(weight: Tensor) -> Tensor:
    """The stride-1 filter ``K'`` (``(out, 4·in, 2M+1, 2M+1)``, ``M = ⌈m/2⌉``) with
    ``conv(x, K, stride 2, padding m) = conv(pixel_unshuffle(x, 2), K', padding M)`` for an odd
    ``k = 2m + 1`` filter ``K`` and inputs of even side: tap offset ``d ∈ [−m, m]`` lands in
    block ``b = ⌊d/2⌋`` at phase ``q = d − 2b`` (channel ``4c + 2q_y + q_x``, as
    ``pixel_unshuffle`` orders them)."""
    out, cin, k, _ = weight.shape
    m = k // 2
    M = (m + 1) // 2
    result = weight.new_zeros(out, 4 * cin, 2 * M + 1, 2 * M + 1)
    for a in range(k):
        by, qy = divmod(a - m, 2)
        for b in range(k):
            bx, qx = divmod(b - m, 2)
            result[:, 2 * qy + qx::4, by + M, bx + M] = weight[:, :, a, b]
    return result


def torus_conv_norm_upper_bound(kernel: Tensor, size: tuple[int, int]) -> float:
    """Guaranteed upper bound on the norm of the zero-padded "same" convolution with ``kernel``
    (``(o, i, kh, kw)``, odd taps) on ``size`` images.

    The zero-padded convolution is ``Π C E`` with ``E`` the zero embedding into the torus
    ``Z_N × Z_M`` (``N = n + kh − 1``, ``M = m + kw − 1``: no wrap-around reaches a non-zero
    pixel), ``C`` the circular convolution there and ``Π`` a coordinate projection, so its norm
    is at most ``‖C‖₂ = max_f ‖K̂(f)‖₂`` over the torus frequencies (``K̂(−f) = conj K̂(f)``:
    ``f₂ ≤ M/2`` suffices).  ``K̂(f)`` is formed in float64 from the angle
    ``2π(m₁/N + m₂/M)`` with the integers ``m₁ = f₁δ_y mod N``, ``m₂ = f₂δ_x mod M`` reduced
    exactly: the angle (below ``4π``) is off by at most ``50u`` and a 1-ulp ``cos``/``sin``
    adds ``2u``, so each is within ``256u`` of the exact value; each entry is a length-``T``
    sum, so ``‖K̂ − K̂_computed‖₂ ≤ δ = 2(γ_T + 256u)(1 + γ_T)‖A‖_F``, ``A = Σ_δ |K_δ|``.
    ``‖K̂_computed(f)‖₂`` is that of its exact real form ``[[Re, −Im], [Im, Re]]``, bounded by
    :func:`~lipcli.numerics.spectral.spectral_norm_upper_bound`; the result is the largest
    ``bound + δ``, rounded up.  Cost: ``N·(M/2 + 1)`` small Gram certificates."""
    K = kernel.detach().to(torch.float64).cpu()
    o, i, kh, kw = K.shape
    N, M = size[0] + kh - 1, size[1] + kw - 1
    f1 = torch.arange(N, dtype=torch.int64)[:, None, None, None]
    f2 = torch.arange(M // 2 + 1, dtype=torch.int64)[None, :, None, None]
    dy = (torch.arange(kh, dtype=torch.int64) - kh // 2)[None, None, :, None]
    dx = (torch.arange(kw, dtype=torch.int64) - kw // 2)[None, None, None, :]
    angle = (2 * math.pi) * (torch.remainder(f1 * dy, N).double() / N + torch.remainder(f2 * dx, M).double() / M)
    re = torch.einsum("yxab,oiab->yxoi", torch.cos(angle), K).reshape(-1, o, i)
    im = torch.einsum("yxab,oiab->yxoi", torch.sin(angle), K).reshape(-1, o, i)
    taps = kh * kw
    delta = 2.0 * (gamma(taps) + 256 * UNIT_ROUNDOFF) * (1.0 + gamma(taps))
    delta *= float(K.abs().sum(dim=(2, 3)).norm()) * (1.0 + 1e-10)
    worst = 0.0
    for r, m in zip(re, im):
        real_form = torch.cat((torch.cat((r, -m), dim=1), torch.cat((m, r), dim=1)), dim=0)
        worst = max(worst, spectral_norm_upper_bound(real_form))
    return round_up(round_up(worst + delta))


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


class StemConv(_CachedBound):
    """The authors' stem convolution: ``(N, in, S, S) → (N, out, S/2, S/2)`` (module docstring)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 5,
                 image_size: tuple[int, int] | None = None) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"the stem's kernel size must be odd, got {kernel_size}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        #: the input size the tight bound is for (``None``: the filter-only bounds)
        self.image_size = None if image_size is None else (int(image_size[0]), int(image_size[1]))
        weight = torch.empty(out_channels, in_channels, kernel_size, kernel_size)
        nn.init.orthogonal_(weight)  # as the authors' Conv2d
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.register_buffer("power_v", torch.empty(0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] % 2 or x.shape[-2] % 2:
            raise ValueError(f"the stem needs an even image side, got {tuple(x.shape[-2:])}")
        if self.image_size is not None and tuple(x.shape[-2:]) != self.image_size:
            raise ValueError(f"the stem is bounded for {self.image_size} images, got {tuple(x.shape[-2:])}")
        return F.conv2d(x, self.weight, self.bias, stride=2, padding=self.kernel_size // 2)

    def _bound(self) -> float:
        w = self.weight.detach()
        s2d = space_to_depth_filter(w)
        bounds = [conv_spectral_norm_upper_bound(w), conv_spectral_norm_upper_bound(s2d)]
        if self.image_size is not None:
            bounds.append(torus_conv_norm_upper_bound(s2d, (self.image_size[0] // 2, self.image_size[1] // 2)))
        return min(bounds)

    def export_module(self) -> nn.Module:
        """``lip export``: ``nn.Conv2d`` with this filter and bias (plain torch)."""
        k = self.kernel_size
        conv = nn.Conv2d(self.in_channels, self.out_channels, k, stride=2, padding=k // 2)
        with torch.no_grad():
            conv.weight.copy_(self.weight)
            conv.bias.copy_(self.bias)
        return conv.to(self.weight.dtype)

    def lipschitz_training_estimate(self, image_size: tuple[int, int]) -> Tensor:
        """The authors' estimate (``layers/conv.py``, ``Conv2d.lipschitz``): one power step on
        the stride-2 map from the kept vector, then ``‖K v‖`` (differentiable in ``K``).  An
        ESTIMATE (it can be below the norm): it only feeds training losses."""
        p = self.kernel_size // 2
        v = self.power_v
        if v.shape != (1, self.in_channels, *image_size) or v.device != self.weight.device:
            v = torch.ones(1, self.in_channels, *image_size, dtype=self.weight.dtype, device=self.weight.device)
        with torch.no_grad():
            u = F.conv2d(v, self.weight, stride=2, padding=p)
            extra = [s - ((o - 1) * 2 - 2 * p + self.kernel_size) for s, o in zip(image_size, u.shape[-2:])]
            v = F.normalize(F.conv_transpose2d(u, self.weight, stride=2, padding=p, output_padding=tuple(extra)),
                            dim=(1, 2, 3))
        self.power_v = v
        return F.conv2d(v, self.weight, stride=2, padding=p).norm()

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride=2"


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
