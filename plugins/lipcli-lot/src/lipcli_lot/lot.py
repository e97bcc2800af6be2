"""LOT convolution: the polar factor of the filter's matrix at every spatial frequency, by
Newton–Schulz iterations (Xu, Li & Li, *LOT: Layer-wise Orthogonal Training on Improving l2
Certified Robustness*, NeurIPS 2022, §3, Eq. (3)–(5) and Algorithm 1).

Maths:

* ``V`` is a learnable filter (``out × in·s² × k × k``); on the ``H × W`` torus its matrix
  at frequency ``f`` is ``V̂(f) ∈ ℂ^{out×in·s²}`` (:func:`lipcli.sdk.fourier.kernel_spectrum`).
* LOT's orthogonal matrix is the polar factor ``W = V̂(V̂ᴴV̂)^{-1/2}`` (``= (V̂V̂ᴴ)^{-1/2}V̂``):
  unitary for square full-rank ``V̂``, semi-orthogonal otherwise.  We use the smaller Gram
  matrix ``G`` (``V̂ᴴV̂`` when ``out ≥ in·s²``, else ``V̂V̂ᴴ``) and, as the authors' code,
  ``S = G + εI`` (``ε = 10⁻⁴``) normalised by ``n = ‖S‖_F + ε``.
* ``(S/n)^{-1/2}`` by the coupled Newton–Schulz iteration (Higham, *Functions of Matrices*,
  Eq. (6.35)): ``Y₀ = S/n``, ``Z₀ = I``,
  ``T_k = ½(3I − Z_kY_k)``, ``Y_{k+1} = Y_kT_k``, ``Z_{k+1} = T_kZ_k``; ``Z_k → (S/n)^{-1/2}``.
  ``T`` iterations (``iterations``, default 10 as the authors' code, in training and eval);
  then ``W = V̂Z_T/√n`` (or ``Z_TV̂/√n``).
* **Any iteration count gives ``‖W(f)‖₂ ≤ 1`` in exact arithmetic.**  ``Y_k, Z_k`` are
  polynomials in ``S`` (so they commute with it and each other) and ``Y_k = (S/n)Z_k``.
  On an eigenvector of ``S`` with eigenvalue ``λn`` (``0 < λ ≤ 1`` as ``n ≥ ‖S‖₂``),
  ``x_k = z_k y_k`` obeys ``x_{k+1} = x_k(3 − x_k)²/4``, which maps ``[0, 1]`` into itself
  (increasing, ``x = 1`` fixed), so ``x_T ≤ 1``; and
  ``WᴴW = Z_T(S − εI)Z_T/n ⪯ Z_T²S/n = x_T(S/n) ⪯ I``.  It is *orthogonal* only in the limit
  ``T → ∞`` and ``ε → 0`` (and for full-rank ``V̂``), so the spec promises nothing and the
  certificates use the verified bound below.
* The authors' code (``lot_ortho_conv.py``) always inverts the ``out × out`` matrix
  ``V̂V̂ᴴ + εI`` and forms ``Z_TV̂/√n``.  That is the same matrix as ours for every ``T``: the
  iterates are polynomials ``Z_T = p_T(S/n)``, and ``V̂·p(V̂ᴴV̂ + εI) = p(V̂V̂ᴴ + εI)·V̂`` for
  every polynomial ``p``; only ``n`` differs, ``‖V̂V̂ᴴ + εI‖_F² − ‖V̂ᴴV̂ + εI‖_F² =
  ε²(out − in·s²)``, a relative change below ``10⁻⁸`` of ``n`` (and float rounding: the
  authors' checkpoints import to their logits within ``10⁻⁵``, ``tests/test_lot_import.py``).
* ``border="zero"`` (the authors' form): pad the rearranged input with ``k//2`` zeros, apply
  the circular map on the padded torus, crop (:mod:`lipcli.sdk.fourier_border`): ``Π C E`` with
  ``‖E‖ = ‖Π‖ = 1``, so 1-Lipschitz whenever ``C`` is, with ``C``'s verified bound; not orthogonal.
* Stride 2: ``pixel_unshuffle(x, 2)`` (a permutation), then ``in·s² = 4·in`` channels;
  ``in ≠ out`` is the semi-orthogonal polar factor above.  ``1 × 1`` images: only the real
  DC bin (``V̂ = Σ_taps V``), a real matrix.

The GUARANTEED bound (:meth:`LOTConv.operator_bound`), for the float matrices ``Ŵ(f)``
actually used, converged or not, is the smaller of ``√(1 + max_f ‖ŴᴴŴ − I‖_F)``
(:func:`lipcli.numerics.gram_bounds.isometry_norm_upper_bound`, tight when the iteration has
converged) and ``max_f b_f``, where ``b_f`` bounds ``‖Ŵ(f)‖₂`` by

* Gershgorin on the Gram matrix ``B = ŴᴴŴ`` (or ``ŴŴᴴ``), batched over the frequencies
  (:func:`gershgorin_norm_upper_bounds`): ``‖Ŵ‖₂² = λ_max(B) ≤ max_i Σ_j |B_ij|``, with
  ``B̂`` formed in float64 and its rounding ``|B̂_ij − B_ij| ≤ 16γ_{q+2} Σ_k |ŵ_ki||ŵ_kj|``
  (the constant of ``isometry_norm_upper_bound``) added row by row; tight when ``Ŵ(f)`` has
  orthogonal columns of any common norm — converged, or uniformly contracted by ``ε``;
* and, for the frequencies where that exceeds ``1 + 10⁻⁵`` (float32; ``1 + 10⁻¹⁰`` for
  float64 matrices) (an unconverged ``Ŵ(f)``, or one
  contracted unevenly by ``ε``), the smaller of it and a certified ``λ_max`` of the same
  ``B̂`` (:func:`certified_gram_norm_upper_bound`): ``λ_max`` of the real symmetric
  ``X = [[Re B̂, −Im B̂], [Im B̂, Re B̂]]`` (the eigenvalues of ``B̂``, doubled; built from
  ``B̂``'s lower triangle) estimated by ``eigvalsh`` and proved by Rump's shifted Cholesky
  (:func:`lipcli.numerics.eigen.certify_lambda_max`), plus ``‖X − X_exact‖₂ ≤ 2·16γ_{q+2}
  ‖Ŵ‖_F²`` for the rounding of ``B̂`` (Weyl).

It bounds the layer's map by Parseval (:mod:`lipcli.sdk.fourier`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lipcli.numerics.gram_bounds import isometry_norm_upper_bound
from lipcli.numerics.rounding import ETA, UNIT_ROUNDOFF, gamma, round_up
from lipcli.numerics.eigen import certify_lambda_max

from lipcli.sdk.fourier import FourierConvBase, kernel_spectrum
from lipcli.sdk.fourier_border import BORDERS, ZeroBorderMixin

#: "identity": centre tap ``[I 0]`` (the authors' initialisation), "random": nn.Conv2d's
INITS = ("identity", "random")
#: cheap bounds above ``1 + REFINE_ABOVE[dtype]`` are refined (float32 matrices: about the
#: rounding defect of converged ones; float64: tight)
REFINE_ABOVE = {torch.float32: 1e-5, torch.complex64: 1e-5}
REFINE_ABOVE_DEFAULT = 1e-10


def newton_schulz_inverse_sqrt(S: Tensor, iterations: int) -> Tensor:
    """``Z_T ≈ S^{-1/2}`` for a batch of Hermitian ``S`` with eigenvalues in ``(0, 1]`` (module
    docstring; ``Z_TSZ_T ⪯ I`` for every ``T`` in exact arithmetic)."""
    eye = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    Y, Z = S, eye.expand_as(S)
    for _ in range(iterations):
        T = 0.5 * (3.0 * eye - Z @ Y)
        Y, Z = Y @ T, T @ Z
    return Z


def lot_polar(V: Tensor, iterations: int, eps: float) -> Tensor:
    """LOT's approximate polar factor of a batch ``V`` (``(..., m, n)``, real or complex)."""
    m, n = V.shape[-2:]
    G = V.mH @ V if m >= n else V @ V.mH
    S = G + eps * torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    norm = torch.linalg.matrix_norm(S, keepdim=True).real + eps  # ≥ ‖S‖_F ≥ ‖S‖₂
    norm = norm.clamp_min(torch.finfo(norm.dtype).tiny)
    Z = newton_schulz_inverse_sqrt(S / norm, iterations)
    return (V @ Z if m >= n else Z @ V) / norm.sqrt()


