"""lipcli.testing.export: the ``lip export`` stand-in checks pass on a correct stand-in and FAIL
(AssertionError naming the problem) on a wrong type, a stand-in with parameters, one that
differs from the component or one that is not baked; the aten check and the isolated runner
work on a real program."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.testing import (
    check_aten_program,
    check_export_follows,
    check_export_module,
    relative_error,
    run_exported_program,
)


class Baked(nn.Module):
    """``x·Wᵀ`` with ``W`` a buffer (what a stand-in is)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class Component(nn.Module):
    """A linear map whose ``export_module()`` is configurable: right, with parameters, off by
    ``shift`` or live (not baked)."""

    def __init__(self, mode: str = "right") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T

    def export_module(self) -> nn.Module:
        if self.mode == "parameters":
            module = nn.Linear(4, 3, bias=False).double()
            module.weight.data.copy_(self.weight)
            return module
        if self.mode == "shifted":
            return Baked(self.weight + 1e-6)
        if self.mode == "live":
            return self
        return Baked(self.weight)


X = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_relative_error():
    assert relative_error(torch.tensor([1.0, 2.1]), torch.tensor([1.0, 2.0])) == pytest.approx(0.05)


def test_a_right_stand_in_passes_and_is_returned():
    standin = check_export_module(Component(), Baked, X)
    assert isinstance(standin, Baked)


@pytest.mark.parametrize("mode, kind, message", [
    ("right", nn.Linear, "returned Baked, not Linear"),
    ("parameters", nn.Linear, "has parameters ['weight']"),
    ("shifted", Baked, "differs from the component"),
])
def test_a_wrong_stand_in_fails(mode, kind, message):
    with pytest.raises(AssertionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_export_module(Component(mode), kind, X)


def test_a_baked_stand_in_follows_only_when_exported_again():
    component = Component()
    check_export_follows(component, lambda: component.weight.mul_(2.0), X)
    with pytest.raises(AssertionError, match="did not change"):
        check_export_follows(component, lambda: None, X)
    live = Component("live")
    with pytest.raises(AssertionError):  # the "stand-in" is the component: it changes with it
        check_export_follows(live, lambda: live.weight.mul_(2.0), X)


def test_aten_program_runs_like_the_module_and_is_checked():
    standin = Baked(Component().weight)
    program = check_aten_program(standin, X[:2])
    torch.testing.assert_close(program(X), standin(X))  # a dynamic batch


def test_the_isolated_runner_runs_a_written_program_without_lipcli(tmp_path):
    standin = Baked(Component().weight).float()
    with torch.no_grad():
        program = torch.export.export(standin, (X[:2].float(),), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    torch.export.save(program, tmp_path / "m.pt2")
    loaded, outputs = run_exported_program(tmp_path, "pt2", tmp_path / "m.pt2", X.float().numpy())
    assert loaded == []
    torch.testing.assert_close(torch.from_numpy(outputs["arr_0"]), standin(X.float()))
    with pytest.raises(AssertionError, match="failed to run"):
        run_exported_program(tmp_path, "pt2", tmp_path / "missing.pt2", X.float().numpy())
