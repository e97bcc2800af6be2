"""``lip bench layers``: every installed convolution in the comparison study's network, one
row each (logic: :mod:`lipcli.bench.layers`)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from lipcli.cli.common import cli_errors, fail, stderr_console
from lipcli.cli.options import DeviceOption, JsonOption, QuietOption, ThreadsOption
from lipcli._util.devices import DEFAULT_DEVICE


@cli_errors
def layers(
    arch: Annotated[str, typer.Option("--arch", help="Architecture: the study's network at a size "
        "(convnet-xs, convnet-s, convnet-m, convnet-l; lipcli-compared) or any other.")] = "convnet-xs",
    conv: Annotated[Optional[str], typer.Option("--conv", help="Comma-separated convolutions "
        "(default: every installed one).")] = None,
    head: Annotated[str, typer.Option("--head", help="Head component.")] = "first-channels",
    width: Annotated[Optional[int], typer.Option("--width", help="Architecture width (default: the "
        "architecture's).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, max=65536, help="Images per step.")] = 64,
    steps: Annotated[int, typer.Option("--steps", min=1, max=10000, help="Timed rounds.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=1000, help="Untimed rounds.")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and inputs.")] = 0,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a plot: training step time vs "
        "certified accuracy (with --results) or vs inference time.")] = None,
    results: Annotated[Optional[str], typer.Option("--results", help="JSON object conv -> certified "
        "accuracy for the plot (e.g. from docs/results.md's raw report).")] = None,
    device: DeviceOption = DEFAULT_DEVICE,
    threads: ThreadsOption = None,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Training step time, inference time (cached operators), peak training and inference memory
    and parameters of every installed convolution in one network (the comparison study of
    Prach et al., CVPR 2024)."""
    from lipcli.bench.layers import bench_layers, plot_layers
    from lipcli.cli.bench_cmd import _finish, _setup
    from lipcli.host.plugins import get_registry, split_component_choices

    dev = _setup(device, threads)
    reg = get_registry()
    convs = split_component_choices(conv) if conv else reg.names("conv")
    for c in convs:
        reg.component("conv", c)
    reg.component("arch", arch)
    reg.component("head", head)
    scores = None
    if results is not None:
        try:
            scores = {str(k): float(v) for k, v in json.loads(open(results, encoding="utf-8").read()).items()}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            fail(f"--results {results}: not a JSON object of conv -> accuracy ({exc})", 2)
    say = None if quiet else (lambda text: stderr_console().print(text))
    report = bench_layers(arch=arch, head=head, convs=convs, batch_size=batch_size, device=dev,
                          warmup=warmup, steps=steps, seed=seed, registry=reg, progress=say,
                          arch_params={"width": width} if width else None)
    if plot is not None:
        plot_layers(report, plot, scores)
    _finish(report, None, json_out, print_layers)


def print_layers(report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.arch}, batch {report.batch_size}, {report.environment.device_name}")
    for col in ("conv", "params", "train step ms", "inference ms", "train peak MiB", "infer peak MiB", "bound"):
        table.add_column(col, justify="left" if col == "conv" else "right")
    ranked = sorted(report.rows, key=lambda r: (r.train_step_ms is None, r.train_step_ms or 0.0))
    for r in ranked:
        if r.error:
            table.add_row(r.conv, "-", f"error: {r.error}", "", "", "", "")
            continue
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        table.add_row(r.conv, f"{r.parameters:,}", f(r.train_step_ms), f(r.inference_ms),
                      f(r.train_peak_mib), f(r.inference_peak_mib), f(r.lipschitz_bound, 6))
    Console().print(table)