def gershgorin_norm_upper_bounds(op: Tensor) -> Tensor:
    """Verified upper bounds on ``‖op[f]‖₂`` for every ``f`` (float64 tensor): Gershgorin's
    bound on the smaller Gram matrix with its rounding (module docstring).

    Rounding: ``op`` is cast to float64/complex128 exactly; each entry of ``B̂`` is one
    (complex) dot product of length ``q``, off by at most ``16γ_{q+2}Σ_k|ŵ_ki||ŵ_kj|``, whose
    row sums are ``(|Ŵ|ᵀ(|Ŵ|·1))_i``; every sum of ``p`` non-negative computed terms
    (including the complex moduli, relative error ``≤ 2u``) is enlarged by ``1 + 2γ_{p+4}``,
    underflow by ``(q + p + 4)·η`` per entry, and the square root by :func:`round_up`."""
    M = op.detach().resolve_conj()
    M = M.to(torch.complex128) if M.is_complex() else M.to(torch.float64)
    m, n = M.shape[-2:]
    if n > m:
        M, m, n = M.mH, n, m  # B = MᴴM is the smaller Gram matrix, n × n, inner length q = m
    q = m
    B = M.mH @ M
    row = B.abs().sum(dim=-1) * (1.0 + 2.0 * gamma(n + 4))
    absM = M.abs()
    weights = absM.sum(dim=-1, keepdim=True) * (1.0 + 2.0 * gamma(n + 4))  # (|M|·1)_k, ≥ exact
    err = (absM * weights).sum(dim=-2) * (1.0 + 2.0 * gamma(q + 4)) * 16.0 * gamma(q + 2)
    lam = (row + err) * (1.0 + 4.0 * UNIT_ROUNDOFF) + (q + n + 4) * n * ETA
    return torch.sqrt(lam.max(dim=-1).values) * (1.0 + 2.0 * UNIT_ROUNDOFF)


