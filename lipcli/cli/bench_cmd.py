"""``lip bench``: measure training speed (paper Table 1), certification throughput and where
the time of a training step goes.  Synthetic inputs; every number is measured in the run
that prints it (logic in :mod:`lipcli.bench`)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from lipcli.cli.common import cli_errors, dumps_json, fail, print_json, stderr_console, stdout_console

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


def _setup(device: str, threads: Optional[int], cudnn_benchmark: bool = False):
    """Apply ``--threads`` / ``--cudnn-benchmark`` and resolve ``--device`` (lazy torch)."""
    import torch

    from lipcli.bench import resolve_device
    from lipcli.sdk.errors import LipUsageError

    if threads is not None:
        if threads < 1:
            raise LipUsageError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
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
        from lipcli.host.outputs import check_output_file

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


def _finish(report: dict[str, Any], output: Optional[str], json_out: bool, printer) -> None:
    """Save ``--output``, print the report (JSON or table), then report a failed save."""
    error = _save(report, output)
    if json_out:
        print_json(report)
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


def _env_caption(env: dict[str, Any]) -> str:
    parts = [
        f"{env['device']} ({env['device_name']})",
        f"torch {env['torch']}",
        f"torch threads {env['torch_threads']}",
    ]
    if env.get("cuda"):
        parts.append(
            f"CUDA {env['cuda']}, cuDNN {env.get('cudnn')} "
            f"(benchmark {'on' if env.get('cudnn_benchmark') else 'off'})"
        )
    load = env.get("load_average_1m_5m_15m")
    if load:
        parts.append(f"load avg {load[0]:.2f} at start")
    return "; ".join(parts)


def _console():
    """stdout console; at least 120 columns when not a terminal (files, pipes), so that
    numbers are never cut."""
    console = stdout_console()
    if not console.is_terminal and console.width < 120:
        console.width = 120
    return console


def _num(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _mib(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


@bench_app.command("train", short_help="Step time of soc-fast vs soc (the paper's Table 1).")
@cli_errors
def train(
    archs: str = typer.Option(
        _DEFAULT_ARCHS, "--archs",
        help="Comma-separated LipConvnet depths or names (5,10 or lipconvnet-5,...).",
    ),
    batch_size: int = typer.Option(128, "--batch-size", help="Images per training step."),
    steps: int = typer.Option(10, "--steps", help="Timed steps per model."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed warm-up steps per model."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    width: int = typer.Option(32, "--width", help="LipConvnet width (channels after the stem)."),
    conv: Optional[str] = typer.Option(
        None, "--conv",
        help="Compare these convolutions instead of Table 1, e.g. soc-fast,soc,cayley "
        "(any installed plugin's; inline parameters as name:key=value).",
    ),
    activation: Optional[str] = typer.Option(
        None, "--activation",
        help="Compare these activations, e.g. maxmin,householder (default: maxmin).",
    ),
    head: str = typer.Option(
        "lln", "--head", help="Head component(s) (Table 1: lln); several compare them."
    ),
    pool: str = typer.Option(
        "max", "--pool", help="Pool component(s) (Table 1: max); several compare them."
    ),
    classes: int = typer.Option(10, "--classes", help="Number of classes."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights and synthetic batches."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads."),
    cudnn_benchmark: bool = typer.Option(
        False, "--cudnn-benchmark/--no-cudnn-benchmark",
        help="CUDA: let cuDNN autotune convolution algorithms (warm-up steps absorb the tuning).",
    ),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory."),
    cuda_graphs: str = typer.Option(
        "auto", "--cuda-graphs",
        help="auto (on for CUDA), on or off: replay both models' steps from CUDA graphs.",
    ),
    floor: bool = typer.Option(
        True, "--floor/--no-floor",
        help="CUDA: profile the convolution kernel time per step (the floor of a step).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", help="Also write the JSON report to this file."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Time per training step and per CIFAR-10 epoch, fast (soc-fast) vs exact (soc)
    gradient, interleaved from identical weights (paper Table 1); on CUDA also the
    convolution kernel time per step beside the step time.

    With --conv or --activation (or several --pool/--head): compare those
    components instead, every combination on the same architecture and batch,
    interleaved in one run (step time, images/s, peak memory, relative to the
    first; eager steps: --cuda-graphs and --floor apply to Table 1 only)."""
    from lipcli.bench import EXACT_CONV, FAST_CONV, bench_train, parse_archs
    from lipcli.host.cuda_graphs import check_graph_mode
    from lipcli.sdk.errors import LipUsageError
    from lipcli.host.plugins import get_registry

    try:
        graphs = check_graph_mode(cuda_graphs)
    except ValueError as exc:
        raise LipUsageError(f"--{exc}") from None
    dev = _setup(device, threads, cudnn_benchmark)
    names = parse_archs(archs, get_registry().names("arch"))
    from lipcli.cli.bench_components import component_lists, print_components

    choices = component_lists(conv=conv, activation=activation, pool=pool, head=head)
    if choices is not None:
        from lipcli.bench.compare import bench_components

        _check_output(output)
        report = bench_components(
            names, choices, batch_size=batch_size, steps=steps, warmup=warmup, device=dev,
            width=width, num_classes=classes, seed=seed, measure_memory=memory,
            progress=_progress(quiet),
        )
        _finish(report, output, json_out, print_components)
        return
    _check_components(head=head, pool=pool, conv=FAST_CONV)
    _check_components(conv=EXACT_CONV)
    _check_output(output)
    report = bench_train(
        names, batch_size=batch_size, steps=steps, warmup=warmup, device=dev, width=width,
        head=head, pool=pool, num_classes=classes, seed=seed, measure_memory=memory,
        cuda_graphs=graphs == "on" or (graphs == "auto" and dev.type == "cuda"), floor=floor,
        progress=_progress(quiet),
    )
    _finish(report, output, json_out, _print_train)


