"""``lip bench train`` with component lists (``--conv a,b``, ``--activation``, several
``--pool``/``--head``): parsing the lists and printing the comparison table (the measurement
is :mod:`lipcli.bench.compare`)."""

from __future__ import annotations

from typing import Any, Optional


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


def print_components(report: dict[str, Any]) -> None:
    from rich.table import Table

    from lipcli.cli.bench_cmd import _console, _env_caption, _mib

    s = report["settings"]
    console = _console()
    for res in report["results"]:
        table = Table(
            title=(
                f"{res['arch']}: training step per component choice; batch {s['batch_size']}, "
                f"width {s['width']}, median of {s['steps']} interleaved steps; relative to "
                f"{res['reference']}"
            ),
            title_justify="left",
            caption=_env_caption(report["environment"]) + "; synthetic inputs, random init",
            caption_justify="left",
        )
        table.add_column(" + ".join(res["varying"]) or "components", no_wrap=True)
        for name in ("ms/step", "relative", "paired", "images/s", "s/epoch", "peak MiB",
                     "saved act. MiB", "parameters"):
            table.add_column(name, justify="right")
        for row in res["variants"]:
            mem = row.get("memory") or {}
            table.add_row(
                row["label"], f"{row['median_step_s'] * 1e3:.1f}",
                f"{row['relative_to_reference']:.2f}x", f"{row['relative_to_reference_paired']:.2f}x",
                f"{row['images_per_s']:.1f}", f"{row['epoch_s']:.1f}",
                _mib(mem.get("peak_step_mib")), _mib(mem.get("saved_activations_mib")),
                f"{row['parameters']:,}",
            )
        console.print(table)
    first = report["results"][0]["variants"][0].get("memory") if report["results"] else None
    if first:
        console.print(f"peak MiB: {first['method']}; saved act.: activations saved for backward.",
                      highlight=False)
    console.print(
        "relative = median step time / the first row's; paired = median of the per-round "
        "ratios. Weights differ between rows when the layers differ (same seed).",
        highlight=False,
    )
