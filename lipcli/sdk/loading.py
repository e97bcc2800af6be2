"""Building a network whose tensors a model file is about to replace.

:func:`lipcli.load_model` builds the network from the file's config and then overwrites every
parameter and persistent buffer with the file's tensors.  While it builds,
:func:`tensors_will_be_loaded` is true, so a component's constructor may skip initialisation
*work* whose result the loaded tensors replace (SOC skips its construction-time power
iteration: 50 steps on four reshapes per layer).  The contract: whatever is skipped must live
only in the state dict (parameters, persistent buffers), never in other attributes, so the
loaded module is the same whether or not the work ran.  Random initialisation itself is cheap
and need not be skipped.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("lipcli_tensors_will_be_loaded", default=False)


def tensors_will_be_loaded() -> bool:
    """True while the host builds a model whose state dict is then loaded from a file."""
    return _LOADING.get()


@contextlib.contextmanager
def loading_tensors() -> Iterator[None]:
    """The host's side: build inside this block, then load the state dict."""
    token = _LOADING.set(True)
    try:
        yield
    finally:
        _LOADING.reset(token)


def adopt_lazy_buffers(model: "object", tensors: "dict") -> None:
    """The host's side of ``lip_lazy_buffers``: a module may name buffers that it sizes from its
    first input (e.g. CPL's power-iteration vector ``u``, the shape of the layer's input, which
    its factory does not know); built empty (a dimension of 0), they take the shape of the
    file's tensor of that name before the shapes are compared.  Only a zero dimension may
    change, so nothing larger than the file's own tensor is allocated."""
    import torch

    for name, module in model.named_modules():  # type: ignore[attr-defined]
        for buf in getattr(module, "lip_lazy_buffers", ()):
            key = f"{name}.{buf}" if name else buf
            got, ref = tensors.get(key), getattr(module, buf, None)
            if (isinstance(got, torch.Tensor) and isinstance(ref, torch.Tensor) and ref.numel() == 0
                    and got.dim() == ref.dim() and got.dtype == ref.dtype
                    and all(r in (0, g) for r, g in zip(ref.shape, got.shape))):
                setattr(module, buf, torch.empty(got.shape, dtype=ref.dtype, device=ref.device))
