"""``lip bench layers``: every installed convolution in the comparison study's network, one
row each (logic: :mod:`lipcli.bench.layers`)."""

from __future__ import annotations

import json
from typing import Any

from lipcli.bench.options import LayersBenchOptions
from lipcli.cli.common import cli_errors, fail, stderr_console
from lipcli.cli.settings_options import with_settings
from lipcli.cli.options import DeviceOption, JsonOption, QuietOption, ThreadsOption
from lipcli._util.devices import DEFAULT_DEVICE
from lipcli.sdk.errors import LipError, LipUsageError


@with_settings(LayersBenchOptions, before="device")
@cli_errors
def layers(
    device: DeviceOption = DEFAULT_DEVICE,
    threads: ThreadsOption = None,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    **settings: Any,
) -> None:
    """Training step time, inference time (cached operators), peak training and inference memory
    and parameters of every installed convolution in one network (the comparison study of
    Prach et al., CVPR 2024)."""
    from lipcli.bench.layers import bench_layers, plot_layers
    from lipcli.cli.bench_cmd import _finish, _setup
    from lipcli.cli.bench_cmd import _options
    from lipcli.host.plugins import get_registry, split_component_choices

    o = _options(LayersBenchOptions, settings)
    conv, width, results, plot = o.conv, o.width, o.results, o.plot
    dev = _setup(device, threads)
    reg = get_registry()
    arch, head = _network(reg, o)
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
    report = bench_layers(arch=arch, head=head, convs=convs, batch_size=o.batch_size, device=dev,
                          warmup=o.warmup, steps=o.steps, seed=o.seed, registry=reg, progress=say,
                          arch_params={"width": width} if width else None)
    if plot is not None:
        plot_layers(report, plot, scores)
    _finish(report, None, json_out, print_layers)


def _network(reg: Any, o: LayersBenchOptions) -> tuple[str, str]:
    """``--arch`` and ``--head``, each defaulting to the ``--recipe``'s value (the recipe is
    resolved only where one of them is missing)."""
    if o.arch is not None and o.head is not None:
        return o.arch, o.head
    from lipcli.bench.recipes import recipe_network
    from lipcli.host.recipes import resolve_recipe

    try:
        network = recipe_network(resolve_recipe(reg, o.recipe))
    except LipError as exc:
        raise LipUsageError(f"--recipe {o.recipe}: {exc} (or give --arch and --head)") from exc
    return o.arch or network["arch"], o.head or network["head"]


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
