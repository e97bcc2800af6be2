"""``lip export`` of the Cayley layer: the stand-in (:class:`ExportedCayley`, the layer's
Fourier-domain map with ``Q`` baked) equals the eval-mode layer in float64 for even and odd
sizes, non-square images, stride 2 and ``1 × 1`` images, both in its FFT form (pt2,
TorchScript) and in its real-matrix form (ONNX), whose transforms are the DFT; it survives
``torch.export`` as aten operations only; a layer that has not seen an input says so (the
ONNX program itself runs in lipcli's tests/plugins/test_zoo_export.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.sdk.errors import LipError
from lipcli_cayley import CayleyConv
from lipcli.sdk.fourier_export import ExportedFourierConv as ExportedCayley, fourier_matrices

import lipcli.testing as checks

#: (in, out, stride, H, W) before the rearrangement: even square, odd width (no Nyquist
#: column), stride 2 with in < out, in > out, a 1-pixel-wide image, stride 2 to 1x1, 1x1
CASES = [(4, 4, 1, 6, 6), (4, 4, 1, 4, 5), (3, 8, 2, 8, 6), (8, 4, 1, 5, 7), (4, 4, 1, 6, 1),
         (4, 6, 2, 2, 2), (4, 4, 1, 1, 1)]


def random_layer(cin: int, cout: int, stride: int, size: tuple[int, int], seed: int = 0) -> CayleyConv:
    """A float64 eval-mode layer with random weights, scale and bias that has seen one input
    of ``size`` (it records its image size then)."""
    layer = checks.randomise_parameters(CayleyConv(cin, cout, 3, stride).double().eval(), seed)
    with torch.no_grad():
        layer(torch.zeros(1, cin, *size, dtype=torch.float64))
    return layer


@pytest.mark.parametrize("cin, cout, stride, h, w", CASES)
def test_stand_in_equals_the_eval_layer(cin, cout, stride, h, w):
    layer = random_layer(cin, cout, stride, (h, w), seed=cin + 10 * cout + h + w)
    x = torch.randn(3, cin, h, w, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    standin = checks.check_export_module(layer, ExportedCayley, x)  # pt2/TorchScript: the FFT path
    assert not any(b.is_complex() for b in standin.buffers())
    if h * w // stride**2 > 1:  # ONNX: real matrix products only
        with torch.no_grad():
            real = standin.real_products(F.pixel_unshuffle(x, stride)) + standin.bias.view(1, -1, 1, 1)
            assert checks.relative_error(real, layer(x)) <= 1e-12


@pytest.mark.parametrize("h, w", [(6, 6), (5, 7)])
def test_the_real_matrices_are_the_dft(h, w):
    """Steps 1-2 give ``rfft2``; steps 4-5 invert it (``irfft2``), also for spectra whose
    DC/Nyquist columns have imaginary parts (which ``irfft2`` ignores)."""
    m = fourier_matrices(h, w)
    f = w // 2 + 1
    x = torch.randn(2, 3, h, w, dtype=torch.float64)
    a = x @ m["forward_w"]
    spectrum = m["forward_h"] @ torch.cat([a[..., :f], a[..., f:]], dim=2)
    expected = torch.fft.rfft2(x)
    torch.testing.assert_close(spectrum[..., :h, :], expected.real, rtol=0, atol=1e-12)
    torch.testing.assert_close(spectrum[..., h:, :], expected.imag, rtol=0, atol=1e-12)
    z = torch.randn(2, 3, h, f, dtype=torch.complex128)
    inner = m["inverse_h"] @ torch.cat([z.real, z.imag], dim=2)
    y = torch.cat([inner[..., :h, :], inner[..., h:, :]], dim=-1) @ m["inverse_w"]
    torch.testing.assert_close(y, torch.fft.irfft2(z, s=(h, w)), rtol=0, atol=1e-12)


def test_a_layer_that_has_not_seen_an_input_cannot_be_exported():
    with pytest.raises(LipError, match="has not seen an input"):
        CayleyConv(4, 4).eval().export_module()


@pytest.mark.parametrize("stride, size", [(1, 6), (2, 2)])
def test_stand_in_survives_torch_export(stride, size):
    layer = random_layer(4, 8, stride, (size, size), seed=stride)
    program = checks.check_aten_program(layer.export_module(), torch.randn(2, 4, size, size, dtype=torch.float64))
    x = torch.randn(5, 4, size, size, dtype=torch.float64)
    with torch.no_grad():
        assert checks.relative_error(program(x), layer(x)) <= 1e-12
