"""``lipcli.lipschitz(...)``: the Python twin of ``lip lipschitz``: the guaranteed bound of a
model file's feature map, the paper's power-method estimate (labelled) and optionally an
empirical lower bound, as the :class:`~lipcli.lipschitz.report.LipschitzReport` that ``lip
lipschitz --json`` prints; ``write=True`` stores it in the model file's ``lipschitz`` slot."""

from __future__ import annotations

import os
from typing import Any, Callable

__all__ = ["run"]


def run(model: str | os.PathLike | None = None, *, iters: int = 50, no_estimate: bool = False,
        empirical: bool = False, write: bool = False, device: str = "auto",
        progress: Callable[..., Any] | None = None, write_hint: str = "run without write") -> Any:
    """The report of ``model`` (None: the most recent model under ./runs)."""
    from pathlib import Path

    from lipcli._util.devices import resolve_device
    from lipcli._util.outputs import check_model_writable
    from lipcli.certify.options import SETTING_MAXIMA
    from lipcli.host.models import load_model
    from lipcli.host.runs import resolve_model_argument
    from lipcli.lipschitz.promises import verify_promises
    from lipcli.lipschitz.report import lipschitz_report
    from lipcli.sdk.errors import LipUsageError, SettingError, memory_step

    path = resolve_model_argument(None if model is None else Path(model))
    if not path.exists():
        raise LipUsageError(f"model file not found: {path}")
    if path.is_dir():
        raise LipUsageError(f"{path} is a directory, not a model file")
    if not 1 <= iters <= SETTING_MAXIMA["lipschitz_iters"]:
        raise SettingError("iters", f"iters must be in 1..{SETTING_MAXIMA['lipschitz_iters']}, got {iters}")
    if write:  # before the work: the report would otherwise be computed for nothing
        check_model_writable(path, hint=write_hint)
    net, mf = load_model(path, device=resolve_device(device))
    promises = verify_promises(net)  # a broken promise is an error, never a bound
    with memory_step("Lipschitz report", "the model's width",
                     "run it where more memory is free, or with {no_estimate}; the model file is unchanged"):
        report = lipschitz_report(net, estimate=not no_estimate, iters=iters, empirical=empirical,
                                  progress=progress)
    report.promises = promises
    report.model = str(path)
    if write:
        _store(report, path, mf)
    return report


def _store(report: Any, path: Any, mf: Any) -> None:
    """The report into the model file's ``lipschitz`` slot, under the file's lock; an estimate
    or empirical bound not recomputed now keeps the stored one of the same weights."""
    from lipcli.host.modelfile import tensors_fingerprint, update_results_locked
    from lipcli.lipschitz.report import merge_stored_record

    fresh = report.record()
    stored: dict = {}

    def merge(metadata: dict) -> dict:
        stored["record"] = merge_stored_record(fresh, metadata.get("lipschitz"))
        return {"lipschitz": stored["record"]}

    update_results_locked(path, merge, weights_sha256=tensors_fingerprint(mf.tensors), what="the Lipschitz computation")
    report.written = True
    if stored["record"].get("carried_over"):
        report.carried_over = stored["record"]["carried_over"]
