"""The authors' test checkpoints in ``data/`` (made by ``tools/make_import_fixtures.py
bronet-lipconvnet`` and ``tools/make_import_fixtures_bronet.py``): their records and inputs,
and the import reports the import tests share."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lipcli.testing import check_import_fixture, check_import_refused

DATA = Path(__file__).resolve().parent / "data"


def record(case: str) -> dict:
    """``<case>.logits.json``: the source, its commit, the inputs' seed and shape, the logits."""
    return json.loads((DATA / f"{case}.logits.json").read_text())


def inputs(rec: dict) -> torch.Tensor:
    """The fixed inputs the logits were recorded on (``torch.rand`` with the recorded seed)."""
    return torch.rand(*rec["inputs"], generator=torch.Generator().manual_seed(rec["input_seed"]))


def import_reports(cases: list[str], importer: str, folder: Path) -> dict:
    """:func:`~lipcli.testing.check_import_fixture` of every case (logits to 1e-5, provenance,
    bound at least the float64 Jacobian norm of the features), by case."""
    return {case: check_import_fixture(DATA / f"{case}.pt", importer, folder / f"{case}.safetensors")
            for case in cases}


def check_matches(report, rec: dict, classes: int) -> None:
    """The imported model's data set is the source's CIFAR and its logits are the recorded
    ones to ``1e-5`` of the largest."""
    assert report.metadata["dataset"]["name"] == {10: "cifar10", 100: "cifar100"}[classes]
    assert report.max_logit_error < 1e-5 * max(abs(v) for row in rec["logits"] for v in row)


def check_variant_refused(case: str, importer: str, change, message: str, folder: Path) -> None:
    """``change`` (in place) a copy of the case's checkpoint: ``lip import`` refuses it with one
    line containing ``message`` (exit 1) and writes nothing."""
    ckpt = torch.load(DATA / f"{case}.pt", weights_only=True)
    change(ckpt)
    torch.save(ckpt, folder / "variant.pt")
    check_import_refused(folder / "variant.pt", importer, message)
