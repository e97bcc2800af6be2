"""Skew orthogonal convolution (SOC) with exact and fast filter gradients (SPEC §1, §5).

The layer :class:`SOC`: its parameters and power-iteration buffers, the forward and the
guaranteed Lipschitz bound, on :class:`lipcli.sdk.convbase.LipConvBase` (argument checks,
stride-2 rearrangement, the cached eval filter and bound).  Its maths lives beside it:
:mod:`~lipcli.builtins.soc.filters` (transpose and normalised skew filter ``S = A/σ``, its
gradient, the power-iteration products; SPEC §1.1–§1.2),
:mod:`~lipcli.builtins.soc.power` (the power-iteration buffers, steps and Rayleigh
quotients, a base class of the layer; SPEC §1.2),
:mod:`~lipcli.builtins.soc.series` (the truncated exponential by Horner, the paper's fast
filter gradient, the truncation bound; SPEC §1.4–§1.6, §5),
:mod:`~lipcli.builtins.soc.settings` (layout switches), :mod:`~lipcli.builtins.soc.fused`
(optional compiled CUDA kernels), :mod:`~lipcli.builtins.soc.export` (the exported form) and
:mod:`~lipcli.builtins.soc.plugin` (the ``soc`` / ``soc-fast`` convolutions).

* Stride 2: ``pixel_unshuffle`` first; zero channel padding up to ``C``; keep the first
  ``c_out`` channels; add the bias (SPEC §1.3).
* On GPUs the reshape giving σ is selected on the device, so a training step never waits
  for the GPU.
* Lipschitz constant (SPEC §5): with ``b ≥ ‖S‖₂`` (guaranteed, :mod:`lipcli.numerics.conv`)
  and ``exp(S)`` orthogonal, ``‖P_T(S)‖ ≤ 1 + b^T/T! · 1/(1 − b/(T+1))`` (``b < T+1``) and
  always ``‖P_T(S)‖ ≤ Σ_{j<T} b^j/j!``.  Floating-point rounding inside the convolutions of a
  forward pass is not part of this bound (as everywhere in the literature).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipcli.builtins.soc.filters import _NormalisedSkew, _rank_one_factors, _skew_difference
from lipcli.builtins.soc.power import PowerVectors
from lipcli.builtins.soc.series import (
    _working_format, dense_applies, soc_series, soc_series_dense, soc_series_fast, truncated_exp_norm_bound,
)
from lipcli.numerics.conv import CONV_RESHAPES, conv_spectral_norm_upper_bound
from lipcli.sdk.convbase import LipConvBase
from lipcli.sdk.loading import tensors_will_be_loaded
from lipcli.builtins.soc.export import linear_map, lower_soc

__all__ = ["SOC", "INIT_POWER_STEPS", "MAX_TERMS", "MAX_POWER_ITERS"]


# --------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------
def _select_on_host(device: torch.device) -> bool:
    """Whether the σ-giving reshape is read on the host (free on CPU, a sync on a GPU; never
    inside ``torch.compile``, where reading it would break the graph)."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


#: power-iteration steps run when a layer is built: SPEC §1.2 (a freshly built model refreshes
#: its vectors with the reference's 50 steps before evaluation; 10 steps left σ 1-4 % low)
INIT_POWER_STEPS = 50
#: upper limits of the series terms and power steps (the paper uses 6-15 terms, 1 step): a
#: model file asking for more is refused before any work (model files are untrusted input)
MAX_TERMS = 64
MAX_POWER_ITERS = 1000


