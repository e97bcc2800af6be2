"""BCOP: block convolution orthogonal parametrisation (Li, Haghighi, Kuo, Grosse, Jacobsen,
*Preventing Gradient Attenuation in Lipschitz Constrained Convolutional Networks*,
NeurIPS 2019).

Maths:

* A convolution is *orthogonal* (on every torus, and on infinite signals) iff its filter's
  symbol ``K(z) = Σ_{a,b} K[:, :, a, b] z_y^a z_x^b`` is unitary on the unit torus
  (*paraunitary*).  Products of paraunitary symbols are paraunitary.
* Building blocks: an orthogonal ``c × c`` matrix ``H`` (``1 × 1`` filter) and, for a
  symmetric projector ``P = VVᵀ`` (``V`` with orthonormal columns), the two-tap block
  convolutions ``[P, I − P]`` along x (symbol ``P + (I − P) z_x``) and ``[Q; I − Q]`` along y.
  Each is unitary for ``|z| = 1`` because ``P`` and ``I − P`` are complementary orthogonal
  projectors.  BCOP's ``k × k`` filter is
  ``K(z) = H · Π_{t<k−1} (P_t + (I − P_t) z_x)(Q_t + (I − Q_t) z_y)``
  (``k − 1`` blocks per axis, projectors of rank ``c/2`` as in the paper).  The family is
  not known to contain every orthogonal ``k × k`` convolution in 2-D; the paper shows that
  the largest connected component of BCOP on ``2c`` channels represents every BCOP
  convolution on ``c`` channels.
* Orthogonal matrices come from Björck's iteration (order 1)
  ``A ← A (I + ½(I − AᵀA))``; it converges to the orthogonal polar factor from any start
  whose singular values lie in ``(0, √3)``.  Eval starts at ``M/‖M‖_F``; training, as the
  original code, at ``M/σ̂`` (``σ̂`` a power-iteration estimate of ``‖M‖₂``, never below
  ``U/1.7`` for a guaranteed ``U ≥ ‖M‖₂``, so every singular value is ``≤ 1.7 < √3`` and the
  largest is near 1): from ``M/‖M‖_F`` the small singular values of a Gaussian ``64 × 64``
  matrix were still far from 1 after 20 steps (defect ``‖AᵀA − I‖_F = 0.16``).  The map
  ``s ↦ s(3 − s²)/2`` sends ``[0, √3]`` into ``[0, 1]``: after the first step every
  singular value is ``≤ 1``, so
  ``P = VVᵀ`` has eigenvalues in ``[0, 1]`` and each block still has norm ``≤ 1`` (a convex
  combination ``λ + (1 − λ)z`` per eigenvector) — the layer is 1-Lipschitz in exact
  arithmetic even when Björck has not converged, and orthogonal when it has.
* ``in ≠ out`` (as in the paper's code): an orthogonal filter on ``c = max(in·s², out)``
  channels, truncated to ``K[:out, :in·s²]`` (zero-padding the input, dropping outputs:
  semi-orthogonal).  Stride 2: ``pixel_unshuffle`` (a permutation) first, as lipcli's SOC.
* Padding: *circular*, so the operator is exactly the paraunitary symbol sampled at the
  torus' frequencies (orthogonal for every image size, ``1 × 1`` included); with zero padding
  an orthogonal filter is only 1-Lipschitz (not norm-preserving at the borders).

What is proven, and what is bounded: Björck's iteration runs at least ``bjorck_iters`` steps
in training and then on until converged (defect ``≤ √u``, plus one step unless it is already below ``n·u``; at most
:data:`TRAIN_MAX_ITERS`; measured defect ``≤ 2e-6`` in float32, ``4e-15`` in float64 for
Gaussian ``64 × 64`` matrices), and at convergence in eval mode (run in float64, then the
filter is cast to the parameters' dtype), so orthogonality holds only up to its convergence
and rounding.  The spec therefore promises nothing; ``lipschitz_upper_bound()`` certifies the
filter as used with :func:`lipcli.numerics.gram_bounds.conv_gram_norm_upper_bound` (for an orthogonal
filter ``√(1 + Σ_δ ‖KᵀK[δ] − I·[δ = 0]‖_F)`` is the tight one, every rounding covered):
``1 + O(1e-6)`` for float32 filters, ``1 + O(1e-12)`` in float64.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.sdk.convbase import LipConvBase
from lipcli.sdk.lowering import LinearMap
from lipcli.sdk.lowering_conv import circular_conv_matrix, dense_lowering_at_gain, literal_facts
from lipcli.numerics.gram_bounds import conv_gram_norm_upper_bound

#: eval-mode Björck: stop when ``‖AᵀA − I‖_F`` (float64) is below this, at most
#: :data:`EVAL_MAX_ITERS` steps
EVAL_TOL = 1e-13
EVAL_MAX_ITERS = 200
#: training-mode Björck: at most this many steps (:func:`bjorck_train`)
TRAIN_MAX_ITERS = 100


def _frobenius_start(M: Tensor) -> Tensor:
    """``M/‖M‖_F`` per matrix of a batch (a zero matrix stays zero)."""
    norm = torch.linalg.matrix_norm(M, ord="fro", keepdim=True)
    return M / norm.clamp_min(torch.finfo(M.dtype).tiny)


#: power-iteration steps estimating ``‖M‖₂`` for the training start (as the original code)
POWER_STEPS = 20
#: the training start divides by at least ``U/START_CAP`` with ``U ≥ ‖M‖₂`` (:func:`_norm_cap`),
#: so its singular values stay below ``START_CAP < √3`` (Björck's convergence region) whatever
#: the power-iteration estimate
START_CAP = 1.7


@torch.no_grad()
def spectral_norm_estimate(M: Tensor, steps: int = POWER_STEPS) -> Tensor:
    """Power-iteration estimate (``≤ ‖M‖₂``, shape ``(..., 1, 1)``) of the largest singular
    value of each matrix of a batch, from a fixed-seed start (the global RNG is untouched)."""
    M = M.detach()
    gen = torch.Generator(device="cpu").manual_seed(0)
    v = torch.randn((*M.shape[:-2], M.shape[-1], 1), generator=gen, dtype=M.dtype).to(M.device)
    tiny = torch.finfo(M.dtype).tiny
    sigma = torch.zeros((*M.shape[:-2], 1, 1), dtype=M.dtype, device=M.device)
    for _ in range(steps):
        v = v / torch.linalg.vector_norm(v, dim=-2, keepdim=True).clamp_min(tiny)
        u = M @ v
        u = u / torch.linalg.vector_norm(u, dim=-2, keepdim=True).clamp_min(tiny)
        v = M.mT @ u
        sigma = torch.linalg.vector_norm(v, dim=-2, keepdim=True)  # uᵀMv, v ∥ Mᵀu
    return sigma


@torch.no_grad()
def _norm_cap(M: Tensor) -> Tensor:
    """``U = ‖M‖_F·‖G⁸‖_F^{1/16}`` with ``G = NᵀN``, ``N = M/‖M‖_F``: at least ``‖M‖₂`` (in exact
    arithmetic ``λ_max(G)⁸ ≤ ‖G⁸‖_F``) and at most ``p^{1/16}·‖M‖₂`` (``p`` the order of
    ``G``: 1.30 for 64, 1.54 for 1024), shape ``(..., 1, 1)``."""
    M = M.detach()
    fro = torch.linalg.matrix_norm(M, ord="fro", keepdim=True)
    N = M / fro.clamp_min(torch.finfo(M.dtype).tiny)
    G = N.mT @ N if M.shape[-2] >= M.shape[-1] else N @ N.mT
    for _ in range(3):
        G = G @ G
    return fro * torch.linalg.matrix_norm(G, ord="fro", keepdim=True) ** (1.0 / 16.0)


def _spectral_start(M: Tensor) -> Tensor:
    """Training start ``M/d`` with ``d = max(σ̂, U/START_CAP)`` (``σ̂ ≤ ‖M‖₂`` the power-iteration
    estimate, ``U ≥ ‖M‖₂`` from :func:`_norm_cap`; ``d`` detached, as in the original BCOP
    code: the polar factor does not depend on the scale).  Singular values in
    ``[0, START_CAP]``, the largest near 1 (not ``‖M‖₂/‖M‖_F``), so the small ones need far
    fewer steps than from ``M/‖M‖_F``."""
    with torch.no_grad():
        d = torch.maximum(spectral_norm_estimate(M), _norm_cap(M) / START_CAP)
    return M / d.clamp_min(torch.finfo(M.dtype).tiny)


def bjorck(M: Tensor, iters: int) -> Tensor:
    """``iters`` order-1 Björck steps (batch ``(..., m, n)``, ``m ≥ n``) from the spectral
    start :func:`_spectral_start`: tends to the orthogonal polar factor (orthonormal
    columns); differentiable.  Used in training; eval (:func:`bjorck_converged`) iterates
    to convergence from ``M/‖M‖_F``."""
    A = _spectral_start(M)
    for _ in range(iters):
        A = 1.5 * A - 0.5 * A @ (A.mT @ A)
    return A


def bjorck_train(M: Tensor, min_iters: int) -> Tensor:
    """The training polar factor: :func:`bjorck` for ``min_iters`` steps, then more steps
    while the orthogonality defect ``max ‖AᵀA − I‖_F`` exceeds ``√u`` (``u`` the dtype's
    rounding unit), at most :data:`TRAIN_MAX_ITERS` in all, then one final step (Björck
    converges quadratically: from ``√u`` one step reaches rounding level) unless the defect
    is already below ``n·u`` (rounding level).  So the trained
    filter is the orthogonal one that eval certifies (up to rounding), not an unconverged
    iterate; differentiable (the stopping test is not)."""
    A = bjorck(M, min_iters)
    if A.numel() == 0:
        return A
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    tol = torch.finfo(A.dtype).eps ** 0.5
    floor = torch.finfo(A.dtype).eps * A.shape[-1]  # n·u: rounding level of the defect
    for _ in range(max(0, TRAIN_MAX_ITERS - min_iters)):
        gram = A.mT @ A
        defect = float(torch.linalg.matrix_norm(gram.detach() - eye).max())
        if defect <= floor:
            break  # at rounding level already: another step would not help
        A = 1.5 * A - 0.5 * A @ gram
        if defect <= tol:
            break  # quadratic convergence: this step reached rounding level
    return A


@torch.no_grad()
def bjorck_converged(M: Tensor) -> Tensor:
    """Björck's iteration in float64 until ``max ‖AᵀA − I‖_F ≤ EVAL_TOL`` (at most
    :data:`EVAL_MAX_ITERS` steps); returned in float64."""
    A = _frobenius_start(M.detach().to(torch.float64))
    if A.numel() == 0:
        return A
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    for _ in range(EVAL_MAX_ITERS):
        gram = A.mT @ A
        if float(torch.linalg.matrix_norm(gram - eye).max()) <= EVAL_TOL:
            break
        A = 1.5 * A - 0.5 * A @ gram
    return A


#: ``taps``: lipcli's ``H·Π`` filter as it is, or the BCOP authors' layout (transposed taps when
#: ``in·s² ≤ out``: their ``convolution_orthogonal_generator_projs``)
TAPS = ("lipcli", "authors")


def bcop_kernel(H: Tensor, Vx: Tensor, Vy: Tensor) -> Tensor:
    """The filter ``H · Π_t (P_t + (I − P_t) z_x)(Q_t + (I − Q_t) z_y)`` as a tensor
    ``(c, c, k, k)``, ``k = 1 + len(Vx)``, with ``P_t = Vx[t] Vx[t]ᵀ``, ``Q_t = Vy[t] Vy[t]ᵀ``."""
    K = H[:, :, None, None]
    for V, axis in [(v, ax) for pair in zip(Vx, Vy) for v, ax in zip(pair, ("x", "y"))]:
        KP = torch.einsum("oiab,ir,jr->ojab", K, V, V)  # K·P without forming P
        if axis == "x":
            K = F.pad(KP, (0, 1, 0, 0)) + F.pad(K - KP, (1, 0, 0, 0))
        else:
            K = F.pad(KP, (0, 0, 0, 1)) + F.pad(K - KP, (0, 0, 1, 0))
    return K


class BCOPConv(LipConvBase):
    """BCOP convolution ``(N, in, H, W) → (N, out, H/s, W/s)``, circular padding.

    Parameters ``ortho`` (``c × c``, orthogonal init), ``proj_x``/``proj_y``
    (``(k−1) × c × r`` with ``r = max(1, c//2)``, orthonormal-column init) and ``bias``;
    ``c = max(in·s², out)``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 *, bjorck_iters: int = 20, taps: str = "lipcli") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        if bjorck_iters < 1:
            raise ValueError(f"bjorck_iters must be at least 1, got {bjorck_iters}")
        if taps not in TAPS:
            raise ValueError(f"taps must be one of {', '.join(TAPS)}, got {taps!r}")
        self.bjorck_iters = int(bjorck_iters)
        #: "authors": every tap's matrix transposed when ``in·s² ≤ out`` (:func:`_authors_taps`)
        self.taps = taps
        c = max(self.conv_in_channels, self.out_channels)
        r = max(1, c // 2)
        self.channels = c
        blocks = self.kernel_size - 1
        self.ortho = nn.Parameter(nn.init.orthogonal_(torch.empty(c, c)))
        self.proj_x = nn.Parameter(torch.stack([nn.init.orthogonal_(torch.empty(c, r)) for _ in range(blocks)])
                                   if blocks else torch.empty(0, c, r))
        self.proj_y = nn.Parameter(torch.stack([nn.init.orthogonal_(torch.empty(c, r)) for _ in range(blocks)])
                                   if blocks else torch.empty(0, c, r))

    #: eval mode always uses the cached converged filter (no gradient to the parameters)
    eval_grad_to_params = False

    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        """The training filter ``(out, in·s², k, k)``: Björck (:func:`bjorck_train`) for at
        least ``bjorck_iters`` steps, then to convergence."""
        H = bjorck_train(self.ortho, self.bjorck_iters)
        Vx = bjorck_train(self.proj_x, self.bjorck_iters)
        Vy = bjorck_train(self.proj_y, self.bjorck_iters)
        return self._taps(bcop_kernel(H, Vx, Vy))[: self.out_channels, : self.conv_in_channels]

    def operator_settings(self) -> tuple:
        return (self.taps,)

    def _taps(self, K: Tensor) -> Tensor:
        """``taps="authors"`` and ``in·s² ≤ out``: the filter of ``K(z)ᵀ`` (paraunitary as
        ``K(z)``: ``K(z)ᵀ = K(z̄)ᴴ`` for a real filter), the layout of the BCOP authors' code."""
        if self.taps == "authors" and self.conv_in_channels <= self.out_channels:
            return K.transpose(0, 1)
        return K

    def compute_eval_operator(self, size: tuple[int, int] | None) -> Tensor:
        """The eval filter: Björck to convergence in float64, cast to the parameters' dtype
        (cached by the base class; the bound is computed for it)."""
        H, Vx, Vy = (bjorck_converged(p) for p in (self.ortho, self.proj_x, self.proj_y))
        K = self._taps(bcop_kernel(H, Vx, Vy)).to(self.ortho.dtype)
        return K[: self.out_channels, : self.conv_in_channels].contiguous()

    def apply_operator(self, x: Tensor, op: Tensor) -> Tensor:
        N, C, H, W = x.shape
        if op.shape[-1] == 1:
            if H == 1 and W == 1:
                return F.linear(x.reshape(N, C), op.view(op.shape[0], C)).view(N, -1, 1, 1)
            return F.conv2d(x, op)
        p = self.kernel_size // 2
        if p <= H and p <= W:
            return F.conv2d(F.pad(x, (p, p, p, p), mode="circular"), op)
        rows = torch.arange(-p, H + p, device=x.device) % H  # wraps more than once
        cols = torch.arange(-p, W + p, device=x.device) % W
        return F.conv2d(x[:, :, rows][:, :, :, cols], op)

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        return conv_gram_norm_upper_bound(op)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", bjorck_iters={self.bjorck_iters}" + (
            f", taps={self.taps}" if self.taps != "lipcli" else "")

    # ------------------------------------------------------------------ eval lowering
    def eval_linear_map(self, input_shape: tuple[int, ...]) -> LinearMap | None:
        """The eval map on inputs of ``input_shape`` (``(in, H, W)``) as a dense float64
        matrix (:mod:`lipcli.sdk.lowering`): the block-circulant matrix of the circular
        convolution with the cached eval filter (the very tensor
        :meth:`lipschitz_upper_bound` bounds), its entries copies of the filter's taps (sums
        of the taps that alias when the filter is wider than the image), columns permuted
        for stride 2 (:func:`lipcli.sdk.lowering_conv.circular_conv_matrix`; ``error`` is
        ``0`` unless taps alias, then the float64 rounding of those sums)."""
        shape = tuple(int(d) for d in input_shape)
        s = self.stride
        if len(shape) != 3 or shape[0] != self.in_channels or shape[1] % s or shape[2] % s:
            return None
        size = (shape[1] // s, shape[2] // s)
        with torch.no_grad():
            matrix, error = circular_conv_matrix(self.eval_operator(None), size, self.in_channels, s)
        return LinearMap(matrix, self.bias.detach(), (self.out_channels, *size), error, self.bias.dtype)

    def literal_flops(self, size: tuple[int, int]) -> int:
        """Operations per example of the circular convolution on the rearranged ``size``:
        ``2·k²·out·in·s²`` per pixel (the tap sum, ``k² = 1``, on ``1 × 1`` images)."""
        taps = 1 if size == (1, 1) else self.kernel_size**2
        return 2 * taps * self.out_channels * self.conv_in_channels * size[0] * size[1]

    def export_module(self, context: Any = None) -> nn.Module:
        """``lip export`` (:mod:`lipcli.sdk.export`) and the eval lowering: with ``context``,
        the dense matrix of :meth:`eval_linear_map` where it fits and pays
        (:func:`~lipcli.sdk.lowering_conv.dense_lowering_at_gain`); otherwise the eval filter (Björck
        converged, the cached one the layer applies and is bounded for) baked into a plain
        circular convolution."""
        from .export import ExportedBCOP

        facts: dict[str, Any] = {}
        if context is not None:
            shape = tuple(int(d) for d in context.input_shape)
            size = (shape[1] // self.stride, shape[2] // self.stride)
            out_shape = (self.out_channels, *size)
            flops = self.literal_flops(size)
            dense = dense_lowering_at_gain(self, context, flops, out_shape)
            if dense is not None:
                return dense
            facts = literal_facts("convolution", shape, out_shape, flops)
        with torch.no_grad():
            stand_in = ExportedBCOP(self.eval_operator(None), self.bias, stride=self.stride)
        if facts:
            stand_in.export_lowering = facts
        return stand_in
