"""Full float32 precision for certification on GPUs.

PyTorch lets cuDNN run float32 convolutions in TF32 by default (``torch.backends.cudnn.
allow_tf32``): a 10-bit mantissa, i.e. relative errors around 1e-3 in every SOC convolution of
a 15-term series.  A certificate divides a logit margin computed by the network by its
Lipschitz constant; margins computed in TF32 are not the margins of the stored float32
network, so certification, the Lipschitz estimate and attack verification run with TF32 off
for convolutions and matrix products (no effect on CPU).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def _new_api() -> bool:
    """torch ≥ 2.9 configures TF32 per backend through ``fp32_precision`` (mixing it with the
    legacy ``allow_tf32`` flags is an error there)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    return hasattr(conv, "fp32_precision") and hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_state() -> tuple[Any, Any]:
    """The current (convolution, matmul) float32 precision settings, in the API in use."""
    if _new_api():
        return torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def _set_tf32_state(conv: Any, matmul: Any) -> None:
    if _new_api():
        torch.backends.cudnn.conv.fp32_precision = conv
        torch.backends.cuda.matmul.fp32_precision = matmul
    else:
        torch.backends.cudnn.allow_tf32 = conv
        torch.backends.cuda.matmul.allow_tf32 = matmul


#: the settings :func:`full_float32_precision` applies (new API, legacy API)
FULL_PRECISION = {True: ("ieee", "ieee"), False: (False, False)}


@contextmanager
def full_float32_precision() -> Iterator[None]:
    """Disable TF32 in cuDNN convolutions and CUDA matrix products inside the block (and
    restore the previous settings afterwards)."""
    before = tf32_state()
    try:
        _set_tf32_state(*FULL_PRECISION[_new_api()])
        yield
    finally:
        _set_tf32_state(*before)


def in_full_float32_precision(fn: F) -> F:
    """Decorator form of :func:`full_float32_precision`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with full_float32_precision():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
