"""``lip train``: the paper's training recipe end to end (see :mod:`lipcli.train`)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from lipcli.cli.common import cli_errors, print_json, sigterm_as_interrupt
from lipcli.cli.registry_options import RegistryCommand, given_shortcuts
from lipcli.cli.options import (DataDirOption, DeviceOption, DownloadOption, JsonOption, QuietOption,
                                ThreadsOption)
from lipcli.cli.settings_options import given_settings, with_settings
from lipcli.train.config import DEFAULT_NPROC_PER_NODE, MAX_NPROC_PER_NODE, TrainConfig

#: the command class: options and help texts completed from the plugin registry
COMMAND_CLASS = RegistryCommand
#: the defaults the options have and show (declared once, in TrainConfig); an option counts as
#: given (over a --config file, or over the stored settings with --resume) only when it was
#: on the command line
_D = TrainConfig()


# Every TrainConfig setting is an option (with_settings: spelling, default and help from its
# declaration); the signature lists the options that are not settings of the run itself.
@with_settings(TrainConfig, before="data_dir")
@cli_errors
def train(
    ctx: typer.Context,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="Start from a published recipe (NAME or "
        "NAME@VERSION; `lip plugins -v` lists them with their values and sources): its settings "
        "become the defaults and the options given here win; the model file records the recipe "
        "and every setting given over it.")] = None,
    data_dir: DataDirOption = None,
    download: DownloadOption = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Model file to write (default "
        "RUN_DIR/model.safetensors).")] = None,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory for checkpoint and "
        "logs (default: OUT's stem + '-run' beside --out, else runs/ARCH-HEAD-TIMESTAMP).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="Settings file (.toml, .json, .yaml) "
        "with TrainConfig keys; options given here win.")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue the run in this run "
        "directory from its last checkpoint (with --lr: at that learning rate).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing model file (--out) and "
        "a finished run in the run directory (its log and checkpoint); without it lip train "
        "refuses to replace them.")] = False,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", min=1, max=MAX_NPROC_PER_NODE, help="Processes on this "
        "machine. 1: train in this process; N > 1: validate the run here, then start N worker "
        "processes (DDP; gloo on CPU, one GPU each with CUDA) and wait for them, as `torchrun "
        "--nproc-per-node N -m lipcli train ...` does. At most one per CUDA device (a run on "
        "cuda), else one per usable CPU core.")] = DEFAULT_NPROC_PER_NODE,
    oversubscribe: Annotated[bool, typer.Option("--oversubscribe", help="Allow --nproc-per-node above the "
        "CPU cores this process may use (a CPU run).")] = False,
    device: DeviceOption = _D.device,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    threads: ThreadsOption = None,
    **_settings: Any,
) -> None:
    """Train a provably 1-Lipschitz network with the paper's recipe (resumable; DDP).

    Writes a run directory (config.json, train_log.jsonl, checkpoint.safetensors) and the
    model file, whose metadata holds the config, data set, guaranteed Lipschitz bound,
    test accuracy and the training record.  Ctrl-C keeps the last epoch's checkpoint:
    continue with `lip train --resume RUN_DIR`.  Several processes: `lip train
    --nproc-per-node N ...` (or `torchrun --nproc-per-node N -m lipcli train ...`).
    """
    from lipcli.cli.dataroot import default_root as in_default_root
    from lipcli.train import train as run_training
    from lipcli.train.api import plan as plan_run

    given = {**given_shortcuts(ctx), **given_settings(ctx, TrainConfig)}
    positional, plan, default_root = plan_run(recipe=recipe, config=config, resume=resume, run_dir=run_dir,
                                              out=out, overwrite=overwrite, **given)
    with in_default_root(default_root, quiet):
        if nproc_per_node > 1:
            _launch(ctx, nproc_per_node, oversubscribe, positional, plan)
            return
        with sigterm_as_interrupt():  # SIGTERM (kill, timeout, a scheduler) stops as Ctrl-C does
            summary = run_training(*positional, **plan, quiet=quiet)
    if json_out and summary is not None:  # None: a torchrun process other than rank 0
        print_json(summary.to_json())


def _launch(ctx: typer.Context, processes: int, oversubscribe: bool, positional: list[Any],
            plan: dict[str, Any]) -> None:
    """``--nproc-per-node N``: check N against this machine (one per CUDA device or usable
    CPU core, unless ``--oversubscribe``), validate the whole run here (one line and exit 2/1
    on bad input, before any worker starts), then run this command line without the option as N workers
    (:mod:`lipcli.train.launch`).  Rank 0 prints the progress and the summary; a failed run
    prints the workers' error line here, once, and exits with its code (2 for a usage error,
    130 after Ctrl-C, else 1)."""
    import os
    import signal

    from lipcli.cli.common import fail, other_rank, state
    from lipcli.sdk.errors import LipError, LipUsageError
    from lipcli.train import check_train
    from lipcli.train.errors import TrainMessage
    from lipcli.train.launch import check_process_count, launch_workers

    if other_rank() or "TORCHELASTIC_RUN_ID" in os.environ:
        raise LipUsageError("--nproc-per-node starts worker processes itself; under torchrun leave it out")
    check_process_count(processes, _device_setting(positional, plan), oversubscribe)
    try:
        paths = check_train(*positional, **plan, processes=processes)
    except LipError as exc:
        if isinstance(exc, TrainMessage):  # continuing the run is this command line
            exc.launch, exc.launcher = processes, "lipcli"
        raise
    launcher_only = {"nproc_per_node", "oversubscribe"}
    args = ["--debug"] * state.debug + ["train", *command_line_args(ctx, exclude=launcher_only)]
    if plan.get("resume") is None and plan.get("run_dir") is None and plan.get("out") is None:
        args.append(f"--run-dir={paths.run_dir}")  # the timestamped directory validated here
    result = launch_workers(processes, args)
    if result.ok:
        return
    died = _died(result)
    if died is not None:  # the cause; the others only lost their connection to it
        launch = f"--nproc-per-node {processes}" + " --oversubscribe" * oversubscribe
        resume = f"lip train {launch} --resume {paths.run_dir}"
        fail(f"{died}; resume with: {resume}" if paths.checkpoint.is_file() else
             f"{died} before the first checkpoint; the run directory is {paths.run_dir}", 1)
    error = result.message
    if error is not None:  # the workers' own line, printed once
        fail(error.message if error.rank == 0 else f"process {error.rank}: {error.message}", result.exit_code)
    if result.signal is not None:
        fail(f"stopped by {signal.Signals(result.signal).name}; the run directory is {paths.run_dir}",
             result.exit_code)
    ended = ", ".join(f"{rank} by {name}" for rank, name in result.killed.items()) or ", ".join(
        f"{rank} with exit code {code}" for rank, code in sorted(result.exit_codes.items()))
    fail(f"worker processes ended without a message ({ended}); the run directory is {paths.run_dir}",
         result.exit_code)


def _device_setting(positional: list[Any], plan: dict[str, Any]) -> str:
    """The ``device`` setting of the run to launch: the new run's, else the one given to
    ``--resume`` or stored in the run directory's config.json (``auto`` when unreadable: the
    run's own check reports that)."""
    import json

    from lipcli.train.config import CONFIG_NAME

    if positional:
        return str(positional[0].device)
    given = plan.get("resume_overrides") or {}
    if "device" in given:
        return str(given["device"])
    try:
        stored = json.loads((Path(plan["resume"]) / CONFIG_NAME).read_text(encoding="utf-8")).get("device")
    except (OSError, ValueError, AttributeError):
        stored = None
    return stored if isinstance(stored, str) else "auto"


