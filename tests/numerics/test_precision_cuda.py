"""``full_float32_precision`` on CUDA (``cuda`` marker; skipped without a GPU): inside it a
cuDNN convolution and a matrix product agree with float64 to float32 accuracy (TF32 would
be off by about 1e-3), and the previous settings come back afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.numerics.precision import full_float32_precision, tf32_state


def relative_errors(device: torch.device) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, 16, 16, generator=gen)
    w = torch.randn(64, 64, 3, 3, generator=gen) / 24
    a, b = torch.randn(256, 512, generator=gen), torch.randn(512, 256, generator=gen)
    conv = F.conv2d(x.to(device), w.to(device), padding=1).cpu().double()
    conv_ref = F.conv2d(x.double(), w.double(), padding=1)
    mm = (a.to(device) @ b.to(device)).cpu().double()
    mm_ref = a.double() @ b.double()
    return (float((conv - conv_ref).norm() / conv_ref.norm()),
            float((mm - mm_ref).norm() / mm_ref.norm()))


@pytest.mark.cuda
def test_full_float32_precision_on_cuda():
    before = tf32_state()
    with full_float32_precision():
        conv_err, mm_err = relative_errors(torch.device("cuda"))
    assert tf32_state() == before
    assert conv_err < 1e-5 and mm_err < 1e-5, (conv_err, mm_err)
