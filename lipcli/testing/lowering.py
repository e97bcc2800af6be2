"""Eval-lowering conformance checks for convolution layers that offer ``eval_linear_map``
(re-exported by :mod:`lipcli.testing`; see :mod:`lipcli.sdk.lowering`).

A layer's ``eval_linear_map(shape)`` is its eval map as one matrix with a guaranteed
``error`` bound; ``lip certify`` and ``lip export`` may run the layer as that dense matrix.
The checks:

* :func:`check_eval_linear_map` -- ``matrix · vec(x) = layer(x) − bias`` on random inputs;
* :func:`check_eval_error_covers` -- ``‖matrix − reference‖₂ ≤ error`` against an exact
  reference map in 80-bit extended precision (:func:`circular_conv_reference`,
  :func:`fourier_reference`, :func:`reference_on_input` build them independently of the
  layer; :func:`check_reference_is_the_layer` checks a reference's own semantics);
* :func:`check_dense_bound` -- the dense stand-in's bound covers its float32 matrix;
* :func:`check_export_choice` -- ``export_module(context)`` goes dense exactly where the
  matrix fits the cap and pays;
* :func:`check_fourier_layer` -- all of the above for a
  :class:`~lipcli.sdk.fourier.FourierConvBase` layer.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.lowering import LoweringContext
from lipcli.sdk.lowering import DenseOperator, dense_operator

__all__ = [
    "LD",
    "check_dense_bound",
    "check_eval_error_covers",
    "check_eval_linear_map",
    "check_export_choice",
    "check_fourier_layer",
    "check_reference_is_the_layer",
    "circular_conv_reference",
    "extended_spectral_norm",
    "fourier_reference",
    "reference_on_input",
    "unshuffle_matrix",
]

#: 80-bit extended precision (numpy's ``longdouble`` on x86) for the exact reference maps
LD = np.longdouble


def unshuffle_matrix(cin: int, size: tuple[int, int], stride: int) -> np.ndarray:
    """The 0/1 matrix of ``pixel_unshuffle(·, stride)`` on ``(cin, H, W)`` inputs."""
    d = cin * size[0] * size[1]
    basis = torch.eye(d, dtype=torch.float64).view(d, cin, *size)
    return F.pixel_unshuffle(basis, stride).reshape(d, d).T.numpy().astype(LD)


def fourier_reference(op: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """The exact map ``x ↦ irfft2(op · rfft2(x))`` (``op``: half-plane matrices, complex) in
    80-bit extended precision, by its definition: ``y[o, p] = (1/N) Σ_f w_f Re(Σ_i op(f)[o, i]
    x̂_i(f) e^{2πi f·p})`` (``w_f = 1`` for the DC and Nyquist columns), one complex
    exponential per frequency and pixel (no circulant structure, no table)."""
    H, W = size
    bins = W // 2 + 1
    q = op.detach().resolve_conj().to(torch.complex128).numpy().astype(np.clongdouble)
    two_pi = 2 * np.arccos(LD(-1))
    fy, fx = np.meshgrid(np.arange(H), np.arange(bins), indexing="ij")
    py, px = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    phase = (np.outer(fy.ravel(), py.ravel()).astype(LD) / H + np.outer(fx.ravel(), px.ravel()).astype(LD) / W)
    E = np.exp(1j * two_pi * phase)  # (bins, pixels), e^{2πi f·p}
    w = np.full(bins, 2.0)
    w[0] = 1.0
    if W % 2 == 0:
        w[-1] = 1.0
    w = np.tile(w, H).astype(LD)
    # P[o, p, i, q] = (1/N) Σ_f w_f Re(op[f, o, i] E[f, p] conj E[f, q])
    P = np.einsum("foi,fp,fq->opiq", q * w[:, None, None], E, np.conj(E)).real / (H * W)
    return P.reshape(q.shape[1] * H * W, q.shape[2] * H * W)


def circular_conv_reference(K: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """The exact matrix of the circular cross-correlation with ``K`` on an ``H × W`` torus in
    80-bit extended precision, tap by tap and pixel by pixel."""
    H, W = size
    out, cin, kh, kw = K.shape
    k = K.detach().double().numpy().astype(LD)
    P = np.zeros((out, H, W, cin, H, W), dtype=LD)
    for y in range(H):
        for x in range(W):
            for a in range(kh):
                for b in range(kw):
                    P[:, y, x, :, (y + a - kh // 2) % H, (x + b - kw // 2) % W] += k[:, :, a, b]
    return P.reshape(out * H * W, cin * H * W)


def extended_spectral_norm(m: np.ndarray) -> float:
    return float(np.linalg.norm(m.astype(np.float64), 2))


def check_eval_linear_map(layer: nn.Module, shape: tuple[int, int, int], rtol: float) -> None:
    """``matrix·vec(x) = layer(x) − bias`` on random inputs (a float64 eval layer)."""
    linear = layer.eval_linear_map(shape)
    assert linear is not None, f"eval_linear_map({shape}) returned None"
    x = torch.randn(4, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y = layer(x) - layer.bias.view(1, -1, 1, 1)
    assert tuple(y.shape[1:]) == tuple(linear.output_shape)
    got = (x.flatten(1) @ linear.matrix.T).view_as(y)
    error = float((got - y).norm() / y.norm())
    assert error <= rtol, f"matrix · vec(x) differs from layer(x) − bias by {error:.3g} (relative; at most {rtol:g})"


def check_eval_error_covers(layer: nn.Module, shape: tuple[int, int, int], reference: np.ndarray,
                       at_most: float) -> float:
    """``‖matrix − reference‖₂ ≤ error ≤ at_most`` (``reference``: the exact map in extended
    precision, on the original input); returns the observed distance."""
    linear = layer.eval_linear_map(shape)
    assert linear is not None, f"eval_linear_map({shape}) returned None"
    observed = extended_spectral_norm(linear.matrix.numpy().astype(LD) - reference)
    assert observed <= linear.error, f"the matrix is {observed:.3g} from the exact map, above its error {linear.error:.3g}"
    assert linear.error <= at_most, f"the error bound {linear.error:.3g} is above {at_most:g}"
    return observed


def check_dense_bound(layer: nn.Module, shape: tuple[int, int, int]) -> DenseOperator:
    """The dense operator of the layer's map is the float32 layer and
    ``‖M₃₂‖₂ ≤ U + bound_excess``."""
    dense = dense_operator(layer.eval_linear_map(shape), shape)
    norm = float(torch.linalg.matrix_norm(dense.matrix.double(), ord=2))
    assert norm <= layer.lipschitz_upper_bound() + dense.bound_excess, (
        f"the dense matrix's norm {norm!r} is above the layer's bound plus the excess {dense.bound_excess:.3g}")
    assert 0 <= dense.bound_excess < 1e-5
    x = torch.randn(5, *shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = layer(x)
        assert float((dense(x) - ref).norm() / ref.norm()) <= 1e-5
    return dense


def reference_on_input(P: np.ndarray, cin: int, shape: tuple[int, int, int], stride: int) -> np.ndarray:
    """``P`` (on the rearranged input) composed with the stride-2 rearrangement."""
    if stride == 1:
        return P
    return P @ unshuffle_matrix(cin, shape[1:], stride)


def check_reference_is_the_layer(P: np.ndarray, layer64: nn.Module, shape: tuple[int, int, int]) -> None:
    """The reference ``P`` applied to random inputs equals the float64 ``layer64`` (checks the
    reference's own semantics against torch's FFTs or convolutions)."""
    x = torch.randn(3, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        y = layer64(x) - layer64.bias.view(1, -1, 1, 1)
    got = (x.flatten(1).numpy().astype(LD) @ P.T).astype(np.float64)
    assert np.linalg.norm(got - y.flatten(1).numpy()) <= 1e-12 * math.sqrt(max(1.0, float(y.norm()) ** 2))


def check_export_choice(layer: nn.Module, shape: tuple[int, int, int], literal: type) -> None:
    """``export_module(context)``: dense exactly when the matrix fits the cap and costs at most
    the literal form's operations (``series_flops_per_image``); ``literal`` otherwise, with a
    zero cap and with a cap one byte under the matrix."""
    assert isinstance(layer.export_module(LoweringContext(shape, 0)), literal)
    chosen = layer.export_module(LoweringContext(shape, 2**30))
    facts = chosen.export_lowering
    pays = facts["dense_flops_per_image"] <= facts["series_flops_per_image"]
    assert isinstance(chosen, DenseOperator if pays else literal)
    assert (facts["lowering"] == "dense") == pays, facts
    if pays:  # one byte under the matrix: literal
        nbytes = round(facts["dense_mib"] * 2**20)
        assert isinstance(layer.export_module(LoweringContext(shape, nbytes - 1)), literal)
        assert isinstance(layer.export_module(LoweringContext(shape, nbytes)), DenseOperator)


def check_fourier_layer(layer: nn.Module, shape: tuple[int, int, int]) -> None:
    """A float32 :class:`~lipcli.sdk.fourier.FourierConvBase` layer that has seen ``shape``:
    the 80-bit reference of the exact map of its eval matrices is the map its stand-in
    computes in float64, the matrix's error covers the distance to it, and the dense
    operator's bound covers its float32 matrix."""
    cin, h, w = shape
    stride = layer.stride
    size = (h // stride, w // stride)
    op = layer.eval_operator(size)
    P = op[0].double().numpy().astype(LD) if size == (1, 1) else fourier_reference(op, size)
    P = reference_on_input(P, cin, shape, stride)
    check_reference_is_the_layer(P, layer.export_module().double(), shape)
    check_eval_error_covers(layer, shape, P, at_most=1e-11)
    check_dense_bound(layer, shape)