def certified_gram_norm_upper_bound(W: Tensor) -> float | None:
    """Verified ``‖W‖₂`` of one matrix through a certified ``λ_max`` of its smaller Gram
    matrix (module docstring), or ``None`` when no candidate certifies."""
    M = W.detach().resolve_conj()
    M = M.to(torch.complex128) if M.is_complex() else M.to(torch.float64)
    m, n = M.shape
    if n > m:
        M, m, n = M.mH, n, m
    B = torch.tril(M.mH @ M)
    B = B + torch.tril(B, -1).mH  # Hermitian from the lower triangle (as Cholesky reads it)
    X = torch.cat([torch.cat([B.real, -B.imag], 1), torch.cat([B.imag, B.real], 1)], 0) if B.is_complex() else B
    fro2 = float(torch.linalg.vector_norm(M)) ** 2 * (1.0 + 2.0 * gamma(2 * m * n + 2))
    gram_err = 2.0 * 16.0 * gamma(m + 2) * fro2  # ≥ ‖X − X_exact‖₂
    estimate = float(torch.linalg.eigvalsh(X)[-1])
    scale = float(torch.linalg.vector_norm(X)) * (1.0 + 2.0 * gamma(X.numel() + 2))
    lam = certify_lambda_max(X, estimate, 1e-9, max(scale, 1e-300))
    if lam is None:
        return None
    return round_up(math.sqrt(round_up(max(lam, 0.0) + gram_err)))


