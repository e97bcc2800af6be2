"""The paper's test checkpoints in ``tests/data/import/`` (``tools/make_import_fixtures*.py``):
a case's record, its inputs, its import report, the source's rule on the imported model, and
the one-line refusal of a changed copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lipcli.builtins.lipconvnet.importer import ImprovedL2Importer
from lipcli.testing import check_import_fixture, check_import_refused, load_model

DATA = Path(__file__).resolve().parents[1] / "data" / "import"


def imported_case(case: str, folder: Path, **kwargs: Any) -> tuple[Any, dict, torch.Tensor]:
    """``(check_import_fixture report, <case>.logits.json, the recorded inputs)``."""
    rec = json.loads((DATA / f"{case}.logits.json").read_text())
    x = torch.rand(*rec["inputs"], generator=torch.Generator().manual_seed(rec["input_seed"]))
    return check_import_fixture(DATA / f"{case}.pt", "improved-l2", folder / "m.safetensors", **kwargs), rec, x


def check_changed_copy_refused(case: str, change, message: str, folder: Path) -> None:
    """``change`` (in place) a copy of the case's checkpoint: one line with ``message``, exit 1."""
    state = torch.load(DATA / f"{case}.pt", weights_only=True)
    change(state)
    torch.save(state, folder / "variant.pt")
    check_import_refused(folder / "variant.pt", "improved-l2", message)


def check_source_rule(report: Any, rec: dict, x: torch.Tensor) -> None:
    """``source_certificates`` on the imported model: the constant and radii the paper's
    ``evaluate_certificates(exact=True)`` recorded on its own model."""
    model, _mf = load_model(report.model_file)
    src = ImprovedL2Importer().source_certificates(model, x)
    assert src.lipschitz == pytest.approx(rec["source_lipschitz"], rel=1e-6)
    assert torch.allclose(src.radii.float(), torch.tensor(rec["source_radii"]).clamp_min(0), rtol=1e-4, atol=1e-5)