def _print_train(report: dict[str, Any]) -> None:
    from rich.table import Table

    s = report["settings"]
    console = _console()
    table = Table(
        title=(
            f"Table 1 (reproduction): time per CIFAR-10 epoch, fast vs exact SOC gradient; "
            f"batch {s['batch_size']}, width {s['width']}, {s['head']} head, {s['pool']} pool, "
            f"median of {s['steps']} interleaved steps x {s['steps_per_epoch']} steps/epoch"
        ),
        title_justify="left",
        caption=_env_caption(report["environment"]) + "; synthetic inputs, random init",
        caption_justify="left",
    )
    table.add_column("Architecture", no_wrap=True)
    for name in ("SOC layers", "Fast s/epoch", "Exact s/epoch", "Change", "Paired"):
        table.add_column(name, justify="right")
    table.add_column("Same init", justify="center")
    for r in report["results"]:
        table.add_row(
            r["arch"], str(r["soc_layers"] or "?"),
            f"{r['fast']['epoch_s']:.2f}", f"{r['exact']['epoch_s']:.2f}",
            f"{-r['reduction_pct']:+.2f}%", f"{-r['reduction_pct_paired']:+.2f}%",
            "yes" if r["initial_state_identical"] else "NO",
        )
    console.print(table)

    steps = Table(title="Per training step (fast / exact)", title_justify="left")
    steps.add_column("Architecture", no_wrap=True)
    floors = any(r["fast"].get("kernel_floor") for r in report["results"])
    names = ["ms/step", "images/s", "peak MiB", "saved act. MiB"]
    if floors:
        names += ["conv kernel ms", "step/conv"]
    for name in names:
        steps.add_column(name, justify="right")
    for r in report["results"]:
        f, e = r["fast"], r["exact"]
        fm, em = f.get("memory") or {}, e.get("memory") or {}
        row = [
            r["arch"],
            f"{f['median_step_s'] * 1e3:.1f} / {e['median_step_s'] * 1e3:.1f}",
            f"{f['images_per_s']:.1f} / {e['images_per_s']:.1f}",
            f"{_mib(fm.get('peak_step_mib'))} / {_mib(em.get('peak_step_mib'))}",
            f"{_mib(fm.get('saved_activations_mib'))} / {_mib(em.get('saved_activations_mib'))}",
        ]
        if floors:
            ff, ef = f.get("kernel_floor") or {}, e.get("kernel_floor") or {}
            row.append(f"{_num(ff.get('conv_kernel_ms_per_step'))} / {_num(ef.get('conv_kernel_ms_per_step'))}")
            row.append(f"{_num(ff.get('step_over_conv_kernel'), 2)} / {_num(ef.get('step_over_conv_kernel'), 2)}")
        steps.add_row(*row)
    console.print(steps)
    graphs = {str(r[k]["cuda_graphs"].get("captured")) for r in report["results"] for k in ("fast", "exact")}
    reasons = {r[k]["cuda_graphs"].get("reason") for r in report["results"] for k in ("fast", "exact")} - {None}
    console.print(
        "CUDA graphs: " + ("replayed" if graphs == {"True"} else "not used" if graphs == {"False"} else "mixed")
        + (f" ({'; '.join(sorted(reasons))})" if reasons else ""),
        highlight=False,
    )
    if floors:
        console.print(
            "conv kernel ms: GPU time of the convolution kernels per step (profiled eager "
            "steps), the floor of a step; step/conv = ms/step divided by it.",
            highlight=False,
        )
    mem = report["results"][0]["fast"].get("memory")
    if mem:
        console.print(
            f"peak MiB: {mem['method']}; saved act.: activations saved for backward.",
            highlight=False,
        )
    console.print(
        "Change = fast/exact - 1 of the median step times (negative: fast is faster); "
        "Paired = median of the per-round ratios - 1.",
        highlight=False,
    )


