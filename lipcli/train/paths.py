"""Run directory and model path: :class:`RunPaths`, :func:`plan_paths` (validated before any write)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.host.locks import check_run_unlocked
from lipcli._util.outputs import cannot_create_in
from lipcli.host.runs import runs_root
from lipcli.train.checkpoint import read_checkpoint
from lipcli.train.config import BEST_NAME, CHECKPOINT_NAME, CONFIG_NAME, LOG_NAME, MODEL_NAME, TrainConfig
from lipcli.train.errors import TrainUsageError, literal
from lipcli.host.modelfile import read_metadata


@dataclass
class RunPaths:
    run_dir: Path
    out: Path

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / CHECKPOINT_NAME

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_NAME

    @property
    def config(self) -> Path:
        return self.run_dir / CONFIG_NAME

    @property
    def best(self) -> Path:
        return self.run_dir / BEST_NAME


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_writable_dir(path: Path, what: str) -> None:
    """``path`` is, or can be created as, a writable directory (nothing is created here)."""
    if path.exists():
        if not path.is_dir():
            raise LipUsageError(f"{what} {path} exists and is not a directory")
        reason = cannot_create_in(path)
        if reason:
            raise LipUsageError(f"{what} {path}: {reason}")
        return
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise LipUsageError(f"cannot create {what} {path}: {anchor} is not a directory")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise LipUsageError(f"cannot create {what} {path}: {anchor} is not writable")


def check_replaceable(out: Path, overwrite: bool, hint: str = "or choose another {out}") -> None:
    """An existing ``out`` may be replaced only with ``overwrite``, and only when it is a
    lipcli model file: training never replaces anything else, whatever the arguments or a
    checkpoint say (:class:`~lipcli.train.errors.TrainUsageError` otherwise; ``hint`` is a
    template, :mod:`lipcli.train.errors`)."""
    if not out.exists():
        return
    if not overwrite:
        raise TrainUsageError(f"model file {literal(out)} already exists; pass {{overwrite}} to replace it {hint}")

    try:
        read_metadata(out)
    except LipError:
        raise TrainUsageError(
            f"{literal(out)} exists and is not a lipcli model file; {{command}} never replaces it, "
            "even with {overwrite} (choose another {out})"
        ) from None


def plan_paths(
    cfg: TrainConfig, *, run_dir: str | None, out: str | None, overwrite: bool = False
) -> RunPaths:
    """Decide the run directory and model path; validate them without writing anything.

    * ``run_dir`` given: used as is; else derived from ``out`` (``<out dir>/<out stem>-run``);
      else ``runs/<arch>-<head>-<YYYYmmdd-HHMMSS>`` (``runs`` is ``$LIPCLI_RUNS`` when set).
    * ``out`` defaults to ``<run dir>/model.safetensors``.
    * A run directory holding an unfinished run's checkpoint is refused (resume it instead).
    * An existing model file, or a run directory holding a finished run, is refused unless
      ``overwrite``: its files would be replaced.  A file at
      ``out`` that is not a lipcli model file is never replaced.
    * A run directory or model file held by a live run (:mod:`lipcli.host.locks`) is refused.
    """
    if out is not None:
        out_path = Path(out).expanduser()
        if out_path.exists() and out_path.is_dir():
            raise TrainUsageError(
                f"{{out}} {literal(out_path)} is a directory; give a file name (e.g. model.safetensors)")
    else:
        out_path = None
    if run_dir is not None:
        rd = Path(run_dir).expanduser()
    elif out_path is not None:
        rd = out_path.parent / f"{out_path.stem}-run"
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        arch = cfg.arch.split(":", 1)[0]
        head = cfg.head.split(":", 1)[0]
        rd = runs_root() / f"{arch}-{head}-{stamp}"
    if out_path is None:
        out_path = rd / MODEL_NAME
    _check_writable_dir(rd, "run directory")
    _check_writable_dir(out_path.parent, "output directory")
    if out_path.exists() and not os.access(out_path, os.W_OK):
        raise TrainUsageError(f"{{out}} {literal(out_path)} is not writable")
    check_run_unlocked(rd, out_path)  # a live run holds them: say so (not "unfinished run")
    ckpt = rd / CHECKPOINT_NAME
    finished = False
    if ckpt.exists():
        try:
            _, meta = read_checkpoint(ckpt)
            finished = meta.get("status") == "complete"
        except LipError:
            finished = False
        if not finished:
            raise TrainUsageError(
                f"{literal(rd)} holds an unfinished run; resume it with `{{command}} {{resume}} "
                f"{literal(rd)}` or choose another {{run_dir}}"
            )
    check_replaceable(out_path, overwrite)
    if not overwrite:
        if finished:
            raise TrainUsageError(
                f"run directory {literal(rd)} holds a finished run; pass {{overwrite}} to replace "
                "it or choose another {out}/{run_dir}"
            )
    return RunPaths(run_dir=rd, out=out_path)
