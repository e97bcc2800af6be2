"""``lip train``: the paper's training recipe end to end (see :mod:`lipcli.train`)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from lipcli.cli.common import cli_errors, print_json
from lipcli.sdk.errors import LipUsageError
from lipcli.cli.registry_options import RegistryCommand, given_shortcuts
from lipcli.cli.options import (DataDirOption, DeviceOption, DownloadOption, JsonOption, QuietOption,
                                ThreadsOption)
from lipcli.train.config import (DEFAULT_EXTRA_RATIO, DEFAULT_NPROC_PER_NODE, MAX_CUDA_WORKERS,
                                 MAX_NPROC_PER_NODE, OPTIMIZER_LR, SCHEDULES, TrainConfig)

_COMPONENT = "NAME or NAME:key=value,..."
#: the command class: options and help texts completed from the plugin registry
COMMAND_CLASS = RegistryCommand
#: the defaults the options have and show (written once, in TrainConfig); an option counts as
#: given (over a --config file, or over the stored settings with --resume) only when it was
#: on the command line
_D = TrainConfig()
_LRS = ", ".join(f"{name} {lr:g}" for name, lr in OPTIMIZER_LR.items())


@cli_errors
def train(
    ctx: typer.Context,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="Start from a published recipe (NAME or "
        "NAME@VERSION; `lip plugins -v` lists them with their values and sources): its settings "
        "become the defaults and the options given here win; the model file records the recipe "
        "and every setting given over it.")] = None,
    arch: Annotated[str, typer.Option("--arch", help=f"Architecture ({_COMPONENT}); {_D.arch} is the "
        "CPU-friendly baseline, the paper's best CIFAR models are lipconvnet-10..40.")] = _D.arch,
    conv: Annotated[str, typer.Option("--conv", help=f"Convolution ({_COMPONENT}).")] = _D.conv,
    activation: Annotated[str, typer.Option("--activation", help="Activation.")] = _D.activation,
    pool: Annotated[str, typer.Option("--pool", help="Pooling (max, projection, ...).")] = _D.pool,
    # the help of --head, --loss and --grad-clip lists the installed components
    # (RegistryCommand fills it in)
    head: Annotated[str, typer.Option("--head", help="Head.")] = _D.head,
    loss: Annotated[Optional[str], typer.Option("--loss", help=f"Training loss ({_COMPONENT}); "
        "default: the head's.")] = _D.loss,
    width: Annotated[Optional[int], typer.Option("--width", help="Architecture width (channels after the "
        "stem; paper 32); default: the architecture's.")] = _D.width,
    dataset: Annotated[str, typer.Option("--dataset", help="Data set: cifar10, cifar100, imagefolder, "
        "digits, or a plugin's.")] = _D.dataset,
    data_dir: DataDirOption = None,
    download: DownloadOption = None,
    extra_data: Annotated[Optional[Path], typer.Option("--extra-data", help="Extra training images: an "
        "uncompressed .npz (or a directory) with 'image' uint8 NxHxWxC and 'label'; "
        "memory-mapped, augmented like the data set.")] = None,
    extra_ratio: Annotated[Optional[float], typer.Option("--extra-ratio", help="Fraction of each batch "
        f"drawn from --extra-data (default {DEFAULT_EXTRA_RATIO:g}).")] = _D.extra_ratio,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Model file to write (default "
        "RUN_DIR/model.safetensors).")] = None,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Run directory for checkpoint and "
        "logs (default: OUT's stem + '-run' beside --out, else runs/ARCH-HEAD-TIMESTAMP).")] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="Epochs.")] = _D.epochs,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Global batch size, split over "
        "processes.")] = _D.batch_size,
    eval_batch_size: Annotated[int, typer.Option("--eval-batch-size", help="Batch size of validation and "
        "the test evaluation (may change on --resume).")] = _D.eval_batch_size,
    optimizer: Annotated[str, typer.Option("--optimizer", help=f"Optimiser: {', '.join(OPTIMIZER_LR)} "
        f"({_D.optimizer}: the paper's).")] = _D.optimizer,
    lr: Annotated[Optional[float], typer.Option("--lr", help=f"Learning rate (default per optimiser: "
        f"{_LRS}).")] = _D.lr,
    momentum: Annotated[float, typer.Option("--momentum", help="SGD momentum.")] = _D.momentum,
    betas: Annotated[str, typer.Option("--betas", help="Adam's B1,B2 for adamw and nadam.")] = ",".join(
        f"{b:g}" for b in _D.betas),
    lookahead: Annotated[int, typer.Option("--lookahead", help="Wrap the optimiser in Lookahead, syncing "
        f"every K steps (alpha {_D.lookahead_alpha}); 0: off.")] = _D.lookahead,
    schedule: Annotated[str, typer.Option("--schedule", help=f"LR schedule per step: {', '.join(SCHEDULES)} "
        f"(step: x{_D.lr_gamma:g} at {' and '.join(f'{m:.0%}' for m in _D.lr_milestones)} of "
        "training; triangular: SLL's, 0 -> lr at 40%, lr/20 at 80%, 0 at the end).")] = _D.schedule,
    warmup_epochs: Annotated[float, typer.Option("--warmup-epochs", help="Linear LR warm-up over this many "
        "epochs.")] = _D.warmup_epochs,
    weight_decay: Annotated[float, typer.Option("--weight-decay", help="Weight decay on conv filters and the "
        "LLN weight.")] = _D.weight_decay,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = _D.seed,
    workers: Annotated[Optional[int], typer.Option("--workers", help="Data loader worker processes "
        f"(default: 0 on CPU, up to {MAX_CUDA_WORKERS} on CUDA).")] = _D.workers,
    device: DeviceOption = _D.device,
    amp: Annotated[bool, typer.Option("--amp", help="Mixed precision for training steps (bf16; evaluation "
        "stays fp32).")] = _D.amp,
    cuda_graphs: Annotated[str, typer.Option("--cuda-graphs", help="auto (on CUDA where the configuration "
        "allows), on or off: replay each training step from a CUDA graph (same values; fewer "
        "kernel launches).")] = _D.cuda_graphs,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", show_default=False,
        help="torch.compile the training forward (values equal eager's to float rounding; "
        "the bound and the model file come from the stored weights; recorded in the model "
        "file). Default: per device, eager where compiling was not measured faster (CPU: "
        "eager).")] = _D.compile,
    compile_mode: Annotated[str, typer.Option("--compile-mode", help="torch.compile mode with "
        "--compile: default, reduce-overhead or max-autotune (these two replay CUDA graphs "
        "themselves: --cuda-graphs is then not used).")] = _D.compile_mode,
    augment: Annotated[bool, typer.Option("--augment/--no-augment", help="Random crop (+ flip) "
        "augmentation.")] = _D.augment,
    augmentation: Annotated[str, typer.Option("--augmentation", help="Augmentation policy.")] = _D.augmentation,
    # here RegistryCommand adds the loss parameters' shortcut options (Param.shortcut)
    grad_clip: Annotated[Optional[float], typer.Option("--grad-clip", help="Gradient-norm clipping "
        "(default: the loss's; 0 = off).")] = _D.grad_clip,
    val_split: Annotated[float, typer.Option("--val-split", help="Hold out this fraction of the training "
        "set for validation (never the test set).")] = _D.val_split,
    keep_best: Annotated[bool, typer.Option("--keep-best", help="Keep the weights of the best validation "
        "epoch (needs --val-split).")] = _D.keep_best,
    limit_train: Annotated[Optional[int], typer.Option("--limit-train", help="Train on a seeded random "
        "subset of N images.")] = _D.limit_train,
    limit_test: Annotated[Optional[int], typer.Option("--limit-test", help="Test on N images: a seeded subset "
        "stratified by class, the same for every --seed and the one `lip certify --limit N` "
        "evaluates.")] = _D.limit_test,
    lipschitz_estimate: Annotated[bool, typer.Option("--lipschitz-estimate/--no-lipschitz-estimate",
        help="Also store the power-method estimate of Lip(g) (the guaranteed bound is always "
        "stored).")] = _D.lipschitz_estimate,
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
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    threads: ThreadsOption = None,
) -> None:
    """Train a provably 1-Lipschitz network with the paper's recipe (resumable; DDP).

    Writes a run directory (config.json, train_log.jsonl, checkpoint.safetensors) and the
    model file, whose metadata holds the config, data set, guaranteed Lipschitz bound,
    test accuracy and the training record.  Ctrl-C keeps the last epoch's checkpoint:
    continue with `lip train --resume RUN_DIR`.  Several processes: `lip train
    --nproc-per-node N ...` (or `torchrun --nproc-per-node N -m lipcli train ...`).
    """
    from lipcli.cli.dataroot import default_root as in_default_root, for_training
    from lipcli.sdk.errors import LipUsageError
    from lipcli.train import load_config_file
    from lipcli.train import train as run_training

    given = _given_settings(ctx)
    given.pop("recipe", None)  # the --recipe option: applied below, recorded as "name@version"
    plan: dict[str, Any]
    positional: list[Any] = []  # the config of a new run
    default_root: str | None = None  # the default data root, when the run's data set lives there
    if resume is not None:
        if config is not None:
            raise LipUsageError("--resume uses the run's stored settings; drop --config")
        if run_dir is not None:
            raise LipUsageError("--resume RUN_DIR already names the run directory; drop --run-dir")
        if recipe is not None:
            raise LipUsageError("--resume keeps the run's recipe and settings; drop --recipe")
        plan = {"resume": str(resume), "resume_overrides": given}
    else:
        cfg = _new_config(recipe, None if config is None else load_config_file(config), str(config), given)
        cfg, default_root = for_training(cfg, "download" in given)
        positional = [cfg]
        plan = {"run_dir": None if run_dir is None else str(run_dir)}
    plan.update(out=None if out is None else str(out), overwrite=overwrite)
    with in_default_root(default_root, quiet):
        if nproc_per_node > 1:
            _launch(ctx, nproc_per_node, oversubscribe, positional, plan)
            return
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


def _given_settings(ctx: typer.Context) -> dict[str, Any]:
    """The TrainConfig settings given on the command line (not those left at their default),
    as TrainConfig values (paths as strings, ``cuda_graphs`` normalised), with the loss
    parameters' shortcut settings (:mod:`lipcli.cli.registry_options`)."""
    given = given_shortcuts(ctx)
    for name in TrainConfig.field_names():
        source = ctx.get_parameter_source(name) if name in ctx.params else None
        if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
            continue
        value = ctx.params[name]
        if isinstance(value, Path):
            value = str(value)
        elif name in ("cuda_graphs", "compile_mode"):
            value = value.strip().lower()
        given[name] = value
    return given