#: ``lip bench certify`` options that describe the random model to build (not a model file)
_MODEL_OPTIONS = ("arch", "head", "conv", "pool", "width", "classes")


@bench_app.command("certify", short_help="Inputs/s of feature extraction and certificates.")
@cli_errors
def certify(
    ctx: typer.Context,
    model_path: Optional[str] = typer.Argument(
        None, metavar="[MODEL]", help="A lipcli model file (default: a random model)."
    ),
    arch: str = typer.Option("lipconvnet-5", "--arch", help="Architecture (e.g. 5 or lipconvnet-10)."),
    head: str = typer.Option("lln", "--head", help="Head: lln (linear) or mlp (CRC-Lip)."),
    conv: str = typer.Option("soc-fast", "--conv", help="Convolution component."),
    pool: str = typer.Option("max", "--pool", help="Pool component."),
    width: int = typer.Option(32, "--width", help="LipConvnet width."),
    classes: int = typer.Option(10, "--classes", help="Number of classes (10 or 100 for CIFAR)."),
    batch_size: int = typer.Option(256, "--batch-size", help="Inputs per batch."),
    n: int = typer.Option(1024, "--n", help="Number of synthetic inputs."),
    top_k: Optional[int] = typer.Option(
        None, "--top-k", help="Also time the certificate restricted to the top-k classes (heuristic)."
    ),
    fit_head: int = typer.Option(
        0, "--fit-head",
        help="At most this many Adam steps fitting the head to a random teacher "
        "(trained-like margins); 0 = random head.",
    ),
    fit_loss: float = typer.Option(
        0.7, "--fit-loss", help="With --fit-head: stop once the head's cross-entropy is this low."
    ),
    lipschitz_iters: int = typer.Option(50, "--lipschitz-iters", help="Power-method iterations."),
    refresh_steps: int = typer.Option(
        50, "--refresh-steps", help="Power-iteration steps refreshing σ before evaluation."
    ),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights and inputs."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads."),
    cudnn_benchmark: bool = typer.Option(
        False, "--cudnn-benchmark/--no-cudnn-benchmark",
        help="CUDA: let cuDNN autotune convolution algorithms (lip certify does not).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", help="Also write the JSON report to this file."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
) -> None:
    """Inputs/s of feature extraction and of the head's certificate(s), and the time of the
    guaranteed Lipschitz bound and of the power estimate."""
    from lipcli.bench import bench_certify, build_model
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
        source=source, seed=seed, progress=_progress(quiet),
    )
    _finish(report, output, json_out, _print_certify)


def _print_certify(report: dict[str, Any]) -> None:
    from rich.table import Table

    s = report["settings"]
    console = _console()
    table = Table(
        title=(
            f"Certification throughput — {s['arch']} ({s['conv']}, {s['pool']} pool, "
            f"{s['head']} head, {s['num_classes']} classes), {s['n']} synthetic inputs, "
            f"batch {s['batch_size']}, {s['weights']}"
        ),
        title_justify="left",
        caption=_env_caption(report["environment"]),
        caption_justify="left",
    )
    for col, justify in (("stage", "left"), ("seconds", "right"), ("inputs/s", "right"),
                         ("notes", "left")):
        table.add_column(col, justify=justify)
    f = report["features"]
    table.add_row(f"power-iteration refresh ({report['power_refresh_steps']} steps)",
                  f"{report['power_refresh_s']:.3f}", "", "once per loaded model")
    table.add_row("feature extraction", f"{f['seconds']:.3f}", f"{f['inputs_per_s']:.1f}",
                  f"D = {f['feature_dim']}, {f['mode']}")
    lip = report["lipschitz"]
    table.add_row("Lipschitz GUARANTEED bound", f"{lip['upper_bound_s']:.3f}", "",
                  f"{lip['upper_bound']:.6g}")
    table.add_row(f"Lipschitz power estimate ({lip['estimate_iters']} it.)",
                  f"{lip['estimate_s']:.3f}", "", f"{lip['estimate']:.6g} (not guaranteed)")
    for c in report["certificates"]:
        label = c["method"] + ("" if c["top_k"] is None else f" top-{c['top_k']} (HEURISTIC)")
        table.add_row(f"certificate {label}: prepare", f"{c['prepare_s']:.3f}", "", "once per model")
        rad = c["input_radius"]
        table.add_row(
            f"certificate {label}: certify", f"{c['certify_s']:.3f}",
            f"{c['inputs_per_s']:.1f}" if c["inputs_per_s"] else "n/a",
            f"input radius median {rad['median']:.4g}, nonzero {100 * c['nonzero_fraction']:.0f}%",
        )
    console.print(table)
    for note in report["notes"]:
        console.print(f"note: {note}", highlight=False)


