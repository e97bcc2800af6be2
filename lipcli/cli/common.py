"""Shared CLI plumbing: one-line errors with exit codes, consoles, JSON output.

Command modules import heavy libraries (torch, ...) inside their functions so that
``lip --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import inspect

import functools
import os
import re
import sys
from typing import Any, Callable, TypeVar

import typer

from lipcli.sdk.errors import LipError, LipUsageError, NamedSettings, SettingError
from lipcli._util.strictjson import dumps_json

F = TypeVar("F", bound=Callable[..., Any])


class State:
    debug = False


state = State()


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def stdout_console():
    from rich.console import Console

    return Console()


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU thread count for this process (``--threads``; ``None``: torch's own
    default, which keeps results bit-identical to runs without the option).
    ``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` (read when torch loads OpenMP, so it only acts
    before the first ``import torch``): idle OpenMP threads then sleep instead of spinning on
    cores that other processes need, which is what made 2-thread attacks collapse under load.
    Only the command line does this, at a command's start; library code never sets threads."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


def fail(message: str, code: int = 1) -> None:
    """Print ``error: message`` on one line to stderr and exit with ``code``; control
    characters (e.g. from a model file's strings) are removed first (:mod:`lipcli._util.safetext`)."""
    from lipcli._util.safetext import clean

    typer.echo(f"error: {' '.join(clean(message).split())}", err=True)
    raise typer.Exit(code)


def cli_message(exc: LipError, func: Callable[..., Any] | None = None) -> str:
    """The message of ``exc`` for the command line.  An error that names settings
    (:class:`~lipcli.sdk.errors.NamedSettings`, e.g. a :class:`~lipcli.sdk.errors.SettingError`)
    gets them spelled as ``lip`` options: the flag of the command ``func``'s parameter of that
    name, else ``--`` and the name with ``-`` for ``_`` (``batch_size`` → ``--batch-size``); the
    command that continues a run is ``lip train``, or for a multi-process run ``lip train
    --nproc-per-node N`` or the torchrun line, after what started it.  A :class:`SettingError`
    about a setting that ``func`` has no option for keeps the library's words."""
    if not isinstance(exc, NamedSettings):
        return str(exc)
    if isinstance(exc, SettingError) and func is not None and command_flag(func, exc.setting) is None:
        return str(exc)

    def option(name: str) -> str:
        if name == "command":
            launch = getattr(exc, "launch", None)
            if launch is None:
                return "lip train"
            if getattr(exc, "launcher", None) == "lipcli":  # started by lip train --nproc-per-node
                return f"lip train --nproc-per-node {launch}"
            return f"torchrun --nproc-per-node {launch} -m lipcli train"
        if func is None:
            return "--" + name.replace("_", "-")
        return command_flag(func, name) or name  # else a setting with no option here (a settings-file key)

    return exc.render(option)


def cli_errors(func: F) -> F:
    """Turn lipcli errors (and unexpected ones) into one stderr line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except LipError as exc:
            if state.debug:
                raise
            message = cli_message(exc, func)
            to_launcher(message, exc.exit_code)
            # the other ranks of a torchrun job: rank 0 says it (a usage error is the same
            # on every rank, so it is printed once)
            if getattr(exc, "silent", False) or (isinstance(exc, LipUsageError) and other_rank()):
                raise typer.Exit(exc.exit_code) from None
            fail(message, exc.exit_code)
        except KeyboardInterrupt:
            if state.debug:
                raise
            to_launcher("interrupted", 130)
            if other_rank():  # every rank of a job sees Ctrl-C: rank 0 says it
                raise typer.Exit(130) from None
            fail("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - never show a traceback by default
            if state.debug:
                raise
            oom = out_of_memory_line(exc)
            if oom is not None:
                to_launcher(oom, 1)
                fail(oom, 1)
            message = f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for details)"
            to_launcher(message, 1)
            fail(message, 1)

    return wrapper  # type: ignore[return-value]


def out_of_memory_line(exc: BaseException) -> str | None:
    """``"out of memory: ..."`` (one line) when ``exc`` is an allocation failure (Python's
    ``MemoryError``, torch's CPU or CUDA allocator), else ``None``."""
    text = str(exc)
    name = type(exc).__name__
    if not (isinstance(exc, MemoryError) or name == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text.lower()):
        return None
    found = re.search(r"tried to allocate ([0-9.]+ ?[KMGT]?i?B|\d+ bytes)", text)
    what = f" (an allocation of {found.group(1)})" if found else ""
    return (f"out of memory{what}: choose smaller sizes (batch, width, depth, --check, --classes) "
            "or a machine with more memory")


def to_launcher(message: str, code: int) -> None:
    """In a worker of ``lip train --nproc-per-node``: hand the error line to the launching
    process, which prints it once, and end this process
    (:func:`lipcli.train.launch.report_to_launcher`); elsewhere nothing."""
    import os

    from lipcli.train.config import LAUNCH_ERRORS_ENV

    if os.environ.get(LAUNCH_ERRORS_ENV):
        from lipcli.train.launch import report_to_launcher

        report_to_launcher(message, code)


def command_flag(func: Callable[..., Any], name: str) -> str | None:
    """The flag that spells setting ``name`` on ``func``'s command: its own option, or an option
    spelled ``--name`` that sets another field (lip export's ``--output`` sets ``out``)."""
    spelled = "--" + name.replace("_", "-")
    flags = {option_flag(func, other) for other in inspect.signature(func).parameters}
    return option_flag(func, name) or (spelled if spelled in flags else None)


def option_flag(func: Callable[..., Any], name: str) -> str | None:
    """The long flag (``--top-k``) of ``func``'s command-line parameter ``name``, from its
    ``typer.Option`` (in ``Annotated[...]`` or as the default); ``None`` when there is none."""
    import inspect
    import typing

    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations: no hint
        hints = {}
    infos = list(getattr(hints.get(name), "__metadata__", ()))
    param = inspect.signature(func).parameters.get(name)
    if param is not None:  # a declared setting's option (lipcli.cli.settings_options) is only here
        infos.extend([*getattr(param.annotation, "__metadata__", ()), param.default])
    for info in infos:
        if type(info).__name__ != "OptionInfo":
            continue
        # in ``Annotated[..., typer.Option("--flag", ...)]`` the first declaration is the
        # option's ``default`` (typer moves it to the declarations when it builds the command)
        decls = [getattr(info, "default", None), *(getattr(info, "param_decls", None) or ())]
        longs = [d for d in decls if isinstance(d, str) and d.startswith("--")]
        return longs[0].split("/")[0] if longs else "--" + name.replace("_", "-")
    return None


def other_rank() -> bool:
    """Whether this process is a torchrun worker other than rank 0 (``RANK`` set and not 0,
    in a launched job: ``TORCHELASTIC_RUN_ID`` set or ``WORLD_SIZE`` > 1, as
    :meth:`lipcli.train.distributed.DistContext.from_env` decides)."""
    import os

    env = os.environ
    launched = "TORCHELASTIC_RUN_ID" in env or (env.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")
                                                and "MASTER_ADDR" in env)  # a launcher's: else it is said
    return launched and env.get("RANK", "0").strip() not in ("", "0")


def print_json(data: Any) -> None:
    """Machine output on stdout (no rich markup, no wrapping), strict JSON."""
    sys.stdout.write(dumps_json(data) + "\n")
    sys.stdout.flush()


class ProgressBars:
    """rich progress bars on stderr, one task per stage (quiet when stderr is not a TTY).

    ``update(stage, done, total)`` is the ``progress`` callback of the library functions
    (:func:`lipcli.certify.run_certification`, :func:`lipcli.lipschitz.report.lipschitz_report`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.progress = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> "ProgressBars":
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            console = stderr_console()
            if console.is_terminal:
                self.progress = Progress(
                    TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                )
                self.progress.start()
        return self

    def update(self, stage: str, done: int, total: int) -> None:
        if self.progress is None:
            return
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Any:
    """While inside: SIGTERM raises KeyboardInterrupt in the main thread, so a command stops as
    on Ctrl-C (locks released, the checkpoint kept, the resume line printed) instead of dying
    with its lock files and a half-written state.  Only where SIGTERM has its default action
    (a launcher's or a test's own handler is left alone); the handler is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: the address space torch needs to load (torch 2.14 with its CUDA libraries, measured: it loads
#: under ``ulimit -v 3300000`` (KiB) and aborts in native code, std::bad_alloc, under 3000000)
MIN_ADDRESS_SPACE = 3300000 * 1024


def address_space_problem() -> str | None:
    """One line when the process's address-space limit (``ulimit -v``) is below
    :data:`MIN_ADDRESS_SPACE`: loading torch would abort in native code (two lines of C++ and
    exit 134, no lock or file of lipcli's yet), so the command is refused before it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= MIN_ADDRESS_SPACE:
        return None
    return (f"the address-space limit (ulimit -v) is {soft // 2**20:,} MiB, below the "
            f"{MIN_ADDRESS_SPACE // 2**20:,} MiB torch needs to load; raise or remove the limit")
