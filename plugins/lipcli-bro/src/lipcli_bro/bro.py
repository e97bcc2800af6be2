"""BRO convolution: an orthogonal block reflector at every spatial frequency (Lai et al.,
*Enhancing Certified Robustness via Block Reflector Orthogonal Layers and Logit Annealing
Loss*, ICML 2025 — "BRONet"; the BRO layer, their Eq. (2) and §3).

Maths:

* ``V`` is a learnable low-rank filter with ``c = max(in·s², out)`` output and ``r < c``
  input channels (default ``r = ⌊c/2⌋`` as the BRONet backbone; ``rank_rule="lipconvnet"``:
  the authors' LipConvNet rule, :mod:`lipcli_bro.border`).  On the ``H × W`` torus its matrix
  at frequency ``f`` is ``V̂(f) ∈ ℂ^{c×r}`` (:func:`lipcli.sdk.fourier.kernel_spectrum`).
* ``W(f) = I − 2 V̂ (V̂ᴴV̂)⁻¹ V̂ᴴ`` is the reflection through the orthogonal complement of
  ``range V̂(f)``: with ``P = V̂(V̂ᴴV̂)⁻¹V̂ᴴ`` the orthogonal projector (``P = Pᴴ = P²``),
  ``WᴴW = I − 4P + 4P² = I``: unitary, in exact arithmetic, no series or iteration.
  ``V̂(−f) = conj V̂(f)`` gives ``W(−f) = conj W(f)``, so the circular convolution is real
  and orthogonal.
* Computed as ``W = I − 2 Q Qᴴ`` with ``V̂ = QR`` (reduced Householder QR): the same matrix
  whenever ``V̂(f)`` has full column rank (``range Q = range V̂``), without forming
  ``(V̂ᴴV̂)⁻¹`` (whose condition number is ``κ(V̂)²``), and still a reflector to rounding
  when ``V̂(f)`` is ill conditioned (``Q`` is unitary to ``O(u)`` whatever ``R`` is).  The
  authors' code solves with ``V̂ᴴV̂ + 10⁻⁵·mean(diag)·I`` instead; we do not regularise
  (the result is then exactly the reflector of the paper's Eq.).
* Training steps (``factor="auto"``) use Cholesky QR instead, ``Qᴴ = L⁻¹V̂ᴴ`` with
  ``V̂ᴴV̂ = LLᴴ`` (batched products, one Cholesky, one triangular solve, where LAPACK's
  batched Householder QR goes one matrix at a time and, on CPU, is slower with a second
  thread: docs/benchmarks.md).  In exact
  arithmetic it is the same ``Q``; in floating point ``δ = ‖QᴴQ − I‖`` grows like
  ``u·κ(V̂)²``, and ``‖WᴴW − I‖₂ = 4‖Q(QᴴQ − I)Qᴴ‖₂ ≤ 4δ(1 + δ)``.  On CPU every step
  measures ``δ_F = max_f ‖QᴴQ − I‖_F ≥ δ`` (one ``r × c`` product per frequency) and falls
  back to Householder QR when the Cholesky broke down or ``δ_F > √u`` (``2.4e-4`` in
  float32: ``κ(V̂) ≲ u^{-1/4} ≈ 64``), so a training step's matrices are reflectors to
  ``4√u(1 + √u)`` at worst; it applies ``W`` in factored form (:meth:`BROConv.linear`).  CPU layers
  with fewer than :attr:`BROConv.cholesky_min_channels` channels keep Householder QR (many
  small matrices, where it is as fast).  On CUDA the check (a host sync) is skipped.
* ``in ≠ out`` and stride 2 (as the authors' code): ``pixel_unshuffle(x, 2)`` (a
  permutation) for stride 2, then the ``out × in·s²`` top-left block of the ``c × c`` unitary
  ``W(f)``: its columns (``in·s² ≤ out``) or rows (``in·s² > out``) are orthonormal, so the
  layer is semi-orthogonal.
* ``border="zero"`` (the authors' form): zero-pad by ``k//2``, the reflector on the padded
  torus, crop (:mod:`lipcli_bro.border`): 1-Lipschitz with the same verified bound, not
  orthogonal.
* ``ridge > 0`` (the authors' LipConvNet): ``(V̂ᴴV̂ + ε I)⁻¹`` as their code solves it, a
  contraction with the same verified bound, not orthogonal (:mod:`lipcli_bro.border`).
* ``1 × 1`` images: only the real DC bin, ``V̂ = Σ_taps V`` and ``W`` is a real orthogonal
  (Householder-type) matrix.

What is proven and what is bounded: orthogonal (semi-orthogonal for ``in ≠ out``) in exact
arithmetic, hence the promise ``"orthogonal"``; ``lipschitz_upper_bound()`` is a *verified*
bound for the float matrices actually used,
``max_f ‖Ŵ(f)‖₂ ≤ √(1 + max_f ‖ŴᴴŴ − I‖_F)`` with every rounding of that computation covered
(:func:`lipcli.numerics.gram_bounds.isometry_norm_upper_bound`), which bounds the layer's map
(:mod:`lipcli.sdk.fourier`).  That bound, the certificates and the eval lowering all use the
eval matrices, which are Householder QR on every device and with every ``factor="auto"``
model (``eval_operator`` runs without gradients): the Cholesky route never reaches them, so
a model file certifies with the same matrices, bound and radii whatever trained it.  Nothing
certified relies on the training route's ``δ``; its limit keeps the function trained close to
the orthogonal map that is certified.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lipcli.numerics.gram_bounds import isometry_norm_upper_bound
from lipcli.sdk.fourier import FourierConvBase, kernel_spectrum
from lipcli.sdk.fourier_border import ZeroBorderMixin

from .border import BORDERS, RANK_RULES, crop_border, ridge_reflector, rule_rank

#: how the low-rank filter starts: the authors' default puts an identity on the centre tap
#: (``V̂(f) = [I_r; 0]``, ``W = diag(−I_r, I)``); "random" is nn.Conv2d's initialisation
INITS = ("identity", "random")


#: how ``Q`` (an orthonormal basis of ``range V̂``) is computed: Householder QR, or Cholesky
#: QR (``VᴴV = LLᴴ``, ``Q = VL⁻ᴴ``: batched matrix products, one batched Cholesky and one
#: triangular solve); "auto": for training steps Cholesky QR (on CPU checked by
#: :func:`orthogonality_defect` against :func:`defect_limit`, Householder QR beyond it), and
#: Householder QR for every eval matrix (the ones certification runs and bounds), on every device
FACTORS = ("auto", "qr", "cholesky")


def cholesky_basis(V: Tensor) -> tuple[Tensor, Tensor]:
    """``(Qᴴ, info)`` of Cholesky QR for a batch ``V`` (``(..., c, r)``): ``Qᴴ = L⁻¹Vᴴ`` with
    ``VᴴV = LLᴴ``; ``info`` is LAPACK's (non-zero where the float Cholesky broke down)."""
    L, info = torch.linalg.cholesky_ex(V.mH @ V)  # no host sync (a failure gives info > 0)
    return torch.linalg.solve_triangular(L, V.mH, upper=False), info