@bench_app.command("profile", short_help="Share of a training step spent in convolutions.")
@cli_errors
def profile(
    arch: str = typer.Option("lipconvnet-20", "--arch", help="Architecture (e.g. 20 or lipconvnet-20)."),
    conv: str = typer.Option("soc-fast", "--conv", help="Convolution component."),
    batch_size: int = typer.Option(128, "--batch-size", help="Images per training step."),
    steps: int = typer.Option(3, "--steps", help="Profiled steps."),
    warmup: int = typer.Option(1, "--warmup", help="Unprofiled warm-up steps."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    width: int = typer.Option(32, "--width", help="LipConvnet width."),
    head: str = typer.Option("lln", "--head", help="Head component."),
    pool: str = typer.Option("max", "--pool", help="Pool component."),
    classes: int = typer.Option(10, "--classes", help="Number of classes."),
    target: float = typer.Option(90.0, "--target", help="Convolution share to check against (%)."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights and inputs."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch.set_num_threads."),
    cudnn_benchmark: bool = typer.Option(
        False, "--cudnn-benchmark/--no-cudnn-benchmark",
        help="CUDA: let cuDNN autotune convolution algorithms (warm-up steps absorb the tuning).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout."),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", help="Also write the JSON report to this file."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress on stderr."),
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
    report["target_pct"] = target
    report["target_met"] = report["convolution_share_pct"] >= target
    _finish(report, output, json_out, _print_profile)


def _quiet_profiler() -> None:
    """``-q``: silence kineto (torch.profiler's tracer), which otherwise writes its own
    ``USDT ... profiler_start/stop`` lines and, on a machine without CUDA, ``ERROR ...
    gpuGetDeviceCount failed`` to stderr.  kineto reads ``KINETO_LOG_LEVEL`` once, when the
    profiler is first used in the process (0 verbose ... 5 errors; 6: nothing); a level the
    user set is kept."""
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def _print_profile(report: dict[str, Any]) -> None:
    from rich.table import Table

    s = report["settings"]
    console = _console()
    table = Table(
        title=(
            f"Profile of a training step — {s['arch']} ({s['conv']}), batch {s['batch_size']}, "
            f"width {s['width']}, {s['steps']} profiled steps ({s['time_basis']})"
        ),
        title_justify="left",
        caption=_env_caption(report["environment"]),
        caption_justify="left",
    )
    for col, justify in (("category", "left"), ("ms/step", "right"), ("share", "right")):
        table.add_column(col, justify=justify)
    for row in report["categories"]:
        table.add_row(row["label"], f"{row['ms_per_step']:.1f}", f"{row['share_pct']:.1f}%")
    console.print(table)
    ops = Table(title="Top operators by self time", title_justify="left")
    for col, justify in (("operator", "left"), ("category", "left"), ("ms/step", "right"),
                         ("share", "right")):
        ops.add_column(col, justify=justify)
    for row in report["top_operators"]:
        ops.add_row(row["op"], row["category"], f"{row['ms_per_step']:.1f}",
                    f"{row['share_pct']:.1f}%")
    console.print(ops)
    if report.get("backward_non_convolution_by_node"):
        nodes = Table(title="Backward, non-convolution, by autograd node", title_justify="left")
        for col, justify in (("node", "left"), ("ms/step", "right"), ("share", "right")):
            nodes.add_column(col, justify=justify)
        for row in report["backward_non_convolution_by_node"][:10]:
            nodes.add_row(row["node"], f"{row['ms_per_step']:.1f}", f"{row['share_pct']:.1f}%")
        console.print(nodes)
    verdict = "met" if report["target_met"] else "NOT met"
    console.print(
        f"Convolution share {report['convolution_share_pct']:.1f}% "
        f"(of operators only: {report['convolution_share_of_operators_pct']:.1f}%); "
        f"target >= {report['target_pct']:.0f}%: {verdict}. Step "
        f"{report['step_ms_unprofiled_median']:.0f} ms unprofiled, "
        f"{report['step_ms_profiled']:.0f} ms under the profiler.",
        highlight=False,
    )
