"""The opt-in dense form of the SOC series on tiny CPU images
(``lipcli.builtins.soc.settings.CPU_DENSE_SMALL_IMAGES``): the same map and gradients as the
convolutions up to rounding, used only where it applies, off by default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.builtins.soc import settings
from lipcli.builtins.soc.layer import SOC
from lipcli.builtins.soc.series import dense_applies, dense_matrix


@pytest.fixture
def dense_on(monkeypatch):
    monkeypatch.setattr(settings, "CPU_DENSE_SMALL_IMAGES", True)


def test_off_by_default():
    assert settings.CPU_DENSE_SMALL_IMAGES is False  # the default path stays bit-identical


def test_dense_matrix_is_the_convolution():
    torch.manual_seed(0)
    S = torch.randn(5, 5, 3, 3, dtype=torch.float64)
    x = torch.randn(3, 5, 2, 2, dtype=torch.float64)
    M = dense_matrix(S, 2, 2)
    assert M.shape == (20, 20)
    y = (x.reshape(3, -1) @ M.T).view(x.shape)
    assert torch.allclose(y, F.conv2d(x, S, padding=1), rtol=0, atol=1e-13)
    D = S - S.transpose(0, 1).flip(2, 3)  # exactly skew filter -> exactly skew matrix
    Md = dense_matrix(D, 2, 2)
    assert torch.equal(Md.T, -Md)


def test_applies_only_to_tiny_cpu_images(dense_on):
    S3, S1 = torch.zeros(4, 4, 3, 3), torch.zeros(4, 4, 1, 1)
    assert dense_applies(torch.zeros(2, 4, 2, 2), S3)
    assert dense_applies(torch.zeros(2, 4, 2, 1), S3)
    assert not dense_applies(torch.zeros(2, 4, 4, 4), S3)  # 16 pixels: not within one tap
    assert not dense_applies(torch.zeros(2, 4, 3, 3), S3)  # 9 pixels = 9 taps: no gain
    assert not dense_applies(torch.zeros(2, 4, 1, 1), S1)  # already a matrix product
    settings.CPU_DENSE_SMALL_IMAGES = False
    assert not dense_applies(torch.zeros(2, 4, 2, 2), S3)


@pytest.mark.parametrize("fast_grad", [True, False])
@pytest.mark.parametrize("shape", [(8, 8, 2, 1), (4, 16, 4, 2)])  # (c_in, c_out, H, stride)
def test_same_map_and_gradients_as_the_convolutions(shape, fast_grad, monkeypatch):
    c_in, c_out, H, stride = shape
    torch.manual_seed(1)
    layer = SOC(c_in, c_out, 3, stride, fast_grad=fast_grad, power_iters=0).double()
    x = torch.randn(3, c_in, H, H, dtype=torch.float64, requires_grad=True)
    results = []
    for dense in (False, True):
        monkeypatch.setattr(settings, "CPU_DENSE_SMALL_IMAGES", dense)
        layer.zero_grad()
        x.grad = None
        layer.train()
        y = layer(x)
        (y * torch.cos(y)).sum().backward()
        layer.eval()
        with torch.no_grad():
            y_eval = layer(x)
        results.append((y.detach(), y_eval, layer.weight.grad.clone(), layer.bias.grad.clone(), x.grad.clone()))
    (conv, dense) = results
    for a, b in zip(conv, dense):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12 * float(b.abs().max()))
    # and the dense form really ran: float32 values differ from the convolutions' in rounding
    layer32 = SOC(c_in, c_out, 3, stride, power_iters=0).train()
    x32 = torch.randn(64, c_in, H, H)
    monkeypatch.setattr(settings, "CPU_DENSE_SMALL_IMAGES", False)
    y_conv = layer32(x32)
    monkeypatch.setattr(settings, "CPU_DENSE_SMALL_IMAGES", True)
    y_dense = layer32(x32)
    assert not torch.equal(y_conv, y_dense)
    assert torch.allclose(y_conv, y_dense, rtol=1e-4, atol=1e-5)