def _new_config(recipe: str | None, file_data: dict[str, Any] | None, file_name: str,
                given: dict[str, Any]) -> TrainConfig:
    """A new run's settings: lipcli's defaults, then the recipe's values (``--recipe``, or a
    settings file's ``recipe`` key), then the settings file, then the command line; with a
    recipe, its ``name@version`` and the settings given over it are recorded."""
    import dataclasses

    from lipcli.host.plugins import get_registry
    from lipcli.host.recipes import overrides, resolve_recipe

    data = {str(k).replace("-", "_"): v for k, v in (file_data or {}).items()}
    named = data.pop("recipe", None)
    data.pop("recipe_overrides", None)  # recomputed: a stored config may be read back as a file
    recipe = recipe if recipe is not None else named
    if recipe is not None and not isinstance(recipe, str):
        raise LipUsageError(f"{file_name}: setting 'recipe' must be a string, got {recipe!r}")
    cfg, spec = TrainConfig(), None
    if recipe is not None:
        spec = resolve_recipe(get_registry(), recipe)
        cfg = _without_file_width(cfg.updated(dict(spec.values), source=f"recipe {spec.label}"),
                                  {**data, **given})
    if file_data is not None:
        cfg = _without_file_width(cfg.updated(data, source=file_name), given)
    cfg = cfg.updated(given, source="command line")
    if spec is not None:
        explicit = set(data) | set(given)
        if "warmup_epochs" not in explicit and cfg.warmup_epochs > cfg.epochs:  # e.g. a short trial run
            raise LipUsageError(f"recipe {spec.label} warms up for {cfg.warmup_epochs:g} epochs, more than "
                                f"--epochs {cfg.epochs}; give --warmup-epochs too")
        cfg = dataclasses.replace(cfg, recipe=spec.label, recipe_overrides=overrides(spec, cfg.to_json(), explicit))
    return cfg


def _without_file_width(cfg, given: dict):
    """The command line wins over a settings file, the width included: a width given on the
    command line (``--width W`` or ``--arch NAME:width=W``) replaces the file's width in
    either form (its ``width`` key and an inline ``width=`` in its ``arch``)."""
    import dataclasses

    from lipcli.host.plugins import parse_component_choice

    arch_given = given.get("arch")
    if "width" not in given and not (
        isinstance(arch_given, str) and "width" in parse_component_choice(arch_given)[1]
    ):
        return cfg
    name, params = parse_component_choice(cfg.arch)
    if "width" in params:
        del params["width"]
        arch = name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
        cfg = dataclasses.replace(cfg, arch=arch)
    return dataclasses.replace(cfg, width=None)
