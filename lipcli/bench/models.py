"""The models ``lip bench`` times: freshly initialised ones (:func:`build_model`) and the
fast/exact twins of Table 1 that share their weights (:func:`build_twins`)."""

from __future__ import annotations

import torch
from torch import nn

from lipcli.sdk.errors import LipUsageError
from lipcli.host.models import create_model

#: the two convolutions compared in Table 1
FAST_CONV, EXACT_CONV = "soc-fast", "soc"


def build_model(
    arch: str,
    *,
    conv: str,
    head: str = "lln",
    pool: str = "max",
    width: int = 32,
    num_classes: int = 10,
    seed: int = 0,
) -> nn.Module:
    """A freshly initialised model (global RNG seeded with ``seed``; CPU)."""
    torch.manual_seed(seed)
    return create_model(
        arch, conv=conv, head=head, pool=pool, num_classes=num_classes, width=width
    )


def state_dicts_identical(a: nn.Module, b: nn.Module) -> bool:
    """True iff ``a`` and ``b`` have the same state-dict keys and bit-identical tensors."""
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return False
    for key, ta in sa.items():
        tb = sb[key]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            return False
        if not torch.equal(ta.detach().cpu(), tb.detach().cpu()):
            return False
    return True


def build_twins(
    arch: str,
    *,
    fast_conv: str = FAST_CONV,
    exact_conv: str = EXACT_CONV,
    head: str = "lln",
    pool: str = "max",
    width: int = 32,
    num_classes: int = 10,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[nn.Module, nn.Module, bool]:
    """``(fast_model, exact_model, identical)``: the exact model carries the fast one's weights.

    Both are built (the exact one with a different seed, so a failed copy could not go
    unnoticed), then ``exact.load_state_dict(fast.state_dict(), strict=True)``; ``identical``
    is :func:`state_dicts_identical` after the copy (checked before moving to ``device``).
    """
    fast = build_model(arch, conv=fast_conv, head=head, pool=pool, width=width,
                       num_classes=num_classes, seed=seed)
    exact = build_model(arch, conv=exact_conv, head=head, pool=pool, width=width,
                        num_classes=num_classes, seed=seed + 1)
    try:
        exact.load_state_dict(fast.state_dict(), strict=True)
    except RuntimeError as exc:
        raise LipUsageError(
            f"convolutions {fast_conv!r} and {exact_conv!r} do not share a state dict: {exc}"
        ) from None
    identical = state_dicts_identical(fast, exact)
    return fast.to(device), exact.to(device), identical


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
