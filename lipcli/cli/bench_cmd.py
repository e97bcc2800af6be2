"""``lip bench``: measure training speed (paper Table 1), certification throughput and where
the time of a training step goes.  Synthetic inputs; every number is measured in the run
that prints it (logic in :mod:`lipcli.bench`, tables in :mod:`lipcli.cli.bench_tables`)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from lipcli.cli import bench_tables as tables
from lipcli.cli.common import cli_errors, dumps_json, fail, print_json, stderr_console
from lipcli.bench.options import (CERTIFY_MODEL_OPTIONS, CertifyBenchOptions, ProfileBenchOptions,
                                  TrainBenchOptions)
from lipcli.cli.options import DeviceOption, JsonOption, QuietOption, ThreadsOption
from lipcli.cli.settings_options import with_settings
from lipcli._util.devices import DEFAULT_DEVICE

bench_app = typer.Typer(
    help=(
        "Measure speed on synthetic inputs: fast vs exact SOC training (paper Table 1), "
        "certification throughput, and a profile of one training step."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,  # plain click help, as the main app
)

# options that two or three of the commands share besides their settings (--device, --json
# and --quiet are every command's: lipcli.cli.options)
Output = Annotated[Optional[str], typer.Option(
    "--output", "-o", help="Also write the JSON report to this file.")]


def _setup(device: str, threads: Optional[int], cudnn_benchmark: bool = False):
    """Apply ``--cudnn-benchmark`` and resolve ``--device`` (lazy torch); ``--threads`` was
    applied while the command line was parsed (:data:`lipcli.cli.options.ThreadsOption`)."""
    import torch

    from lipcli.bench import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_benchmark
    return dev


def _progress(quiet: bool):
    if quiet:
        return lambda _msg: None
    console = stderr_console()
    return lambda msg: console.print(f"[dim]{msg}[/dim]", highlight=False)


def _check_components(**choices: str) -> None:
    """Fail early (exit 2) on unknown component names or parameters."""
    from lipcli.host.plugins import get_registry

    registry = get_registry()
    for kind, choice in choices.items():
        registry.component(kind, choice)


def _check_output(path: Optional[str]) -> None:
    """``--output``: fail (exit 2) before the benchmark runs if the file cannot be written."""
    if path is not None:
        from lipcli._util.outputs import check_output_file

        check_output_file(path, "--output")


def _save(report: dict[str, Any], path: Optional[str]) -> Optional[str]:
    """Write the JSON report; returns an error message instead of raising, so that the
    caller prints the results first (the benchmark is not lost)."""
    if path is None:
        return None
    from lipcli.host.modelfile import atomic_write_bytes

    try:  # temporary file in the same folder, fsync, rename (as model files)
        atomic_write_bytes(path, (dumps_json(report) + "\n").encode("utf-8"))
    except OSError as exc:
        return f"cannot write {path} (--output): {exc.strerror or exc}"
    return None


def _finish(report: Any, output: Optional[str], json_out: bool, printer) -> None:
    """Save ``--output``, print the report (its JSON or ``printer``'s table), then report a
    failed save; ``report`` is one of :mod:`lipcli.bench.reports`' reports."""
    data = report.to_json()
    error = _save(data, output)
    if json_out:
        print_json(data)
    else:
        printer(report)
    if error:
        fail(error, 1)


def _one_arch(text: str) -> str:
    """Exactly one architecture name (shorthand ``20`` accepted)."""
    from lipcli.bench import parse_archs
    from lipcli.sdk.errors import LipUsageError
    from lipcli.host.plugins import get_registry

    names = parse_archs(text, get_registry().names("arch"))
    if len(names) != 1:
        raise LipUsageError(f"give exactly one architecture, got {text!r}")
    return names[0]


def component_lists(**given: Optional[str]) -> Optional[dict[str, list[str]]]:
    """``lip bench train``'s component lists (kind -> choices, defaults filled in from
    :data:`lipcli.host.models.DEFAULTS`), or ``None`` for the Table 1 comparison: no --conv or
    --activation and one --pool and --head.  Every choice is checked (exit 2 if unknown)."""
    from lipcli.host.models import DEFAULTS
    from lipcli.host.plugins import get_registry, split_component_choices

    lists = {kind: split_component_choices(text) for kind, text in given.items() if text is not None}
    if all(len(lists.get(kind, [])) <= 1 for kind in lists) and all(
        given.get(kind) is None for kind in ("conv", "activation")
    ):
        return None
    registry = get_registry()
    out = {kind: lists.get(kind) or [DEFAULTS[kind]] for kind in DEFAULTS}
    for kind, items in out.items():
        for item in items:
            registry.component(kind, item)
    return out


def _options(cls: type, settings: dict[str, Any]) -> Any:
    """The command's settings as ``cls`` (its declared ranges checked: one line, exit 2)."""
    from lipcli.bench.options import check_settings

    check_settings(cls, **settings)
    return cls(**settings)


# Each command's options are its settings table (lipcli.bench.options: with_settings); the
# signatures list the others.
@bench_app.command("train", short_help="Step time of soc-fast vs soc (the paper's Table 1).")
@with_settings(TrainBenchOptions, before="device")
@cli_errors
def train(
    recipe: Annotated[Optional[list[str]], typer.Option(
        "--recipe", help="Time these recipes' networks beside lipconvnet-5 with lipcli's defaults "
        "(repeatable or NAME,NAME; --width replaces each recipe's width; see `lip plugins -v`).",
    )] = None,
    device: DeviceOption = DEFAULT_DEVICE,
    threads: ThreadsOption = None,
    json_out: JsonOption = False, output: Output = None, quiet: QuietOption = False,
    **settings: Any,
) -> None:
    """Time per training step and per CIFAR-10 epoch, fast (soc-fast) vs exact (soc)
    gradient, interleaved from identical weights (paper Table 1); on CUDA also the
    convolution kernel time per step beside the step time.

    With --conv or --activation (or several --pool/--head): compare those
    components instead, every combination on the same architecture and batch,
    interleaved in one run (step time, images/s, peak memory, relative to the
    first; eager steps: --cuda-graphs, --floor and --compile apply to Table 1 only).

    With --recipe: each recipe's network (its arch, conv, activation, pool and
    head; --width replaces its width) beside lipconvnet-5 with the defaults,
    interleaved the same way."""
    from lipcli.bench import EXACT_CONV, FAST_CONV, bench_train, parse_archs
    from lipcli.compiling import cli_compile_mode
    from lipcli.sdk.errors import LipUsageError
    from lipcli.host.plugins import get_registry

    o = _options(TrainBenchOptions, settings)
    steps = dict(batch_size=o.batch_size, steps=o.steps, warmup=o.warmup, width=o.width, num_classes=o.classes,
                 seed=o.seed, measure_memory=o.memory)
    if o.recipe_widths is not None and not recipe:
        raise LipUsageError("--recipe-widths needs --recipe")
    if recipe:
        from lipcli.bench.recipes import bench_recipes, parse_recipe_widths, split_recipe_names

        if o.conv is not None or o.activation is not None:
            raise LipUsageError("--recipe times each recipe's own network; drop --conv/--activation")
        names = split_recipe_names(recipe)
        widths = parse_recipe_widths(o.recipe_widths, names)
        _check_output(output)
        report = bench_recipes(names, device=_setup(device, threads, o.cudnn_benchmark), progress=_progress(quiet),
                               recipe_widths=widths, **steps)
        _finish(report, output, json_out, tables.print_components)
        return
    dev = _setup(device, threads, o.cudnn_benchmark)
    names = parse_archs(o.archs, get_registry().names("arch"))
    choices = component_lists(conv=o.conv, activation=o.activation, pool=o.pool, head=o.head)
    if choices is not None:
        from lipcli.bench.compare import bench_components

        _check_output(output)
        report = bench_components(names, choices, device=dev, progress=_progress(quiet), **steps)
        _finish(report, output, json_out, tables.print_components)
        return
    _check_components(head=o.head, pool=o.pool, conv=FAST_CONV)
    _check_components(conv=EXACT_CONV)
    _check_output(output)
    report = bench_train(
        names, device=dev, head=o.head, pool=o.pool, progress=_progress(quiet), floor=o.floor,
        cuda_graphs=o.cuda_graphs == "on" or (o.cuda_graphs == "auto" and dev.type == "cuda"), **steps,
        compile=cli_compile_mode(o.compile, o.compile_mode, dev) or "off",
    )
    _finish(report, output, json_out, tables.print_train)


@bench_app.command("certify", short_help="Inputs/s of feature extraction and certificates.")
@with_settings(CertifyBenchOptions, before="device")
@cli_errors
def certify(
    ctx: typer.Context,
    model_path: Annotated[Optional[str], typer.Argument(
        metavar="[MODEL]", help="A lipcli model file (default: a random model).")] = None,
    device: DeviceOption = DEFAULT_DEVICE,
    threads: ThreadsOption = None,
    json_out: JsonOption = False, output: Output = None, quiet: QuietOption = False,
    **settings: Any,
) -> None:
    """Inputs/s of feature extraction and of the head's certificate(s), and the time of the
    guaranteed Lipschitz bound and of the power estimate; the feature pass in its literal
    form (series) against the eval lowering that lip certify runs, interleaved."""
    from lipcli.bench import bench_certify, build_model
    from lipcli.compiling import cli_compile_mode
    from lipcli.sdk.errors import LipUsageError

    o = _options(CertifyBenchOptions, settings)
    if model_path is not None:
        from pathlib import Path

        if not Path(model_path).exists():
            raise LipUsageError(f"model file not found: {model_path}")
        if Path(model_path).is_dir():
            raise LipUsageError(f"{model_path} is a directory, not a model file")
        # options that describe a model to build mean nothing for a model file
        given = [
            f"--{name}" for name in CERTIFY_MODEL_OPTIONS
            if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")
        ]
        if given:
            raise LipUsageError(
                f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to a random "
                f"model built from --arch, not to the model file {model_path}"
            )
    dev = _setup(device, threads, o.cudnn_benchmark)
    _check_output(output)
    if model_path is not None:
        from lipcli.host.models import load_model

        model, _mf = load_model(model_path)
        source = f"model file {model_path}"
    else:
        name = _one_arch(o.arch)
        _check_components(head=o.head, conv=o.conv, pool=o.pool)
        model = build_model(name, conv=o.conv, head=o.head, pool=o.pool, width=o.width,
                            num_classes=o.classes, seed=o.seed)
        source = "random weights (untrained, freshly initialised)"
    report = bench_certify(
        model, batch_size=o.batch_size, n=o.n, device=dev, top_k=o.top_k, fit_head_steps=o.fit_head,
        fit_loss=o.fit_loss, lipschitz_iters=o.lipschitz_iters, refresh_steps=o.refresh_steps,
        source=source, seed=o.seed, progress=_progress(quiet), path_rounds=o.path_rounds,
        dense_max_mib=o.dense_max_mib, compile_mode=cli_compile_mode(o.compile, o.compile_mode, dev),
    )
    _finish(report, output, json_out, tables.print_certify)


@bench_app.command("profile", short_help="Share of a training step spent in convolutions.")
@with_settings(ProfileBenchOptions, before="device")
@cli_errors
def profile(
    device: DeviceOption = DEFAULT_DEVICE,
    threads: ThreadsOption = None,
    json_out: JsonOption = False, output: Output = None, quiet: QuietOption = False,
    **settings: Any,
) -> None:
    """Share of training-step time spent in convolutions versus everything else
    (torch.profiler)."""
    from lipcli.bench import bench_profile

    o = _options(ProfileBenchOptions, settings)
    dev = _setup(device, threads, o.cudnn_benchmark)
    name = _one_arch(o.arch)
    _check_components(conv=o.conv, head=o.head, pool=o.pool)
    _check_output(output)
    if quiet:
        _quiet_profiler()
    report = bench_profile(
        name, conv=o.conv, batch_size=o.batch_size, steps=o.steps, warmup=o.warmup, device=dev,
        width=o.width, head=o.head, pool=o.pool, num_classes=o.classes, seed=o.seed,
        progress=_progress(quiet),
    )
    report.check_target(o.target)
    _finish(report, output, json_out, tables.print_profile)


def _quiet_profiler() -> None:
    """``-q``: silence kineto (torch.profiler's tracer), which otherwise writes its own
    ``USDT ... profiler_start/stop`` lines and, on a machine without CUDA, ``ERROR ...
    gpuGetDeviceCount failed`` to stderr.  kineto reads ``KINETO_LOG_LEVEL`` once, when the
    profiler is first used in the process (0 verbose ... 5 errors; 6: nothing); a level the
    user set is kept."""
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


from lipcli.cli.bench_layers_cmd import layers as _layers  # noqa: E402 - its own module

bench_app.command("layers", short_help="Every installed convolution in the study's network.")(_layers)
