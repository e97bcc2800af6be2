"""Checks for an importer's test fixtures (``lip import``): a checkpoint made by the source's
own code at development time and the source's logits on fixed inputs, recorded beside it.

:func:`check_import_fixture` imports the checkpoint through ``lip import`` (in-process) and
asserts what every importer must hold: the logits equal the recorded ones to float32
rounding, the provenance names the source and the checkpoint's SHA-256, and the guaranteed
bound covers the float64 dense-Jacobian norm of the features at a seeded input.
:func:`check_import_refused`: a bad checkpoint is one line, the expected exit code, nothing
written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lipcli.host.models import load_model

from .cli import run_lip

__all__ = ["ImportFixtureReport", "check_import_fixture", "check_import_refused"]


@dataclass(frozen=True)
class ImportFixtureReport:
    """What :func:`check_import_fixture` measured: the imported model file, its guaranteed
    bound, the Jacobian norm it covers, the largest logit difference and the file's metadata."""

    model_file: Path
    bound: float
    jacobian_norm: float
    max_logit_error: float
    metadata: dict


def _fixed_inputs(record: dict) -> torch.Tensor:
    return torch.rand(*record["inputs"], generator=torch.Generator().manual_seed(record["input_seed"]))


def check_import_fixture(checkpoint: str | Path, importer: str, out: str | Path, *,
                         rtol: float = 1e-5) -> ImportFixtureReport:
    """Import ``checkpoint`` with ``importer`` to ``out`` and check it against
    ``<checkpoint stem>.logits.json`` (keys ``source``, ``input_seed``, ``inputs`` (the shape
    of ``torch.rand`` inputs drawn with that seed) and ``logits``; ``<stem>.config.json``, the
    source's configuration, is passed as ``--config`` when present): logits within ``rtol``
    (and ``rtol · max|logit|`` absolute), provenance, and bound >= the features' Jacobian
    norm in float64 at one seeded input of the same shape."""
    checkpoint, out = Path(checkpoint), Path(out)
    record = json.loads(checkpoint.with_name(f"{checkpoint.stem}.logits.json").read_text())
    config = checkpoint.with_name(f"{checkpoint.stem}.config.json")  # the source's own arguments
    extra = ["--config", str(config)] if config.is_file() else []
    result = run_lip(["import", str(checkpoint), "--from", importer, "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    model, mf = load_model(out)
    with torch.no_grad():
        got = model(_fixed_inputs(record))
    want = torch.tensor(record["logits"], dtype=got.dtype)
    err = float((got - want).abs().max())
    assert torch.allclose(got, want, rtol=rtol, atol=rtol * float(want.abs().max())), (
        f"imported logits differ from the source's by up to {err:.3g}")
    prov = mf.metadata["provenance"]
    assert prov["source"] == record["source"], prov
    assert prov["sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest(), prov
    bound = float(mf.metadata["lipschitz"]["upper_bound"])
    model = model.double()
    x = torch.rand(1, *record["inputs"][1:], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    jac = torch.autograd.functional.jacobian(lambda t: model.features(t)[0], x).reshape(-1, x.numel())
    norm = float(torch.linalg.matrix_norm(jac, ord=2))
    assert norm <= bound, f"guaranteed bound {bound} below the features' Jacobian norm {norm}"
    return ImportFixtureReport(model_file=out, bound=bound, jacobian_norm=norm, max_logit_error=err,
                               metadata=dict(mf.metadata))


def check_import_refused(checkpoint: str | Path, importer: str, message: str, *, code: int = 1) -> str:
    """``lip import checkpoint --from importer`` fails with exit ``code`` and one line of stderr
    containing ``message``, and writes nothing in the checkpoint's folder (``<stem>.config.json``
    passed as ``--config`` when present); returns the line."""
    checkpoint = Path(checkpoint)
    before = sorted(p.name for p in checkpoint.parent.iterdir())
    out = checkpoint.parent / "imported.safetensors"
    config = checkpoint.with_name(f"{checkpoint.stem}.config.json")  # the source's own arguments
    extra = ["--config", str(config)] if config.is_file() else []
    result = run_lip(["import", str(checkpoint), "--from", importer, "--out", str(out), *extra])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code and len(lines) == 1 and message in lines[0], result.output
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == before, "lip import wrote a file"
    return lines[0]