def orthogonality_defect(Qh: Tensor) -> float:
    """``max_f ‖Q(f)ᴴQ(f) − I‖_F`` of a batch ``Qᴴ`` (``(..., r, c)``), computed in its own
    precision without gradients (one host sync on CUDA); ``inf`` when not finite."""
    with torch.no_grad():
        Qh = Qh.detach()
        E = Qh @ Qh.mH
        E.diagonal(dim1=-2, dim2=-1).sub_(1)
        E = torch.view_as_real(E) if E.is_complex() else E
        value = float(E.square().flatten(1).sum(1).max().sqrt()) if E.numel() else 0.0
    return value if math.isfinite(value) else math.inf


def defect_limit(dtype: torch.dtype) -> float:
    """The largest :func:`orthogonality_defect` the checked Cholesky route accepts: ``√u``
    (``u`` the unit roundoff of ``dtype``'s real part): ``2.4e-4`` in float32, ``1.5e-8`` in
    float64.  Cholesky QR loses orthogonality like ``u·κ(V̂)²`` (Householder QR: ``u``), so
    the limit is ``κ(V̂) ≲ u^{-1/4}``: about 64 in float32, 8·10³ in float64."""
    real = torch.empty((), dtype=dtype).real.dtype
    return math.sqrt(torch.finfo(real).eps / 2)