def polar_norm_upper_bound(op: Tensor) -> float:
    """Verified ``max_f ‖op[f]‖₂`` for a batch of matrices close to (multiples of)
    semi-orthogonal ones, converged or not (module docstring)."""
    if not bool(torch.isfinite(op).all()):
        raise ValueError("LOT matrices have non-finite entries")
    overall = isometry_norm_upper_bound(op)
    refine_above = 1.0 + REFINE_ABOVE.get(op.dtype, REFINE_ABOVE_DEFAULT)
    if overall <= refine_above:
        return overall
    op = op.reshape(-1, *op.shape[-2:])
    bounds = [round_up(float(b)) for b in gershgorin_norm_upper_bounds(op)]
    best = 0.0
    for i in sorted(range(len(bounds)), key=bounds.__getitem__, reverse=True):
        if bounds[i] <= best or best >= overall:
            break  # the remaining ones cannot raise the maximum
        value = bounds[i]
        if value > refine_above:
            refined = certified_gram_norm_upper_bound(op[i])
            value = value if refined is None else min(value, refined)
        best = max(best, value)
    return min(overall, best)


class LOTConv(ZeroBorderMixin, FourierConvBase):
    """LOT convolution ``(N, in, H, W) → (N, out, H/s, W/s)``, circular (FFT) or, with
    ``border="zero"`` (the authors' form), on the input zero-padded by ``k//2`` and cropped
    (:mod:`lipcli.sdk.fourier_border`: ``Π C E``, with the same verified bound ``U`` as the
    circular map ``C`` on the padded torus, so 1-Lipschitz whenever ``C`` is).

    Parameters ``weight`` (``out × in·s² × k × k``) and ``bias``; buffer ``spatial_size`` (the
    torus the matrices are for: plus ``2·(k//2)`` pixels per side with ``border="zero"``).
    """

    weight: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 iterations: int = 10, eps: float = 1e-4, init: str = "identity",
                 border: str = "circular") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        if init not in INITS:
            raise ValueError(f"LOT init must be one of {', '.join(INITS)}, got {init!r}")
        if int(iterations) < 1:
            raise ValueError(f"LOT needs at least 1 Newton-Schulz iteration, got {iterations}")
        if not (float(eps) >= 0.0 and math.isfinite(float(eps))):
            raise ValueError(f"LOT eps must be a finite number >= 0, got {eps}")
        if border not in BORDERS:
            raise ValueError(f"LOT border must be one of {', '.join(BORDERS)}, got {border!r}")
        self.iterations = int(iterations)
        self.eps = float(eps)
        self.border = border
        #: zeros added on each side before the circular map (``border="zero"``), cropped after
        self.pad = self.kernel_size // 2 if border == "zero" else 0
        k = self.kernel_size
        weight = torch.zeros(self.out_channels, self.conv_in_channels, k, k)
        if init == "identity":
            idx = torch.arange(min(self.out_channels, self.conv_in_channels))
            weight[idx, idx, k // 2, k // 2] = 1.0
        else:
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # nn.Conv2d's default
        self.weight = nn.Parameter(weight)

    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        """``W(f)`` for the half-plane bins, ``(H·(W//2+1), out, in·s²)`` (complex; real
        ``(1, out, in·s²)`` on a ``1 × 1`` image)."""
        assert size is not None
        return lot_polar(kernel_spectrum(self.weight, size), self.iterations, self.eps)

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        """The verified ``max_f ‖Ŵ(f)‖₂``; with ``border="zero"`` it bounds ``Π C E`` too
        (``‖E‖ = ‖Π‖ = 1``)."""
        return polar_norm_upper_bound(op)

    def extra_repr(self) -> str:
        border = f", border={self.border}" if self.pad else ""
        return f"{super().extra_repr()}, iterations={self.iterations}, eps={self.eps:g}{border}"
