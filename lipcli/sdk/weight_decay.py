"""Which parameters weight decay leaves alone: the architecture protocol's
``no_weight_decay_parameters()`` and its default."""

from __future__ import annotations

from typing import Any


def no_weight_decay_names(model: Any) -> set[str]:
    """Full names of ``model``'s parameters that its submodules list in their
    ``no_weight_decay`` attribute (local names), e.g. SOC filters and the LLN weight."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        for local in getattr(module, "no_weight_decay", ()):
            names.add(f"{prefix}.{local}" if prefix else local)
    return names
