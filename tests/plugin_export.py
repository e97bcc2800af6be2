"""Helpers for the ``lip export`` tests of the plugin distributions under ``plugins/``
(``plugins/*/tests/test_*_export.py``): random float64 parameters, the stand-in check
(``export_module()`` returns a parameter-free module equal to the component) and a
``torch.export`` of it that must contain aten operations only."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def randomise_(module: nn.Module, seed: int, scale: float = 1.0) -> nn.Module:
    """Every parameter of ``module`` drawn ``scale · N(0, 1)`` from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |got − ref| / max |ref|``."""
    return float((got - ref).abs().max() / ref.abs().max())


def check_stand_in(component: nn.Module, kind: type, x: torch.Tensor, rtol: float = 1e-12) -> nn.Module:
    """``component.export_module()``: of type ``kind``, without parameters, and equal to
    ``component(x)`` within ``rtol`` of the largest output; returned."""
    standin = component.export_module()
    assert isinstance(standin, kind), type(standin)
    assert not list(standin.parameters())
    with torch.no_grad():
        error = relative_error(standin(x), component(x))
    assert error <= rtol, error
    return standin


def aten_program(module: nn.Module, example: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``torch.export`` of ``module`` with a dynamic batch, under ``no_grad`` as ``lip export``
    runs it; asserts that the graph calls aten operations only (and Python's ``getitem`` on
    the pairs min/max return); returns the exported program as a callable."""
    with torch.no_grad():
        program = torch.export.export(module, (example,), strict=False,
                                      dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets and all(t.startswith("aten.") or "getitem" in t for t in targets), targets
    return program.module()
