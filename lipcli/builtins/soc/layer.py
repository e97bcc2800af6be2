"""Skew orthogonal convolution (SOC) with exact and fast filter gradients (SPEC §1, §5).

The layer :class:`SOC`: its parameters, power-iteration buffers and eval cache, the
forward and the guaranteed Lipschitz bound.  Its maths lives beside it:
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
from lipcli.builtins.soc.series import _working_format, soc_series, soc_series_fast, truncated_exp_norm_bound
from lipcli.numerics.conv import CONV_RESHAPES, conv_spectral_norm_upper_bound
from lipcli.sdk.loading import tensors_will_be_loaded
from lipcli.builtins.soc.export import linear_map, lower_soc

__all__ = ["SOC", "INIT_POWER_STEPS", "MAX_TERMS", "MAX_POWER_ITERS"]


# --------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------
def _select_on_host(device: torch.device) -> bool:
    """Whether the σ-giving reshape is read on the host (free on CPU, a sync on a GPU)."""
    return device.type == "cpu"


#: power-iteration steps run when a layer is built: SPEC §1.2 (a freshly built model refreshes
#: its vectors with the reference's 50 steps before evaluation; 10 steps left σ 1-4 % low)
INIT_POWER_STEPS = 50
#: upper limits of the series terms and power steps (the paper uses 6-15 terms, 1 step): a
#: model file asking for more is refused before any work (model files are untrusted input)
MAX_TERMS = 64
MAX_POWER_ITERS = 1000


class SOC(PowerVectors):
    """Skew orthogonal convolution ``(N, c_in, H, W) → (N, c_out, H/s, W/s)`` (SPEC §1).

    Parameters ``weight`` (``C×C×k×k``, ``C = max(c_out, c_in·s²)``, init ``N(0, 1/C)``) and
    ``bias`` (``c_out``, ``U(−1/√C, 1/√C)``); persistent buffers ``power_u{r}``,
    ``power_v{r}`` (r = 0..3) with the power-iteration vectors of the four reshapes of the
    skew filter ``A`` (part of the state dict).  ``fast_grad`` selects the paper's fast filter
    gradient (``soc-fast``) or plain autograd (``soc``); both have the same parameters and a
    bit-identical forward, so a model trained with one evaluates with the other.

    Training forward: ``power_iters`` power steps per reshape, ``S = A/σ`` with gradients
    through ``σ``, ``train_terms`` series terms.  Eval forward: no power step, ``eval_terms``
    terms, ``S`` cached (recomputed only when the weight or a power buffer changes — tracked
    by tensor version counters and storage — or when ``train()``/``eval()``/``refresh()`` is
    called).  In eval mode the cached ``S`` is detached; if gradients to ``weight`` are
    requested in eval mode (grad enabled and ``weight.requires_grad``) ``S`` is recomputed
    with the same operations (same values) so parameter gradients still flow.  Writes that
    bypass version counters (``weight.data[...] = ...``) are not detected: call ``eval()``,
    ``train()`` or ``refresh()`` after them.
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
        super().__init__()
        if in_channels < 1 or out_channels < 1:
            raise ValueError("channel counts must be positive")
        if stride not in (1, 2):
            raise ValueError(f"SOC supports stride 1 or 2, got {stride}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"SOC needs an odd kernel size, got {kernel_size}")
        if train_terms < 2 or eval_terms < 2:
            raise ValueError("train_terms and eval_terms must be at least 2")
        if train_terms > MAX_TERMS or eval_terms > MAX_TERMS:
            raise ValueError(f"train_terms and eval_terms must be at most {MAX_TERMS}")
        if power_iters < 0:
            raise ValueError("power_iters must be non-negative")
        if power_iters > MAX_POWER_ITERS:
            raise ValueError(f"power_iters must be at most {MAX_POWER_ITERS}")
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = int(kernel_size)
        self.stride = int(stride)
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
        self._cache_key: tuple | None = None
        self._cache_S: Tensor | None = None
        self._bound_cache: tuple[tuple, float] | None = None
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
        self._invalidate()

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

    def _cache_token(self) -> tuple:
        w = self.weight
        token: list = [w._version, w.data_ptr(), w.dtype, w.device]
        for r in range(CONV_RESHAPES):
            u, v = self._power_vectors(r)
            token += [u._version, u.data_ptr(), v._version, v.data_ptr()]
        return tuple(token)

    def _invalidate(self) -> None:
        self._cache_key = None
        self._cache_S = None
        self._bound_cache = None

    def _eval_filter(self) -> Tensor:
        """The (detached) ``S`` used at evaluation, cached."""
        token = self._cache_token()
        if self._cache_S is None or self._cache_key != token:
            with torch.no_grad():
                S = self._compute_S(0)
            self._cache_S = S
            self._cache_key = self._cache_token()
        assert self._cache_S is not None
        return self._cache_S

    def skew_filter(self) -> Tensor:
        """``S = ½(W − T(W))/σ`` as used at evaluation (σ from the stored power vectors, no
        power step; detached, cached)."""
        return self._eval_filter()

    def train(self, mode: bool = True) -> "SOC":
        # a mode change drops the caches; .eval() on an eval layer keeps them, so the eval
        # lowering's matrix and the bound it adds to come from ONE computed filter
        if bool(mode) != self.training:
            self._invalidate()
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "SOC":  # .to(), .double(), ...
        self._invalidate()
        return super()._apply(fn, recurse)

    # ------------------------------------------------------------------ forward
    def _prepare_input(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"SOC expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        if self.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        extra = self.channels - x.shape[1]
        if extra > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, extra))
        return x.contiguous(memory_format=_working_format(x))

    def _series(self, x: Tensor, S: Tensor, terms: int) -> Tensor:
        if self.fast_grad and torch.is_grad_enabled() and (x.requires_grad or S.requires_grad):
            return soc_series_fast(x, S, terms)
        return soc_series(x, S, terms)

    def _linear(self, x: Tensor, S: Tensor, terms: int) -> Tensor:
        """The layer without its bias: unshuffle, pad, series, truncate."""
        z = self._series(self._prepare_input(x), S, terms)
        if self.channels > self.out_channels:
            z = z[:, : self.out_channels]
        return z

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            S = self._compute_S(self.power_iters)
            terms = self.train_terms
        else:
            if torch.is_grad_enabled() and self.weight.requires_grad:
                S = self._compute_S(0)
            else:
                S = self._eval_filter()
            terms = self.eval_terms
        z = self._linear(x, S, terms)
        # z is a fresh tensor (or a channel slice of one) that nothing else holds: add the
        # bias in place (no extra activation-sized buffer; same values)
        return z.add_(self.bias.view(1, -1, 1, 1))

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
        S = self._eval_filter()
        starts = [self._power_vectors(r)[1] for r in range(CONV_RESHAPES)]
        return conv_spectral_norm_upper_bound(
            S, rtol=rtol, select_rtol=select_rtol, skew=True, start_vectors=starts
        )

    def lipschitz_upper_bound(self) -> float:
        """Guaranteed bound on the l2 Lipschitz constant at ``eval_terms`` (SPEC §5):
        ``1 + b^T/T!·1/(1 − b/(T+1))`` with ``b`` = :meth:`spectral_bound` (or the plain
        ``Σ_{j<T} b^j/j!`` when smaller or when ``b ≥ T+1``).  Unshuffle, channel padding
        and truncation have norm ≤ 1; the bias does not matter.  Cached until the weight
        or a power vector changes."""
        key = (self._cache_token(), self.eval_terms)
        if self._bound_cache is not None and self._bound_cache[0] == key:
            return self._bound_cache[1]
        value = truncated_exp_norm_bound(self.spectral_bound(), self.eval_terms)
        self._bound_cache = (key, value)
        return value

    def lipschitz_estimate(self, input_shape: tuple[int, int, int], iters: int = 50) -> float:
        """Power-method estimate (a lower estimate) of the operator norm of
        ``x ↦ layer(x) − bias`` at ``eval_terms`` for inputs of shape ``(c_in, H, W)``."""
        S = self._eval_filter()
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

