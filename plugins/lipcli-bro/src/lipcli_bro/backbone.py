"""The BRONet backbone's two pieces around its BRO layers (``ntuaislab/BRONet``,
``bronet/models/backbone.py::LiResConvOrtho``, commit 9d59c9bd15e8), options of the ``bronet``
architecture (:mod:`lipcli_bro.bronet`: ``quasi_residual=true``, ``centering=true``).

**Quasi-residual parametrisation** (:class:`QuasiResidualBRO`, their lines 226-229).  The
BRO layer's low-rank filter is not trained directly: it is

    ``V = V₀ + (γ ⊙ W) · depth^-1/2``

with ``V₀`` the identity start (``[I_r; 0]`` on the centre tap, a buffer), ``W`` a free
``c × r × 3 × 3`` filter initialised ``N(0, 1)/(c·9)`` and ``γ`` a learnable scale per output
row of ``V`` (``c`` values, initialised to 1; the authors' ``gamma`` of shape
``(depth, width, 1, 1, 1)``).  The layer is ``BRO(V)``: a reflector for *every* ``V`` of full
column rank, so the parametrisation changes what training explores, not the bound; the layer's
``lipschitz_upper_bound()`` is :class:`~lipcli_bro.bro.BROConv`'s verified bound of the float
matrices built from the current ``V`` (its cache key holds ``W``, ``γ`` and the buffers, so
any change of ``γ`` recomputes it).

**Centring** (:class:`Centering`, their lines 184-202), after each BRO layer and before its
activation: in training ``y = z − mean_{n,h,w}(z) + β`` (the mean per channel over the batch
and the pixels, with gradient; a running mean with momentum 0.1 is kept), in evaluation
``y = z − running_mean + β``.  Bound: evaluation is a translation (Lipschitz 1, so the network
bound is unchanged).  Training is a map of the whole batch ``Z``: ``Y = (I − P) Z + β`` with
``P`` the per-channel average over batch and pixels broadcast back, an orthogonal projection,
so ``‖I − P‖₂ ≤ 1``: the centred BRO layer ``(I − P)·BRO`` has the BRO layer's bound in both
modes (in the Frobenius norm of batches in training).  The BRO layer's own bias is a constant
per channel that the centring removes exactly; it is frozen at 0 (``requires_grad=False``) so
that no rounding residue of its zero gradient moves it, and ``β`` is the block's bias.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lipcli.sdk.specs import ONE_LIPSCHITZ

from .bro import BROConv

#: the running mean's update rate (the authors' 0.1)
MOMENTUM = 0.1


class QuasiResidualBRO(BROConv):
    """:class:`~lipcli_bro.bro.BROConv` whose filter is ``V₀ + (γ ⊙ W)·scale`` (module
    docstring); ``scale`` is the network's ``depth^-1/2``.  Parameters ``weight`` (``W``),
    ``gamma`` (``(c, 1, 1, 1)``) and ``bias``; non-persistent buffer ``identity`` (``V₀``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, *,
                 scale: float, **bro_params: object) -> None:
        if bro_params.get("init", "identity") != "identity":
            raise ValueError("quasi_residual starts from the identity filter; drop the bro init parameter")
        super().__init__(in_channels, out_channels, kernel_size, stride, **bro_params)  # type: ignore[arg-type]
        if not 0.0 < scale <= 1.0:
            raise ValueError(f"quasi_residual scale must be in (0, 1], got {scale}")
        self.scale = float(scale)
        c, r, k = self.channels, self.rank, self.kernel_size
        # [I_r; 0] on the centre tap: a constant made from the shapes, not stored in model files
        self.register_buffer("identity", self.weight.detach().clone(), persistent=False)
        with torch.no_grad():
            self.weight.copy_(torch.randn(c, r, k, k) / (c * k * k))
        self.gamma = nn.Parameter(torch.ones(c, 1, 1, 1))

    def filter(self) -> Tensor:
        """``V = V₀ + (γ ⊙ W)·scale``, the filter BRO reflects through."""
        return self.identity + self.weight * self.gamma * self.scale

    def operator_settings(self) -> tuple:
        return (*super().operator_settings(), self.scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, quasi_residual scale={self.scale:g}"


class Centering(nn.Module):
    """``(N, C, H, W) → (N, C, H, W)``: per-channel batch centring plus a bias ``β``
    (module docstring).  Parameter ``bias`` (``β``); buffer ``running_mean``.  1-Lipschitz
    (its promise): a translation in evaluation, ``(I − P)`` plus a constant in training."""

    lip_promises: tuple[str, ...] = (ONE_LIPSCHITZ,)
    no_weight_decay: tuple[str, ...] = ("bias",)

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))

    def forward(self, z: Tensor) -> Tensor:
        if not self.training:
            return z + self.eval_bias().to(z.dtype).view(1, -1, 1, 1)
        mean = z.mean(dim=(0, 2, 3))
        with torch.no_grad():
            self.running_mean.add_((mean.detach().to(self.running_mean.dtype) - self.running_mean) * MOMENTUM)
        return z + (self.bias.to(z.dtype) - mean).view(1, -1, 1, 1)

    def eval_bias(self) -> Tensor:
        """``β − running_mean``: the evaluation-mode shift."""
        return self.bias - self.running_mean

    def export_module(self) -> nn.Module:
        """``lip export``: the evaluation-mode shift as a plain addition."""
        return _Shift(self.eval_bias().detach().clone())

    def extra_repr(self) -> str:
        return f"channels={self.bias.numel()}, momentum={MOMENTUM}"


class _Shift(nn.Module):
    """``z + b`` per channel with ``b`` a buffer."""

    def __init__(self, shift: Tensor) -> None:
        super().__init__()
        self.register_buffer("shift", shift)

    def forward(self, z: Tensor) -> Tensor:
        return z + self.shift.to(z.dtype).view(1, -1, 1, 1)
