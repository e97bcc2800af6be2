"""``lip bench``: measure training speed (paper Table 1), certification throughput and where
the time of a training step goes.  Synthetic inputs; every number is measured in the run
that prints it (logic in :mod:`lipcli.bench`, tables in :mod:`lipcli.cli.bench_tables`)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from lipcli.cli import bench_tables as tables
from lipcli.cli.common import cli_errors, dumps_json, fail, print_json, stderr_console
from lipcli.cli.options import CompileModeOption, DeviceOption, JsonOption, QuietOption, ThreadsOption
from lipcli.lowering.caps import describe_certify_default
from lipcli._util.devices import DEFAULT_DEVICE
from lipcli.host.defaults import DEFAULT_COMPONENTS as _DC

bench_app = typer.Typer(
    help=(
        "Measure speed on synthetic inputs: fast vs exact SOC training (paper Table 1), "
        "certification throughput, and a profile of one training step."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,  # plain click help, as the main app
)

#: every registered LipConvnet depth (lipcli.builtins.lipconvnet.DEPTHS; spelled out here so
#: that `lip bench --help` does not import torch)
_DEFAULT_ARCHS = "5,10,15,20,25,30,35,40"

# options that two or three of the commands share (each defined once; --device, --json and
# --quiet are every command's: lipcli.cli.options)
Output = Annotated[Optional[str], typer.Option(
    "--output", "-o", help="Also write the JSON report to this file.")]
_CUDNN = "--cudnn-benchmark/--no-cudnn-benchmark"
#: --cudnn-benchmark of the training-step benchmarks
StepCudnn = Annotated[bool, typer.Option(
    _CUDNN, help="CUDA: let cuDNN autotune convolution algorithms (warm-up steps absorb the tuning).")]
StepBatch = Annotated[int, typer.Option("--batch-size", help="Images per training step.")]
Conv = Annotated[str, typer.Option("--conv", help="Convolution component.")]
Pool = Annotated[str, typer.Option("--pool", help="Pool component.")]
Classes = Annotated[int, typer.Option("--classes", help="Number of classes.")]
Width = Annotated[int, typer.Option("--width", help="LipConvnet width.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for weights and inputs.")]


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


@bench_app.command("train", short_help="Step time of soc-fast vs soc (the paper's Table 1).")
@cli_errors
def train(
    archs: Annotated[str, typer.Option(
        "--archs", help="Comma-separated LipConvnet depths or names (5,10 or lipconvnet-5,...).",
    )] = _DEFAULT_ARCHS,
    batch_size: StepBatch = 128,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps per model.")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed warm-up steps per model.")] = 2,
    device: DeviceOption = DEFAULT_DEVICE,
    width: Annotated[int, typer.Option(
        "--width", help="LipConvnet width (channels after the stem).")] = 32,
    conv: Annotated[Optional[str], typer.Option(
        "--conv",
        help="Compare these convolutions instead of Table 1, e.g. soc-fast,soc,cayley "
        "(any installed plugin's; inline parameters as name:key=value).",
    )] = None,
    activation: Annotated[Optional[str], typer.Option(
        "--activation", help=f"Compare these activations, e.g. maxmin,householder (default: {_DC['activation']}).",
    )] = None,
    recipe: Annotated[Optional[list[str]], typer.Option(
        "--recipe", help="Time these recipes' networks beside lipconvnet-5 with lipcli's defaults "
        "(repeatable or NAME,NAME; --width replaces each recipe's width; see `lip plugins -v`).",
    )] = None,
    head: Annotated[str, typer.Option(
        "--head", help="Head component(s) (Table 1: lln); several compare them.")] = _DC["head"],
    pool: Annotated[str, typer.Option(
        "--pool", help="Pool component(s) (Table 1: max); several compare them.")] = _DC["pool"],
    classes: Classes = 10,
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed for weights and synthetic batches.")] = 0,
    threads: ThreadsOption = None,
    cudnn_benchmark: StepCudnn = False,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="Measure peak memory.")] = True,
    cuda_graphs: Annotated[str, typer.Option(
        "--cuda-graphs",
        help="auto (on for CUDA), on or off: replay both models' steps from CUDA graphs.",
    )] = "auto",
    floor: Annotated[bool, typer.Option(
        "--floor/--no-floor",
        help="CUDA: profile the convolution kernel time per step (the floor of a step).",
    )] = True,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", show_default=False, help="Table 1: "
        "torch.compile both models' forward (in the warm-up steps; compile seconds reported apart).")] = None,
    compile_mode: CompileModeOption = "default",
    json_out: JsonOption = False, output: Output = None, quiet: QuietOption = False,
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
    from lipcli.train.cuda_graphs import check_graph_mode
    from lipcli.sdk.errors import LipUsageError
    from lipcli.host.plugins import get_registry

    mode = cli_compile_mode(True, compile_mode, "cpu")  # checked before any work
    try:
        graphs = check_graph_mode(cuda_graphs)
    except ValueError as exc:
        raise LipUsageError(f"--{exc}") from None
    if recipe:
        from lipcli.bench.recipes import bench_recipes, split_recipe_names

        if conv is not None or activation is not None:
            raise LipUsageError("--recipe times each recipe's own network; drop --conv/--activation")
        names = split_recipe_names(recipe)
        _check_output(output)
        report = bench_recipes(names, device=_setup(device, threads, cudnn_benchmark), progress=_progress(quiet),
                               batch_size=batch_size, steps=steps, warmup=warmup, width=width,
                               num_classes=classes, seed=seed, measure_memory=memory)
        _finish(report, output, json_out, tables.print_components)
        return
    dev = _setup(device, threads, cudnn_benchmark)
    names = parse_archs(archs, get_registry().names("arch"))
    choices = component_lists(conv=conv, activation=activation, pool=pool, head=head)
    if choices is not None:
        from lipcli.bench.compare import bench_components

        _check_output(output)
        report = bench_components(
            names, choices, batch_size=batch_size, steps=steps, warmup=warmup, device=dev,
            width=width, num_classes=classes, seed=seed, measure_memory=memory,
            progress=_progress(quiet),
        )
        _finish(report, output, json_out, tables.print_components)
        return
    _check_components(head=head, pool=pool, conv=FAST_CONV)
    _check_components(conv=EXACT_CONV)
    _check_output(output)
    report = bench_train(
        names, batch_size=batch_size, steps=steps, warmup=warmup, device=dev, width=width,
        head=head, pool=pool, num_classes=classes, seed=seed, measure_memory=memory,
        cuda_graphs=graphs == "on" or (graphs == "auto" and dev.type == "cuda"), floor=floor,
        progress=_progress(quiet), compile=cli_compile_mode(compile, mode, dev) or "off",
    )
    _finish(report, output, json_out, tables.print_train)


#: ``lip bench certify`` options that describe the random model to build (not a model file)
_MODEL_OPTIONS = ("arch", "head", "conv", "pool", "width", "classes")


@bench_app.command("certify", short_help="Inputs/s of feature extraction and certificates.")
@cli_errors
def certify(
    ctx: typer.Context,
    model_path: Annotated[Optional[str], typer.Argument(
        metavar="[MODEL]", help="A lipcli model file (default: a random model).")] = None,
    arch: Annotated[str, typer.Option(
        "--arch", help="Architecture (e.g. 5 or lipconvnet-10).")] = _DC["arch"],
    head: Annotated[str, typer.Option("--head", help="Head: lln (linear) or mlp (CRC-Lip).")] = _DC["head"],
    conv: Conv = _DC["conv"],
    pool: Pool = _DC["pool"],
    width: Width = 32,
    classes: Annotated[int, typer.Option(
        "--classes", help="Number of classes (10 or 100 for CIFAR).")] = 10,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Inputs per batch.")] = 256,
    n: Annotated[int, typer.Option("--n", help="Number of synthetic inputs.")] = 1024,
    top_k: Annotated[Optional[int], typer.Option(
        "--top-k", help="Also time the certificate restricted to the top-k classes (heuristic).",
    )] = None,
    fit_head: Annotated[int, typer.Option(
        "--fit-head",
        help="At most this many Adam steps fitting the head to a random teacher "
        "(trained-like margins); 0 = random head.",
    )] = 0,
    fit_loss: Annotated[float, typer.Option(
        "--fit-loss", help="With --fit-head: stop once the head's cross-entropy is this low.",
    )] = 0.7,
    lipschitz_iters: Annotated[int, typer.Option(
        "--lipschitz-iters", help="Power-method iterations.")] = 50,
    refresh_steps: Annotated[int, typer.Option(
        "--refresh-steps", help="Power-iteration steps refreshing σ before evaluation.")] = 50,
    device: DeviceOption = DEFAULT_DEVICE,
    seed: Seed = 0,
    threads: ThreadsOption = None,
    cudnn_benchmark: Annotated[bool, typer.Option(
        _CUDNN, help="CUDA: let cuDNN autotune convolution algorithms (lip certify does not).",
    )] = False,
    path_rounds: Annotated[int, typer.Option(
        "--path-rounds", help="Rounds of the interleaved series-vs-lowered feature pass "
        "comparison (one batch each per round, FLOP per input by torch's flop counter); 0: none.",
    )] = 3,
    dense_max_mib: Annotated[Optional[float], typer.Option(
        "--dense-max-mib", help="Cap of the eval lowering per layer, MiB of float32 "
        f"(default: lip certify's, {describe_certify_default()}); every layer that fits and "
        "is cheaper is lowered (the build's time is reported, not weighed).",
    )] = None,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", show_default=False, help="Add the "
        "lowered feature pass compiled by torch.compile to the feature paths.")] = None,
    compile_mode: CompileModeOption = "default",
    json_out: JsonOption = False, output: Output = None, quiet: QuietOption = False,
) -> None:
    """Inputs/s of feature extraction and of the head's certificate(s), and the time of the
    guaranteed Lipschitz bound and of the power estimate; the feature pass in its literal
    form (series) against the eval lowering that lip certify runs, interleaved."""
    from lipcli.bench import bench_certify, build_model
    from lipcli.compiling import cli_compile_mode
    from lipcli.sdk.errors import LipUsageError

    if model_path is not None:
        from pathlib import Path

        if not Path(model_path).exists():
            raise LipUsageError(f"model file not found: {model_path}")
        if Path(model_path).is_dir():
            raise LipUsageError(f"{model_path} is a directory, not a model file")
        # options that describe a model to build mean nothing for a model file
        given = [
            f"--{name}" for name in _MODEL_OPTIONS
            if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")
        ]
        if given:
            raise LipUsageError(
                f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to a random "
                f"model built from --arch, not to the model file {model_path}"
            )
    dev = _setup(device, threads, cudnn_benchmark)
    _check_output(output)
    if model_path is not None:
        from lipcli.host.models import load_model

        model, _mf = load_model(model_path)
        source = f"model file {model_path}"
    else:
        name = _one_arch(arch)
        _check_components(head=head, conv=conv, pool=pool)
        model = build_model(name, conv=conv, head=head, pool=pool, width=width,
                            num_classes=classes, seed=seed)
        source = "random weights (untrained, freshly initialised)"
    report = bench_certify(
        model, batch_size=batch_size, n=n, device=dev, top_k=top_k, fit_head_steps=fit_head,
        fit_loss=fit_loss, lipschitz_iters=lipschitz_iters, refresh_steps=refresh_steps,
        source=source, seed=seed, progress=_progress(quiet), path_rounds=path_rounds,
        dense_max_mib=dense_max_mib, compile_mode=cli_compile_mode(compile, compile_mode, dev),
    )
    _finish(report, output, json_out, tables.print_certify)


@bench_app.command("profile", short_help="Share of a training step spent in convolutions.")
@cli_errors
def profile(
    arch: Annotated[str, typer.Option(
        "--arch", help="Architecture (e.g. 20 or lipconvnet-20).")] = "lipconvnet-20",
    conv: Conv = _DC["conv"],
    batch_size: StepBatch = 128,
    steps: Annotated[int, typer.Option("--steps", help="Profiled steps.")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", help="Unprofiled warm-up steps.")] = 1,
    device: DeviceOption = DEFAULT_DEVICE,
    width: Width = 32,
    head: Annotated[str, typer.Option("--head", help="Head component.")] = _DC["head"],
    pool: Pool = _DC["pool"],
    classes: Classes = 10,
    target: Annotated[float, typer.Option(
        "--target", help="Convolution share to check against (%).")] = 90.0,
    seed: Seed = 0,
    threads: ThreadsOption = None,
    cudnn_benchmark: StepCudnn = False,
    json_out: JsonOption = False, output: Output = None, quiet: QuietOption = False,
) -> None:
    """Share of training-step time spent in convolutions versus everything else
    (torch.profiler)."""
    from lipcli.bench import bench_profile

    dev = _setup(device, threads, cudnn_benchmark)
    name = _one_arch(arch)
    _check_components(conv=conv, head=head, pool=pool)
    _check_output(output)
    if quiet:
        _quiet_profiler()
    report = bench_profile(
        name, conv=conv, batch_size=batch_size, steps=steps, warmup=warmup, device=dev,
        width=width, head=head, pool=pool, num_classes=classes, seed=seed,
        progress=_progress(quiet),
    )
    report.check_target(target)
    _finish(report, output, json_out, tables.print_profile)


def _quiet_profiler() -> None:
    """``-q``: silence kineto (torch.profiler's tracer), which otherwise writes its own
    ``USDT ... profiler_start/stop`` lines and, on a machine without CUDA, ``ERROR ...
    gpuGetDeviceCount failed`` to stderr.  kineto reads ``KINETO_LOG_LEVEL`` once, when the
    profiler is first used in the process (0 verbose ... 5 errors; 6: nothing); a level the
    user set is kept."""
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
