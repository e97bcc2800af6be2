"""The tables ``lip bench`` prints for people (``--json`` prints the report itself): one
printer per report of :mod:`lipcli.bench` (Table 1, component comparison, certification
throughput, step profile)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lipcli.cli.common import stdout_console

if TYPE_CHECKING:  # the report types (importing lipcli.bench loads torch; `lip --help` must not)
    from lipcli.bench.reports import (ComponentBenchReport, CertifyBenchReport, Environment,
                                      ProfileReport, StepMemory, Table1Row, TrainBenchReport)

#: caption suffix of the training benchmarks
SYNTHETIC = "; synthetic inputs, random init"


def env_caption(env: Environment) -> str:
    """Where the numbers were measured, in one line (the tables' caption)."""
    parts = [
        f"{env.device} ({env.device_name})",
        f"torch {env.torch}",
        f"torch threads {env.torch_threads}",
    ]
    gpu = env.gpu
    if gpu is not None and gpu.cuda:
        parts.append(
            f"CUDA {gpu.cuda}, cuDNN {gpu.cudnn} "
            f"(benchmark {'on' if gpu.cudnn_benchmark else 'off'})"
        )
    load = env.load_average_1m_5m_15m
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


def _table(title: str, report: Any = None, caption_suffix: str = "",
           columns: tuple[tuple[str, str], ...] = ()):
    """A left-justified rich table; captioned with the report's environment when ``report``
    is given; ``columns``: ``(name, justify)`` pairs."""
    from rich.table import Table

    caption = {} if report is None else {
        "caption": env_caption(report.environment) + caption_suffix, "caption_justify": "left",
    }
    table = Table(title=title, title_justify="left", **caption)
    for name, justify in columns:
        table.add_column(name, justify=justify)
    return table


def _note(console, text: str) -> None:
    console.print(text, highlight=False)


def _memory_note(console, memory: StepMemory | None) -> None:
    if memory:
        _note(console, f"peak MiB: {memory.method}; saved act.: activations saved for backward.")


def _num(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _mib(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _right(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((name, "right") for name in names)


# ---------------------------------------------------------------------------------------------
# lip bench train
# ---------------------------------------------------------------------------------------------
def print_train(report: TrainBenchReport) -> None:
    """Table 1: fast vs exact SOC per architecture, then per training step."""
    s = report.settings
    console = _console()
    table = _table(
        f"Table 1 (reproduction): time per CIFAR-10 epoch, fast vs exact SOC gradient; "
        f"batch {s.batch_size}, width {s.width}, {s.head} head, {s.pool} pool, "
        f"median of {s.steps} interleaved steps x {s.step.steps_per_epoch} steps/epoch",
        report, SYNTHETIC,
    )
    table.add_column("Architecture", no_wrap=True)
    for name in ("SOC layers", "Fast s/epoch", "Exact s/epoch", "Change", "Paired"):
        table.add_column(name, justify="right")
    table.add_column("Same init", justify="center")
    for r in report.results:
        table.add_row(
            r.arch, str(r.soc_layers or "?"),
            f"{r.fast.times.epoch_s:.2f}", f"{r.exact.times.epoch_s:.2f}",
            f"{-r.reduction_pct:+.2f}%", f"{-r.reduction_pct_paired:+.2f}%",
            "yes" if r.initial_state_identical else "NO",
        )
    console.print(table)

    steps = _table("Per training step (fast / exact)")
    steps.add_column("Architecture", no_wrap=True)
    floors = any(r.fast.kernel_floor for r in report.results)
    names = ["ms/step", "images/s", "peak MiB", "saved act. MiB"]
    if floors:
        names += ["conv kernel ms", "step/conv"]
    for name in names:
        steps.add_column(name, justify="right")
    for r in report.results:
        steps.add_row(*_step_row(r, floors))
    console.print(steps)
    models = [m for r in report.results for m in (r.fast, r.exact)]
    graphs = {str(m.cuda_graphs.captured) for m in models}
    reasons = {m.cuda_graphs.reason for m in models} - {None}
    _note(console,
          "CUDA graphs: " + ("replayed" if graphs == {"True"} else "not used" if graphs == {"False"} else "mixed")
          + (f" ({'; '.join(sorted(reasons))})" if reasons else ""))
    if floors:
        _note(console, "conv kernel ms: GPU time of the convolution kernels per step (profiled eager "
                       "steps), the floor of a step; step/conv = ms/step divided by it.")
    _memory_note(console, report.results[0].fast.memory)
    _note(console, "Change = fast/exact - 1 of the median step times (negative: fast is faster); "
                   "Paired = median of the per-round ratios - 1.")


def _pair(fast: Any, exact: Any, name: str, fmt: Any) -> str:
    """``fmt(fast.name) / fmt(exact.name)`` of two optional parts (``None`` part: ``fmt(None)``)."""
    return f"{fmt(getattr(fast, name, None))} / {fmt(getattr(exact, name, None))}"


def _step_row(r: Table1Row, floors: bool) -> list[str]:
    """One architecture's ``fast / exact`` per-step figures."""
    f, e = r.fast, r.exact
    row = [
        r.arch,
        f"{f.times.median_step_s * 1e3:.1f} / {e.times.median_step_s * 1e3:.1f}",
        f"{f.times.images_per_s:.1f} / {e.times.images_per_s:.1f}",
        _pair(f.memory, e.memory, "peak_step_mib", _mib),
        _pair(f.memory, e.memory, "saved_activations_mib", _mib),
    ]
    if floors:
        row.append(_pair(f.kernel_floor, e.kernel_floor, "conv_kernel_ms_per_step", _num))
        row.append(_pair(f.kernel_floor, e.kernel_floor, "step_over_conv_kernel",
                         lambda v: _num(v, 2)))
    return row


def print_components(report: ComponentBenchReport) -> None:
    """``lip bench train`` with component lists: one table per architecture."""
    s = report.settings
    console = _console()
    for res in report.results:
        table = _table(
            f"{res.arch}: training step per component choice; batch {s.batch_size}, "
            f"width {s.width}, median of {s.steps} interleaved steps; relative to "
            f"{res.reference}",
            report, SYNTHETIC,
        )
        table.add_column(" + ".join(res.varying) or "components", no_wrap=True)
        own = any(row.optimizer is not None for row in res.variants)
        for name in ("ms/step", "relative", "paired", "images/s", "s/epoch", "peak MiB",
                     "saved act. MiB", "parameters", *(("own optimiser ms (share)",) if own else ())):
            table.add_column(name, justify="right")
        for row in res.variants:
            mem, opt = row.memory, row.optimizer
            table.add_row(
                row.label, f"{row.times.median_step_s * 1e3:.1f}",
                f"{row.relative_to_reference:.2f}x", f"{row.relative_to_reference_paired:.2f}x",
                f"{row.times.images_per_s:.1f}", f"{row.times.epoch_s:.1f}",
                _mib(getattr(mem, "peak_step_mib", None)), _mib(getattr(mem, "saved_activations_mib", None)),
                f"{row.parameters:,}",
                *(() if not own else ("-" if opt is None else f"{opt.name.split(':')[0]} {opt.step_ms:.1f} ({opt.share:.0%})",)),
            )
        console.print(table)
    _memory_note(console, report.results[0].variants[0].memory if report.results else None)
    if any(row.optimizer is not None for res in report.results for row in res.variants):
        _note(console, "own optimiser: the recipe's optimiser step on the step's gradients (SGD's: "
                       "sgd_step_ms in --json); share = its part of a step using it.")
    _note(console, "relative = median step time / the first row's; paired = median of the per-round "
                   "ratios. Weights differ between rows when the layers differ (same seed).")


# ---------------------------------------------------------------------------------------------
# lip bench certify
# ---------------------------------------------------------------------------------------------
def print_certify(report: CertifyBenchReport) -> None:
    """Seconds and inputs/s per stage of certification."""
    s = report.settings
    console = _console()
    columns = (("stage", "left"), *_right("seconds", "inputs/s"), ("notes", "left"))
    table = _table(
        f"Certification throughput — {s.arch} ({s.conv}, {s.pool} pool, "
        f"{s.head} head, {s.num_classes} classes), {s.n} synthetic inputs, "
        f"batch {s.batch_size}, {s.weights}",
        report, columns=columns,
    )
    f = report.features
    table.add_row(f"power-iteration refresh ({report.power_refresh_steps} steps)",
                  f"{report.power_refresh_s:.3f}", "", "once per loaded model")
    table.add_row("feature extraction", f"{f.seconds:.3f}", f"{f.inputs_per_s:.1f}",
                  f"D = {f.feature_dim}, {f.mode}")
    lip = report.lipschitz
    table.add_row("Lipschitz GUARANTEED bound", f"{lip.upper_bound_s:.3f}", "",
                  f"{lip.upper_bound:.6g}")
    table.add_row(f"Lipschitz power estimate ({lip.estimate_iters} it.)",
                  f"{lip.estimate_s:.3f}", "", f"{lip.estimate:.6g} (not guaranteed)")
    for c in report.certificates:
        label = c.method + ("" if c.top_k is None else f" top-{c.top_k} (HEURISTIC)")
        table.add_row(f"certificate {label}: prepare", f"{c.prepare_s:.3f}", "", "once per model")
        table.add_row(
            f"certificate {label}: certify", f"{c.certify_s:.3f}",
            f"{c.inputs_per_s:.1f}" if c.inputs_per_s else "n/a",
            f"input radius median {c.input_radius.median:.4g}, nonzero {100 * c.nonzero_fraction:.0f}%",
        )
    for fp in report.feature_paths:
        secs = sorted(fp.seconds)[len(fp.seconds) // 2] if fp.seconds else float("nan")
        dense = f", {len(fp.dense_layers)} dense layers (built in {fp.build_s:.2f} s)" if fp.dense_layers else ""
        table.add_row(f"feature pass, {fp.path} (interleaved, median of {len(fp.seconds)})",
                      f"{secs:.3f}", f"{fp.inputs_per_s:.1f}",
                      f"{fp.flop_per_input / 1e9:.3g} GFLOP/input, Lip bound {fp.lipschitz_upper_bound:.9g}{dense}")
    console.print(table)
    for note in report.notes:
        _note(console, f"note: {note}")


# ---------------------------------------------------------------------------------------------
# lip bench profile
# ---------------------------------------------------------------------------------------------
def print_profile(report: ProfileReport) -> None:
    """Time per category, top operators, backward by autograd node, and the verdict
    (after :meth:`~lipcli.bench.reports.ProfileReport.check_target`)."""
    s = report.settings
    console = _console()
    share = _right("ms/step", "share")
    table = _table(
        f"Profile of a training step — {s.arch} ({s.conv}), batch {s.batch_size}, "
        f"width {s.width}, {s.steps} profiled steps ({s.time_basis})",
        report, columns=(("category", "left"), *share),
    )
    for row in report.categories:
        table.add_row(row.label, f"{row.ms_per_step:.1f}", f"{row.share_pct:.1f}%")
    console.print(table)
    ops = _table("Top operators by self time",
                 columns=(("operator", "left"), ("category", "left"), *share))
    for op in report.top_operators:
        ops.add_row(op.op, op.category, f"{op.ms_per_step:.1f}", f"{op.share_pct:.1f}%")
    console.print(ops)
    if report.backward_non_convolution_by_node:
        nodes = _table("Backward, non-convolution, by autograd node",
                       columns=(("node", "left"), *share))
        for node in report.backward_non_convolution_by_node[:10]:
            nodes.add_row(node.node, f"{node.ms_per_step:.1f}", f"{node.share_pct:.1f}%")
        console.print(nodes)
    verdict = "met" if report.target_met else "NOT met"
    _note(console,
          f"Convolution share {report.convolution_share_pct:.1f}% "
          f"(of operators only: {report.convolution_share_of_operators_pct:.1f}%); "
          f"target >= {report.target_pct:.0f}%: {verdict}. Step "
          f"{report.step_ms_unprofiled_median:.0f} ms unprofiled, "
          f"{report.step_ms_profiled:.0f} ms under the profiler.")