class SOC(LipConvBase, PowerVectors):
    """Skew orthogonal convolution ``(N, c_in, H, W) → (N, c_out, H/s, W/s)`` (SPEC §1).

    Parameters ``weight`` (``C×C×k×k``, ``C = max(c_out, c_in·s²)``, init ``N(0, 1/C)``) and
    ``bias`` (``c_out``, ``U(−1/√C, 1/√C)``); persistent buffers ``power_u{r}``,
    ``power_v{r}`` (r = 0..3) with the power-iteration vectors of the four reshapes of the
    skew filter ``A`` (part of the state dict).  ``fast_grad`` selects the paper's fast filter
    gradient (``soc-fast``) or plain autograd (``soc``); both have the same parameters and a
    bit-identical forward, so a model trained with one evaluates with the other.

    A :class:`~lipcli.sdk.convbase.LipConvBase` whose operator is the skew filter ``S``:
    the base checks the arguments, rearranges stride-2 inputs and caches ``S`` and the bound.
    Training forward: ``power_iters`` power steps per reshape, ``S = A/σ`` with gradients
    through ``σ``, ``train_terms`` series terms.  Eval forward: no power step, ``eval_terms``
    terms, ``S`` cached (the base's cache: recomputed only when a parameter or a power buffer
    changes — tracked by tensor version counters and storage — or ``eval_terms``, on a mode
    change, on ``.to()`` and after ``refresh()``/``invalidate()``).  In eval mode the cached
    ``S`` is detached; if gradients to the parameters are requested in eval mode ``S`` is
    recomputed with the same operations (same values) so parameter gradients still flow.
    Writes that bypass version counters (``weight.data[...] = ...``) are not detected: call
    ``invalidate()`` or ``refresh()`` after them.
    """

    weight: Tensor
    bias: Tensor

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        *,
        train_terms: int = 6,
        eval_terms: int = 15,
        fast_grad: bool = True,
        power_iters: int = 1,
    ) -> None:
        # the bias is registered after the weight (parameter order, random initialisation)
        super().__init__(in_channels, out_channels, kernel_size, stride, bias=False)
        if train_terms < 2 or eval_terms < 2:
            raise ValueError("train_terms and eval_terms must be at least 2")
        if train_terms > MAX_TERMS or eval_terms > MAX_TERMS:
            raise ValueError(f"train_terms and eval_terms must be at most {MAX_TERMS}")
        if power_iters < 0:
            raise ValueError("power_iters must be non-negative")
        if power_iters > MAX_POWER_ITERS:
            raise ValueError(f"power_iters must be at most {MAX_POWER_ITERS}")
        self.train_terms = int(train_terms)
        self.eval_terms = int(eval_terms)
        self.fast_grad = bool(fast_grad)
        self.power_iters = int(power_iters)
        C = max(self.out_channels, self.in_channels * self.stride**2)
        self.channels = C
        k = self.kernel_size
        self.weight = nn.Parameter(torch.randn(C, C, k, k) / math.sqrt(C))
        bound = 1.0 / math.sqrt(C)
        self.bias = nn.Parameter(torch.empty(self.out_channels).uniform_(-bound, bound))
        self._register_power_vectors(C, k)
        self._last_reshape: int | Tensor = -1  # see last_sigma_reshape
        # Random start vectors can give a tiny or negative Rayleigh quotient σ, i.e. a
        # useless S in eval mode: a freshly built layer starts from converged-ish vectors
        # (not when a model file's vectors replace them: lipcli.sdk.loading).
        if not tensors_will_be_loaded():
            self.refresh(INIT_POWER_STEPS)

    # ------------------------------------------------------------------ power iteration
    # the buffers, steps and Rayleigh quotients: lipcli.builtins.soc.power.PowerVectors
    @torch.no_grad()
    def refresh(self, steps: int = 50) -> None:
        """Run ``steps`` power-iteration steps on all four reshapes (no gradient) and drop
        the eval cache.  Call before evaluating a freshly built or loaded model."""
        if steps > 0:
            self._power_iterate(_skew_difference(self.weight.detach()), int(steps))
        self.invalidate()

    # ------------------------------------------------------------------ filters
    def _compute_S(self, power_steps: int) -> Tensor:
        """``S = A/σ`` (SPEC §1.2): ``power_steps`` power steps (0: use the stored vectors),
        ``σ = min_r u_rᵀ R_r(A) v_r``, differentiable in ``weight`` with the vectors fixed.

        On CPU the minimising reshape is read on the host; elsewhere it is selected on the
        device (``ρ = min_r ρ_r``; the gradient's rank-one term weights the four reshapes by
        an exact one-hot vector), so a training step needs no GPU→host synchronisation."""
        W = self.weight
        C, k = self.channels, self.kernel_size
        with torch.no_grad():
            D = _skew_difference(W.detach())
            if power_steps > 0:
                quotients = self._power_iterate(D, power_steps)
            else:
                quotients = self._rayleigh_quotients(D)
            rhos = torch.stack([q[0] for q in quotients])
            if _select_on_host(D.device):
                r = int(torch.argmin(rhos))
                self._last_reshape = r
                rho, u, v = quotients[r]
                factors = [_rank_one_factors(r, u, v, C, k)]
            else:
                index = torch.argmin(rhos)
                self._last_reshape = index
                rho = rhos.min()
                onehot = (torch.arange(CONV_RESHAPES, device=D.device) == index).to(D.dtype)
                factors = []
                for r, (_, u, v) in enumerate(quotients):
                    eu, ev = _rank_one_factors(r, u, v, C, k)
                    factors.append((eu * onehot[r], ev))
        return _NormalisedSkew.apply(W, D, rho, factors)

    @property
    def last_sigma_reshape(self) -> int:
        """Index of the reshape that gave σ in the last filter computation (diagnostics;
        reading it synchronises with the device)."""
        r = self._last_reshape
        return int(r) if isinstance(r, Tensor) else r

    def skew_filter(self) -> Tensor:
        """``S = ½(W − T(W))/σ`` as used at evaluation (σ from the stored power vectors, no
        power step; detached, cached)."""
        return self.eval_operator()

    # ------------------------------------------------------------------ LipConvBase operator
    def compute_operator(self, size: tuple[int, int] | None) -> Tensor:
        """``S`` with gradients: ``power_iters`` power steps in training, none in eval mode."""
        return self._compute_S(self.power_iters if self.training else 0)

    def compute_eval_operator(self, size: tuple[int, int] | None) -> Tensor:
        return self._compute_S(0)

    def apply_operator(self, x: Tensor, op: Tensor) -> Tensor:
        """The series of the rearranged ``x``: pad, ``train_terms``/``eval_terms`` terms of
        ``exp(S)``, keep the first ``out_channels`` channels."""
        terms = self.train_terms if self.training else self.eval_terms
        z = self._series(self._pad(x), op, terms)
        if self.channels > self.out_channels:
            z = z[:, : self.out_channels]
        return z

    def operator_bound(self, op: Tensor, size: tuple[int, int] | None) -> float:
        """The guaranteed bound on the l2 Lipschitz constant at ``eval_terms`` (SPEC §5) that
        :meth:`lipschitz_upper_bound` caches: ``1 + b^T/T!·1/(1 − b/(T+1))`` with ``b ≥ ‖S‖₂``
        as in :meth:`spectral_bound` (or the plain ``Σ_{j<T} b^j/j!`` when smaller or when
        ``b ≥ T+1``).  Unshuffle, channel padding and truncation have norm ≤ 1; the bias does
        not matter."""
        return truncated_exp_norm_bound(self._filter_bound(op), self.eval_terms)

    def operator_settings(self) -> tuple:
        return (self.eval_terms,)

    # ------------------------------------------------------------------ forward
    def _prepare_input(self, x: Tensor) -> Tensor:
        """Check and rearrange ``x`` (:meth:`rearrange`), then :meth:`_pad`."""
        return self._pad(self.rearrange(x))

    def _pad(self, x: Tensor) -> Tensor:
        """Zero channels up to ``C``, in the working memory format."""
        extra = self.channels - x.shape[1]
        if extra > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, extra))
        return x.contiguous(memory_format=_working_format(x))

    def _series(self, x: Tensor, S: Tensor, terms: int) -> Tensor:
        fast = self.fast_grad and torch.is_grad_enabled() and (x.requires_grad or S.requires_grad)
        if dense_applies(x, S):  # opt-in (settings.CPU_DENSE_SMALL_IMAGES): tiny CPU images
            return soc_series_dense(x, S, terms, fast)
        return soc_series_fast(x, S, terms) if fast else soc_series(x, S, terms)

    def forward(self, x: Tensor) -> Tensor:
        # the series' output is a fresh tensor (or a channel slice of one) that nothing else
        # holds: add the bias in place (no extra activation-sized buffer; same values)
        return self.linear(x).add_(self.bias.view(1, -1, 1, 1))

    # ------------------------------------------------------------------ Lipschitz
    def spectral_bound(self, rtol: float = 5e-3, select_rtol: float | None = None) -> float:
        """Guaranteed upper bound ``b ≥ ‖S‖₂`` for the ``S`` actually used at evaluation:
        ``√(kh·kw)·min_r ‖R_r(S)‖₂`` (SPEC §5) with the reshape norms bounded from above in
        float64 (the float32 ``S`` is cast exactly), see :mod:`lipcli.numerics.conv`; ``b`` is
        within about ``rtol`` of that minimum.  ``S`` is exactly skew, so only two of the
        four reshapes need bounding.  ``select_rtol`` (default ``rtol``) lets the cheaper of
        the two be bounded when its estimated norm is within that tolerance of the smaller
        (b only enters the truncation tail ``b^T/T!``, so e.g. 0.1 trades about 1e-4 of a
        layer bound for time)."""
        return self._filter_bound(self.skew_filter(), rtol, select_rtol)

    def _filter_bound(self, S: Tensor, rtol: float = 5e-3, select_rtol: float | None = None) -> float:
        starts = [self._power_vectors(r)[1] for r in range(CONV_RESHAPES)]
        return conv_spectral_norm_upper_bound(
            S, rtol=rtol, select_rtol=select_rtol, skew=True, start_vectors=starts
        )

    def lipschitz_estimate(self, input_shape: tuple[int, int, int], iters: int = 50) -> float:
        """Power-method estimate (a lower estimate) of the operator norm of
        ``x ↦ layer(x) − bias`` at ``eval_terms`` for inputs of shape ``(c_in, H, W)``."""
        S = self.skew_filter()
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn((1, *input_shape), generator=gen, dtype=S.dtype).to(S.device)
        estimate = 0.0
        with torch.enable_grad():
            for _ in range(max(1, iters)):
                x = (x / torch.linalg.vector_norm(x)).detach().requires_grad_(True)
                y = self._linear_plain(x, S)
                estimate = float(torch.linalg.vector_norm(y.detach()))
                (x_next,) = torch.autograd.grad(y, x, y.detach())
                x = x_next
        return estimate

    def _linear_plain(self, x: Tensor, S: Tensor) -> Tensor:
        z = soc_series(self._prepare_input(x), S, self.eval_terms)
        return z[:, : self.out_channels]

    def export_module(self, context: Any = None) -> nn.Module:
        """``lip export``: the eval-mode layer as its fixed series of plain convolutions with
        the current filter, or, on the fixed input shape of ``context``
        (:class:`lipcli.sdk.lowering.LoweringContext`), as one dense matrix when that fits
        the export's cap and is cheaper (:func:`lipcli.builtins.soc.export.lower_soc`)."""
        return lower_soc(self, context)

    def eval_linear_map(self, input_shape: tuple[int, ...]) -> Any:
        """The eval layer on inputs of ``input_shape`` as one float64 matrix with its error
        bound (:class:`lipcli.sdk.lowering.LinearMap`, the SDK's eval lowering protocol)."""
        return linear_map(self, input_shape)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, train_terms={self.train_terms}, "
            f"eval_terms={self.eval_terms}, fast_grad={self.fast_grad}"
        )