def _died(result: Any) -> str | None:
    """"worker 1 died (signal 9, SIGKILL)" when a signal other than the launcher's own
    (SIGTERM, SIGINT: sent to stop the others) ended a worker, else None."""
    import signal

    for rank, code in sorted(result.exit_codes.items()):
        if code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
            return f"worker {rank} died (signal {-code}, {result.killed[rank]})"
    return None


def command_line_args(ctx: typer.Context, exclude: Collection[str] = ()) -> list[str]:
    """The options of ``ctx``'s command given on the command line (those left at their
    default omitted), as ``--name=value`` / ``--flag`` / ``--no-flag`` arguments that parse
    back to the same values; ``exclude``: parameter names to leave out."""
    args = []
    for param in ctx.command.params:
        name = param.name
        if name in exclude or name not in ctx.params:
            continue
        source = ctx.get_parameter_source(name)
        if source is None or source.name != "COMMANDLINE":
            continue
        value = ctx.params[name]
        flag = max((o for o in param.opts if o.startswith("--")), key=len, default=param.opts[0])
        if getattr(param, "is_flag", False):
            if param.secondary_opts:  # --augment/--no-augment
                args.append(flag if value else param.secondary_opts[0])
            elif value:
                args.append(flag)
            continue
        args.append(f"{flag}={value}")
    return args
