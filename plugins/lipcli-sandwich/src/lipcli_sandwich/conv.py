"""The ``sandwich`` convolution component (Wang & Manchester, ICML 2023, Alg. 1), as the
comparison study's ``SandwichConv`` computes it, with a verified bound (:mod:`lipcli_sandwich.core`).

``SandwichConv(in, out, kernel_size, stride)``: stride 2 is ``pixel_unshuffle(x, 2)`` first (a
permutation; ``p = 4·in`` channels; the study's layer has no stride 2), then per bin ``f`` of the
``H × W`` torus (circular padding, one image size: recorded at the first forward pass in the
buffer ``spatial_size`` and saved with the model; others are refused):

    ``x̃ = rfft2(x)``, ``h = irfft2(√2·Ψ⁻¹B̃ x̃) + b``, ``y = irfft2(√2·ÃᴴΨ rfft2(ReLU(h)))``

with ``[Ã B̃] = Cayley(α·P̃/‖P̃‖_F)`` and ``P̃`` the centred spectrum of ``weight``
(``out × (out + p) × k × k``).  Parameters as the study's: ``weight``, ``bias`` (``out``),
``psi`` (``out``, zero at start) and ``alpha`` (set to ``‖P̃‖_F`` at the first forward pass, as
theirs), PyTorch's ``Conv2d`` initialisation.  ``psi_in_bias`` computes the same function with
``Ψ`` folded into the bias (the study's ``numerical_stable``).

Differences from the study's code, none in the function for the sizes it uses: ``irfft2`` is
given the image size (their default output size is wrong for odd sizes and 1×1 images); the
eval matrices are recomputed whenever a parameter changed (theirs keep those of the last
training pass, which lag one optimiser step behind).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .core import SQRT2, cayley, centred_spectrum, conjugate_defect, product_error, sandwich_bound

__all__ = ["SandwichConv"]


class SandwichConv(nn.Module):
    """Sandwich convolution ``(N, in, H, W) → (N, out, H/s, W/s)`` (module docstring)."""

    lip_affine = False
    spatial_size: Tensor

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, *,
                 psi_in_bias: bool = False) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"SandwichConv supports stride 1 or 2, got {stride}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"SandwichConv needs an odd kernel size, got {kernel_size}")
        if int(in_channels) < 1 or int(out_channels) < 1:
            raise ValueError("SandwichConv: channel counts must be positive")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size, self.stride = int(kernel_size), int(stride)
        self.conv_in_channels = self.in_channels * self.stride**2
        self.psi_in_bias = bool(psi_in_bias)
        # torch's Conv2d initialisation, as the study's layer (a Conv2d subclass)
        conv = nn.Conv2d(self.conv_in_channels + self.out_channels, self.out_channels, self.kernel_size)
        self.weight = nn.Parameter(conv.weight.detach().clone())
        self.bias = nn.Parameter(conv.bias.detach().clone())
        self.psi = nn.Parameter(torch.zeros(self.out_channels))
        self.alpha = nn.Parameter(torch.zeros(()))
        self.register_buffer("spatial_size", torch.zeros(2, dtype=torch.int64))
        self._cache: tuple[tuple, tuple[Tensor, Tensor, Tensor], float | None] | None = None

    # ------------------------------------------------------------------ size
    def _size(self) -> tuple[int, int] | None:
        h, w = (int(v) for v in self.spatial_size.tolist())
        return (h, w) if h > 0 else None

    def rearrange(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"SandwichConv expected input (N, {self.in_channels}, H, W), got {tuple(x.shape)}")
        if self.stride == 2:
            if x.shape[-1] % 2 or x.shape[-2] % 2:
                raise ValueError(f"SandwichConv with stride 2 needs even H and W, got {tuple(x.shape)}")
            x = F.pixel_unshuffle(x, 2)
        size = (int(x.shape[-2]), int(x.shape[-1]))
        recorded = self._size()
        if recorded is None:
            with torch.no_grad():
                self.spatial_size.copy_(torch.tensor(size, dtype=torch.int64))
                self.alpha.copy_(torch.linalg.vector_norm(centred_spectrum(self.weight, size)).to(self.alpha.dtype))
        elif recorded != size:
            raise ValueError(f"SandwichConv was sized for {recorded[0]}x{recorded[1]} images (after the "
                             f"rearrangement) and got {size[0]}x{size[1]}: its matrices and bound are for one size")
        return x

    # ------------------------------------------------------------------ operators
    def compute_operators(self, size: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
        """``(Q, √2Ψ⁻¹B̃, √2ÃᴴΨ)`` per bin (the latter two with ``Ψ`` left out for
        ``psi_in_bias``), differentiable; the products in the study's order."""
        q = self.out_channels
        wfft = centred_spectrum(self.weight, size)
        Q = cayley(self.alpha * wfft / wfft.norm())
        A, B = Q[:, :, :q], Q[:, :, q:]
        Ah = A.conj().transpose(1, 2)
        if self.psi_in_bias:
            return Q, SQRT2 * B, SQRT2 * Ah
        down = torch.exp(-self.psi).diag().type(Q.dtype)
        up = torch.exp(self.psi).diag().type(Q.dtype)
        return Q, SQRT2 * down @ B, SQRT2 * Ah @ up

    def _token(self) -> tuple:
        return tuple((t._version, t.data_ptr(), t.dtype, t.device)
                     for t in (*self.parameters(), self.spatial_size)) + (self.psi_in_bias,)

    def invalidate(self) -> None:
        self._cache = None

    def train(self, mode: bool = True) -> "SandwichConv":
        self._cache = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> "SandwichConv":
        self._cache = None
        return super()._apply(fn, recurse)

    def eval_operators(self) -> tuple[Tensor, Tensor, Tensor]:
        size = self._size()
        if size is None:
            raise ValueError("SandwichConv: no image size yet (run one forward pass first)")
        token = self._token()
        if self._cache is None or self._cache[0] != token:
            with torch.no_grad():
                ops = self.compute_operators(size)
            self._cache = (token, ops, None)
        return self._cache[1]

    # ------------------------------------------------------------------ forward
    def apply_operators(self, x: Tensor, ops: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        _Q, op1, op2 = ops
        n, _, H, W = x.shape
        q, p = self.out_channels, self.conv_in_channels
        xfft = torch.fft.rfft2(x).permute(2, 3, 1, 0).reshape(-1, p, n)
        h = torch.fft.irfft2((op1 @ xfft).reshape(H, W // 2 + 1, q, n).permute(3, 2, 0, 1), s=(H, W))
        bias = torch.exp(self.psi) * self.bias if self.psi_in_bias else self.bias
        h = F.relu(h + bias[:, None, None])
        hfft = torch.fft.rfft2(h).permute(2, 3, 1, 0).reshape(-1, q, n)
        return torch.fft.irfft2((op2 @ hfft).reshape(H, W // 2 + 1, q, n).permute(3, 2, 0, 1), s=(H, W))

    def forward(self, x: Tensor) -> Tensor:
        z = self.rearrange(x)
        needs_graph = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if self.training or needs_graph:
            size = self._size()
            assert size is not None
            return self.apply_operators(z, self.compute_operators(size))
        return self.apply_operators(z, self.eval_operators())

    # ------------------------------------------------------------------ Lipschitz
    def lipschitz_upper_bound(self) -> float:
        """GUARANTEED bound of the eval layer (:func:`lipcli_sandwich.core.sandwich_bound` of its
        cached matrices), cached."""
        Q, op1, op2 = self.eval_operators()
        assert self._cache is not None
        if self._cache[2] is None:
            size = self._size()
            assert size is not None
            value = sandwich_bound(Q, self.psi, delta=conjugate_defect(Q, size), stable=self.psi_in_bias,
                                   extra=product_error(op1, op2))
            self._cache = (self._cache[0], self._cache[1], value)
        return float(self._cache[2])

    def lipschitz_estimate(self, input_shape: tuple[int, int, int], iters: int = 50) -> float:
        """LOWER estimate: power iteration on ``JᵀJ`` at one seeded random input."""
        gen = torch.Generator(device="cpu").manual_seed(0)
        dtype, device = self.weight.dtype, self.weight.device
        x0 = torch.randn((1, *input_shape), generator=gen, dtype=dtype).to(device)
        v = torch.randn((1, *input_shape), generator=gen, dtype=dtype).to(device)
        ops = self.eval_operators()
        fn = lambda t: self.apply_operators(self.rearrange(t), ops)  # noqa: E731
        estimate = 0.0
        with torch.enable_grad():
            for _ in range(max(1, iters)):
                v = v / torch.linalg.vector_norm(v)
                _, jv = torch.autograd.functional.jvp(fn, x0, v)
                estimate = float(torch.linalg.vector_norm(jv))
                _, v = torch.autograd.functional.vjp(fn, x0, jv)
        return estimate

    def export_module(self) -> nn.Module:
        """``lip export``: the two cached per-bin products as two Fourier convolutions with a
        ReLU between (:class:`lipcli_sandwich.export.ExportedSandwich`; ONNX too)."""
        from .export import ExportedSandwich

        with torch.no_grad():
            _Q, op1, op2 = self.eval_operators()
            bias = torch.exp(self.psi) * self.bias if self.psi_in_bias else self.bias
            return ExportedSandwich(op1, op2, bias, size=self._size(), stride=self.stride)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, psi_in_bias={self.psi_in_bias}")