def block_reflector(V: Tensor, factor: str = "qr") -> Tensor:
    """``I − 2 V (VᴴV)⁻¹ Vᴴ`` for a batch ``V`` of shape ``(..., c, r)``, ``r ≤ c`` (real or
    complex), computed as ``I − 2QQᴴ`` with ``range Q = range V``: ``factor="qr"`` from the
    reduced Householder QR factorisation (module docstring), ``"cholesky"`` from Cholesky
    QR (:func:`cholesky_basis`; the same ``Q`` in exact arithmetic, ``R = Lᴴ``; its loss of
    orthogonality grows like ``u·κ(V)²`` instead of ``u``, and a ``V`` too ill-conditioned
    for a float Cholesky gives garbage or NaN, unchecked here), ``"checked"``: Cholesky QR
    when its :func:`orthogonality_defect` is at most :func:`defect_limit` and the Cholesky
    succeeded, Householder QR otherwise."""
    c, r = V.shape[-2:]
    if r > c:
        raise ValueError(f"block_reflector needs rank r <= c, got V of shape {tuple(V.shape)}")
    if factor in ("cholesky", "checked"):
        Qh, info = cholesky_basis(V)
        if factor == "cholesky" or (not bool(info.any()) and orthogonality_defect(Qh) <= defect_limit(V.dtype)):
            eye = torch.eye(c, dtype=V.dtype, device=V.device)
            return eye - 2.0 * (Qh.mH @ Qh)
    elif factor != "qr":
        raise ValueError(f"block_reflector factor must be qr, cholesky or checked, got {factor!r}")
    Q = torch.linalg.qr(V, mode="reduced").Q
    eye = torch.eye(c, dtype=V.dtype, device=V.device)
    return eye - 2.0 * (Q @ Q.mH)


def resolve_rank(channels: int, rank: int, rank_ratio: float, rule: str = "ratio",
                 shape: tuple[int, int] | None = None) -> int:
    """The rank ``r`` of ``V``: ``rank`` when positive, else the ``rule``'s
    (:func:`lipcli_bro.border.rule_rank`; ``"ratio"``: ``⌊rank_ratio·c⌋``; ``"lipconvnet"``
    needs ``shape = (in·s², out)``), clipped to ``[1, c]`` (``r = c`` gives ``W = −I``)."""
    if rank < 0:
        raise ValueError(f"BRO rank must be >= 0 (0: use rank_ratio), got {rank}")
    if not 0.0 < rank_ratio <= 1.0:
        raise ValueError(f"BRO rank_ratio must be in (0, 1], got {rank_ratio}")
    conv_in, out = shape if shape is not None else (channels, channels)
    r = rank if rank > 0 else rule_rank(rule, conv_in, out, rank_ratio)
    return max(1, min(channels, r))


