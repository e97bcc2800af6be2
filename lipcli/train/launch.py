"""Several training processes on this machine, started by lipcli itself: :func:`launch_workers`.

``lip train --nproc-per-node N`` validates the whole run in its own process first
(:func:`lipcli.train.check_train`), then starts ``N`` workers through torch's elastic launcher
(the library behind ``torchrun``: a rendezvous on a free local port, ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK`` set for each worker, no restarts) and waits for them.  Each worker is
``python -m lipcli ARGS``, the same command line without the process count, so every worker
is exactly what ``torchrun --nproc-per-node N -m lipcli ARGS`` would start.

The launcher's own output is kept off the terminal: its log messages (worker failures, the
signals it forwards) are dropped and a failing worker is a :class:`LaunchResult`, not an
exception with a traceback.  The workers' output (rank 0's progress, the JSON summary) goes
to this process's stdout and stderr, except their error lines: a failing worker leaves its
line in a file (:func:`report_to_launcher`) and ends at once, and the launcher prints the
first one written (:attr:`LaunchResult.message`).  So a run that fails says so once, however
the workers end: the elastic agent stops every other worker as soon as one fails, which could
otherwise cut rank 0 off before it printed, and a worker ending normally after a failure can
abort in its communication library's teardown.  Ctrl-C (SIGINT) or SIGTERM reaching this
process is passed to the workers, which stop as a single process does (the message says how
to resume); the workers run in their own sessions, so a terminal's Ctrl-C reaches them once.
If this process dies without passing anything on (``kill -9``), the workers stop by
themselves (:func:`follow_launcher`) and rank 0 prints the interruption line with the resume
command.  A worker that dies (``kill -9``, the OOM killer) is named by the launcher with the
resume command (the others, cut off in a collective, report a lost connection: see
:func:`lipcli.train.distributed.lost_connection`).

As ``torchrun`` does, ``OMP_NUM_THREADS`` is set to 1 for the workers when it is not set and
``N > 1`` (N processes each using every core would slow each other down).

Before anything else, :func:`check_process_count` refuses more workers than the machine has
room for: one per CUDA device for a run on a bare ``cuda`` (or ``auto`` with CUDA: each worker
takes a GPU of its own), else one per CPU core this process may use (:func:`usable_cpus`),
unless ``oversubscribe`` (``lip train --oversubscribe``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from lipcli.train.config import LAUNCH_ERRORS_ENV, LAUNCHER_ENV, LAUNCHER_PID_ENV
from lipcli.train.errors import TrainUsageError
from lipcli.host.modelfile import atomic_write_bytes

#: the loggers of torch's launcher (the elastic agent, its rendezvous and process handling)
_TORCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


@dataclass
class WorkerError:
    """The one-line error a worker reported, with its exit code (2 usage, 1 runtime, 130
    interrupted) and when it was written."""

    rank: int
    code: int
    message: str
    time: float


#: set in a worker when the launching process died (the signal of follow_launcher arrived)
_LAUNCHER_DIED = False
#: the signal a worker receives when the launching process dies (handled as Ctrl-C)
LAUNCHER_DEATH_SIGNAL = signal.SIGUSR1


def launcher_gone() -> bool:
    """In a worker started by :func:`launch_workers`: whether the launching process has
    ended (its death signal arrived, or this process's parent is no longer it); elsewhere
    False."""
    pid = os.environ.get(LAUNCHER_PID_ENV, "")
    return _LAUNCHER_DIED or (pid.isdigit() and os.getppid() != int(pid))


def _launcher_died(_signum: int, _frame: object) -> None:
    global _LAUNCHER_DIED
    _LAUNCHER_DIED = True
    raise KeyboardInterrupt


#: seconds between two looks of the watchdog at the parent process (follow_launcher)
WATCHDOG_PERIOD_S = 0.5


def follow_launcher() -> None:
    """In a worker started by :func:`launch_workers` (call from the main thread): stop as on
    Ctrl-C (the checkpoint is kept, rank 0 prints the resume command itself) when the
    launching process dies, even by ``kill -9``, instead of training on as an orphan.  On
    Linux the kernel sends :data:`LAUNCHER_DEATH_SIGNAL` (``prctl(PR_SET_PDEATHSIG)``; the
    parent id can still read as the launcher's then, while its other threads exit, hence a
    signal of its own); everywhere a daemon thread compares the parent process id with the
    launcher's every :data:`WATCHDOG_PERIOD_S` seconds and sends the same signal.
    Elsewhere nothing."""
    if not os.environ.get(LAUNCHER_PID_ENV, "").isdigit():
        return
    signal.signal(LAUNCHER_DEATH_SIGNAL, _launcher_died)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(LAUNCHER_DEATH_SIGNAL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    import threading

    def watch() -> None:
        while not launcher_gone():
            time.sleep(WATCHDOG_PERIOD_S)
        if not _LAUNCHER_DIED:
            os.kill(os.getpid(), LAUNCHER_DEATH_SIGNAL)

    threading.Thread(target=watch, name="lipcli-launcher-watchdog", daemon=True).start()


def report_to_launcher(message: str, code: int) -> None:
    """In a worker started by :func:`launch_workers`: leave ``message`` (one line, the
    command line's spelling) for the launcher to print and end this process now with
    ``code`` (no teardown: see the module docstring).  Elsewhere, or when the launcher has
    died (:func:`launcher_gone`: the caller prints the line itself), return and do nothing."""
    directory = os.environ.get(LAUNCH_ERRORS_ENV)
    rank = os.environ.get("RANK")
    if not directory or rank is None or not rank.strip().isdigit() or launcher_gone():
        return

    record = {"rank": int(rank), "code": int(code), "message": message, "time": time.time()}
    try:
        atomic_write_bytes(Path(directory) / f"{int(rank)}.json", json.dumps(record).encode())
    except OSError:
        return  # the launcher's directory is gone: say it here instead
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _read_errors(directory: Path) -> list[WorkerError]:
    errors = []
    for path in directory.glob("[0-9]*.json"):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            errors.append(WorkerError(rank=int(raw["rank"]), code=int(raw["code"]),
                                      message=str(raw["message"]), time=float(raw["time"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(errors, key=lambda e: (e.time, e.rank))


@dataclass
class LaunchResult:
    """How the workers ended.  ``exit_codes``: the failed workers' exit codes by global rank
    (empty when all succeeded; negative: killed by that signal); ``signal``: the signal that
    stopped this process (and so the workers), if any."""

    processes: int
    exit_codes: dict[int, int] = field(default_factory=dict)
    signal: int | None = None
    #: the error lines the workers left (:func:`report_to_launcher`), earliest first
    errors: list[WorkerError] = field(default_factory=list)

    @property
    def message(self) -> WorkerError | None:
        """The error to report: the first one written (the cause; the other workers then
        fail because of it, or report the same), as rank 0's when rank 0 reported the same."""
        if not self.errors:
            return None
        first = self.errors[0]
        same = [e for e in self.errors if e.rank == 0 and e.message == first.message]
        return same[0] if same else first

    @property
    def ok(self) -> bool:
        return not self.exit_codes and self.signal is None

    @property
    def exit_code(self) -> int:
        """The launcher's exit code: 0; 130 after Ctrl-C (128 + the signal for another
        signal); 2 when a worker reported a usage error (exit 2); else 1."""
        if self.signal is not None:
            return 128 + self.signal
        if self.message is not None:
            return self.message.code
        codes = set(self.exit_codes.values())
        if not codes:
            return 0
        for code in (2, 130):
            if code in codes:
                return code
        return 1

    @property
    def killed(self) -> dict[int, str]:
        """Workers that a signal ended (they printed nothing): rank -> signal name."""
        names = {}
        for rank, code in sorted(self.exit_codes.items()):
            if code < 0:
                try:
                    names[rank] = signal.Signals(-code).name
                except ValueError:
                    names[rank] = f"signal {-code}"
        return names


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Drop the log records of torch's launcher while the block runs (they would print a
    worker's failure as a traceback-like summary on stderr)."""
    saved = []
    for name in _TORCH_LOGGERS:
        log = logging.getLogger(name)
        saved.append((log, log.propagate, list(log.handlers)))
        log.handlers = [logging.NullHandler()]
        log.propagate = False
    try:
        yield
    finally:
        for log, propagate, handlers in saved:
            log.handlers, log.propagate = handlers, propagate


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while the block runs (the workers inherit it)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def usable_cpus() -> int:
    """The CPU cores this process may run on: its affinity mask where the platform has one
    (a container's or ``taskset``'s limit), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_process_count(processes: int, device: str, oversubscribe: bool = False) -> None:
    """Refuse ``processes`` workers of a run on ``device`` (the ``device`` setting) beyond
    what this machine has room for (:class:`TrainUsageError` naming ``nproc_per_node`` and its
    range, exit 2): see the module docstring.  Nothing is started here."""
    from lipcli._util.devices import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        import torch

        gpus = torch.cuda.device_count()
        if processes > gpus:
            raise TrainUsageError(f"{{nproc_per_node}} {processes} is more than the {gpus} CUDA device(s) of "
                                  f"this machine; each process takes one (range 1..{gpus})")
        return
    cores = usable_cpus()
    if processes > cores and not oversubscribe:
        raise TrainUsageError(f"{{nproc_per_node}} {processes} is more than the {cores} CPU core(s) this "
                              f"process may use (range 1..{cores}; {{oversubscribe}} allows more)")


def launch_workers(processes: int, args: Sequence[str]) -> LaunchResult:
    """Run ``python -m lipcli ARGS`` as ``processes`` workers of one job on this machine and
    wait for them (see the module docstring).  Never raises for a failing worker or a
    signal: the :class:`LaunchResult` says how they ended."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    result = LaunchResult(processes=processes)
    with tempfile.TemporaryDirectory(prefix="lipcli-launch-") as tmp:
        errors = Path(tmp) / "errors"
        errors.mkdir()
        env = {LAUNCHER_ENV: "lipcli", LAUNCH_ERRORS_ENV: str(errors), LAUNCHER_PID_ENV: str(os.getpid())}
        if processes > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=uuid.uuid4().hex,
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
            logs_specs=DefaultLogsSpecs(log_dir=str(Path(tmp) / "logs")),
            signals_to_handle="SIGTERM,SIGINT",
        )
        with _quiet_torch_logs(), _environ(env):
            try:
                elastic_launch(config, sys.executable)("-u", "-m", "lipcli", *args)
            except ChildFailedError as exc:
                result.exit_codes = {int(rank): int(f.exitcode) for rank, f in exc.failures.items()}
            except SignalException as exc:
                result.signal = int(exc.sigval)
        result.errors = _read_errors(errors)
    return result