class BROConv(ZeroBorderMixin, FourierConvBase):
    """BRO convolution ``(N, in, H, W) → (N, out, H/s, W/s)``, circular (FFT); with
    ``border="zero"`` the reflector acts on the zero-padded image and the result is cropped
    (:mod:`lipcli_bro.border`; forward, dense eval map and export stand-in:
    :class:`lipcli.sdk.fourier_border.ZeroBorderMixin`).

    Parameters ``weight`` (the low-rank filter ``V``, ``c × r × k × k`` with
    ``c = max(in·s², out)``) and ``bias``; buffer ``spatial_size`` (the torus the matrices
    are for: the rearranged image, plus ``2·(k//2)`` pixels per side length with
    ``border="zero"``).
    """

    weight: Tensor
    #: ``factor="auto"`` trains with checked Cholesky QR on CPU from this many channels ``c``
    #: on; below, its extra small batched calls cost more than Householder QR saves
    #: (``benchmarks/bro_cpu_factor.py``, docs/benchmarks.md), so those layers keep QR
    cholesky_min_channels: int = 128

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 rank: int = 0, rank_ratio: float = 0.5, init: str = "identity",
                 factor: str = "auto", rank_rule: str = "ratio", border: str = "circular",
                 ridge: float = 0.0) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        if init not in INITS:
            raise ValueError(f"BRO init must be one of {', '.join(INITS)}, got {init!r}")
        if factor not in FACTORS:
            raise ValueError(f"BRO factor must be one of {', '.join(FACTORS)}, got {factor!r}")
        if rank_rule not in RANK_RULES:
            raise ValueError(f"BRO rank_rule must be one of {', '.join(RANK_RULES)}, got {rank_rule!r}")
        if border not in BORDERS:
            raise ValueError(f"BRO border must be one of {', '.join(BORDERS)}, got {border!r}")
        if not 0.0 <= ridge < 1.0:
            raise ValueError(f"BRO ridge must be in [0, 1), got {ridge}")
        self.factor = factor
        self.border = border
        #: the authors' LipConvNet solve regularisation (:func:`lipcli_bro.border.ridge_reflector`; 0: none)
        self.ridge = float(ridge)
        #: zeros added on each side before the reflector (``border="zero"``), cropped after
        self.pad = self.kernel_size // 2 if border == "zero" else 0
        self.channels = max(self.conv_in_channels, self.out_channels)
        self.rank = resolve_rank(self.channels, int(rank), float(rank_ratio), rank_rule,
                                 (self.conv_in_channels, self.out_channels))
        k = self.kernel_size
        weight = torch.zeros(self.channels, self.rank, k, k)
        if init == "identity":
            idx = torch.arange(self.rank)
            weight[idx, idx, k // 2, k // 2] = 1.0
        else:
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # nn.Conv2d's default
        self.weight = nn.Parameter(weight)

    def filter(self) -> Tensor:
        """The low-rank filter ``V`` the reflector is built from: ``weight`` (a subclass may
        parametrise it, :class:`lipcli_bro.backbone.QuasiResidualBRO`)."""
        return self.weight

    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        """``W(f)[:out, :in·s²]`` for the half-plane bins, ``(H·(W//2+1), out, in·s²)``
        (complex; real ``(1, out, in·s²)`` on a ``1 × 1`` image)."""
        assert size is not None
        factor = self.factor
        if factor == "auto":
            training = self.training and torch.is_grad_enabled()  # eval_operator runs under no_grad
            if not training:
                factor = "qr"
            elif self.weight.is_cuda:
                factor = "cholesky"
            else:
                factor = "checked" if self.channels >= self.cholesky_min_channels else "qr"
        V = kernel_spectrum(self.filter(), size)
        reflector = ridge_reflector(V, self.ridge) if self.ridge else block_reflector(V, factor)
        return reflector[:, : self.out_channels, : self.conv_in_channels]

    def linear(self, x: Tensor) -> Tensor:
        """The layer without bias.  A training step on CPU with ``factor="auto"`` applies the
        checked Cholesky reflector in factored form, ``W[:out, :in]·x̂ = x̂[:out] −
        2·Q[:out](Q[:in]ᴴx̂)`` (``x̂`` zero-padded when ``out > in``): ``2·r·c·N`` products per
        frequency instead of forming ``W`` (``c²·r``) and applying it (``out·in·N``); the same
        map as ``compute_operator``'s matrix to rounding (layers with at least
        :attr:`cholesky_min_channels` channels).  Householder QR and the dense
        matrix when the check fails (module docstring); every other case is the base class's."""
        if not (self.factor == "auto" and self.training and torch.is_grad_enabled()
                and not self.weight.is_cuda and self.channels >= self.cholesky_min_channels and not self.ridge
                and type(self).compute_operator is BROConv.compute_operator):
            return super().linear(x)
        z = self.rearrange(x)
        size = self.operator_size((int(z.shape[-2]), int(z.shape[-1])))
        assert size is not None
        V = kernel_spectrum(self.filter(), size)
        Qh, info = cholesky_basis(V)
        if bool(info.any()) or orthogonality_defect(Qh) > defect_limit(V.dtype):
            return self.apply_operator(z, block_reflector(V, "qr")[:, : self.out_channels, : self.conv_in_channels])
        return self.apply_factored(z, Qh)

    def apply_factored(self, z: Tensor, Qh: Tensor) -> Tensor:
        """``W[:out, :in]`` of ``W = I − 2QQᴴ`` applied to the rearranged ``z`` from ``Qᴴ``
        (``(bins, r, c)``) without forming ``W``."""
        N, C, H, W = z.shape
        out = self.out_channels
        X = z.reshape(N, C).T[None] if H == 1 and W == 1 else self.to_spectrum(z)
        U = Qh[:, :, :C] @ X
        head = X[:, :out] if out <= C else torch.cat([X, X.new_zeros(X.shape[0], out - C, N)], 1)
        Y = head - 2.0 * (Qh[:, :, :out].mH @ U)
        y = Y[0].T.reshape(N, out, 1, 1) if H == 1 and W == 1 else self.from_spectrum(Y, (H, W))
        return crop_border(y, self.pad)

    # ------------------------------------------------------------------ the border
    @property
    def lip_promises(self) -> tuple[str, ...]:
        """The spec's promises as stamped by the host, without ``"orthogonal"`` when
        ``border="zero"`` (a crop of an orthogonal map is 1-Lipschitz, not orthogonal) or
        ``ridge > 0`` (a contraction, :mod:`lipcli_bro.border`)."""
        promises = self.__dict__.get("_lip_promises", ())
        return tuple(p for p in promises if p != "orthogonal") if self.pad or self.ridge else promises

    @lip_promises.setter
    def lip_promises(self, value: tuple[str, ...]) -> None:
        self.__dict__["_lip_promises"] = tuple(value)

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        """The verified ``max_f ‖Ŵ(f)‖₂`` bound; with ``border="zero"`` it bounds ``Π C E``
        too (``‖E‖ = ‖Π‖ = 1``, :mod:`lipcli_bro.border`)."""
        return isometry_norm_upper_bound(op)

    def extra_repr(self) -> str:
        border = (f", border={self.border}" if self.pad else "") + (f", ridge={self.ridge:g}" if self.ridge else "")
        return f"{super().extra_repr()}, rank={self.rank} of {self.channels}{border}"
