"""``lip bench train --conv a,b,c`` (and ``--activation``, ``--pool``, ``--head`` lists): training
steps of several component choices on the same architecture, interleaved in one run.

Generic over components: the driver never names one.  It receives, per component kind
(``conv``, ``activation``, ``pool``, ``head``; the keys of :data:`lipcli.host.models.DEFAULTS`), a
list of choices as the registry understands them (``"name"`` or ``"name:key=value,..."``,
resolved through the plugin registry, so a plugin's component is benched like a built-in),
and measures every combination (their Cartesian product, in the order given; the first
combination is the reference).

Per architecture, every variant is built from the same seed (the weights differ when the
components differ: they are different layers) and runs the recipe training step of
:class:`lipcli.bench.step.RecipeStep` on the same synthetic batch in every round; the order
rotates between rounds (round ``r`` starts with variant ``r mod k``), so machine noise hits
all variants alike.  Reported per variant: median step time, images/s, the implied seconds
per CIFAR-10 epoch, the ratio to the reference (ratio of medians, and the median of the
per-round ratios, "paired"), parameters, and the peak memory of one step measured outside
the timed rounds (:func:`lipcli.bench.memory.measure_step_memory`).
"""

from __future__ import annotations

import gc
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.bench.inputs import (
    Progress,
    _check_step_settings,
    _no_progress,
    arch_settings,
    environment,
    record_load_after,
)
from lipcli.bench.models import count_parameters
from lipcli.bench.step import RecipeStep, _clip_for, _timed, step_settings, synthetic_batch
from lipcli.bench.memory import measure_step_memory
from lipcli.bench.reports import ComponentBenchReport, ComponentBenchSettings, VariantRow, VariantsResult
from lipcli.bench.table1 import _summary
from lipcli.host.models import create_model


def component_variants(choices: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """Every combination of the per-kind choice lists, in order (the first kind varies
    slowest); duplicates within a list are dropped."""
    kinds = list(choices)
    lists = []
    for kind in kinds:
        unique = list(dict.fromkeys(choices[kind]))
        if not unique:
            raise LipUsageError(f"no {kind} given")
        lists.append(unique)
    return [dict(zip(kinds, combo)) for combo in itertools.product(*lists)]


def variant_label(variant: Mapping[str, str], varying: Sequence[str]) -> str:
    """Short row label: the choices of the kinds that differ between variants."""
    parts = [variant[k] for k in varying] or [variant[k] for k in variant]
    return " + ".join(parts)


def _build(arch: str, variant: Mapping[str, str], width: int, num_classes: int, seed: int,
           device: torch.device) -> torch.nn.Module:
    """The variant's model: on ``arch``, or on the variant's own ``"arch"`` where it names one."""
    torch.manual_seed(seed)
    choices = dict(variant)
    arch = choices.pop("arch", arch)
    width = int(choices.pop("width", width))  # a row's own width (lip bench train --recipe-widths)
    return create_model(arch, num_classes=num_classes, width=width, **choices).to(device)


def bench_components_arch(
    arch: str,
    variants: Sequence[Mapping[str, str]],
    *,
    batch_size: int = 128,
    steps: int = 10,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    width: int = 32,
    num_classes: int = 10,
    seed: int = 0,
    measure_memory: bool = True,
    progress: Progress = _no_progress,
    labels: Sequence[str] | None = None,
) -> VariantsResult:
    """All ``variants`` on one architecture, interleaved (module docstring).  A variant may
    name its own ``"arch"`` (``lip bench train --recipe``); ``labels`` name the rows (default:
    the choices that differ between variants)."""
    _check_step_settings(batch_size=batch_size, steps=steps, warmup=warmup, width=width,
                         num_classes=num_classes)
    if not variants:
        raise LipUsageError("nothing to compare")
    device = torch.device(device)
    varying = [k for k in variants[0] if len({v[k] for v in variants}) > 1]
    if labels is None:
        labels = [variant_label(v, varying) for v in variants]
    elif len(labels) != len(variants):
        raise ValueError(f"{len(labels)} labels for {len(variants)} variants")
    runners = []
    for label, variant in zip(labels, variants):
        progress(f"{arch}: building {label}")
        model = _build(arch, variant, width, num_classes, seed, device)
        runners.append(RecipeStep(model, _clip_for(variant.get("head", ""))))
    k = len(runners)
    times: list[list[float]] = [[] for _ in range(k)]
    losses: list[list[float]] = [[] for _ in range(k)]
    gen = torch.Generator().manual_seed(seed)
    rounds = warmup + steps
    gc.collect()
    for r in range(rounds):
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        for i in [(r + j) % k for j in range(k)]:
            dt, loss = _timed(lambda: runners[i](x, y), device)
            losses[i].append(float(loss))
            if r >= warmup:
                times[i].append(dt)
        phase = "warm-up" if r < warmup else "timed"
        last = ", ".join(
            f"{lab} {times[i][-1] * 1e3:.0f} ms" for i, lab in enumerate(labels) if r >= warmup
        )
        progress(f"{arch}: round {r + 1}/{rounds} ({phase}){': ' + last if last else ''}")
    rows = []
    ref = statistics.median(times[0])
    for i, (label, variant) in enumerate(zip(labels, variants)):
        summary = _summary(times[i], batch_size)
        ratios = [t / t0 for t, t0 in zip(times[i], times[0])]
        rows.append(VariantRow(
            label=label,
            components=dict(variant),
            parameters=count_parameters(runners[i].model),
            times=summary,
            relative_to_reference=summary.median_step_s / ref,
            relative_to_reference_paired=statistics.median(ratios),
            first_step_loss=losses[i][0],
            final_loss=losses[i][-1],
        ))
    if measure_memory:
        progress(f"{arch}: measuring peak memory of one step per variant")
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        for row, runner in zip(rows, runners):
            row.memory = measure_step_memory(runner, x, y, device)
    del runners
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return VariantsResult(arch=arch, reference=labels[0], varying=varying, variants=rows)


def bench_components(
    archs: Sequence[str],
    choices: Mapping[str, Sequence[str]],
    *,
    device: torch.device | str = "cpu",
    progress: Progress = _no_progress,
    **options: Any,
) -> ComponentBenchReport:
    """:func:`bench_components_arch` for every architecture, with environment and settings.

    ``choices``: per component kind, the choices to combine (see the module docstring);
    ``options``: the other keyword arguments of :func:`bench_components_arch` (``batch_size``,
    ``steps``, ``warmup``, ``width``, ``num_classes``, ``seed``, ``measure_memory``), with its
    defaults (written there once) where not given.
    """
    s = arch_settings(bench_components_arch, options)
    device = torch.device(device)
    variants = component_variants(choices)
    env = environment(device)
    results = [
        bench_components_arch(arch, variants, device=device, progress=progress, **options)
        for arch in archs
    ]
    record_load_after(env)
    settings = ComponentBenchSettings(
        batch_size=s["batch_size"], steps=s["steps"], warmup=s["warmup"], width=s["width"],
        num_classes=s["num_classes"], seed=s["seed"],
        choices={kind: list(dict.fromkeys(c)) for kind, c in choices.items()},
        schedule=(
            "interleaved: each round every variant takes one step on the same synthetic "
            "batch, the starting variant rotating between rounds; warm-up rounds not timed"
        ),
        step=step_settings(s["batch_size"]),
    )
    return ComponentBenchReport(environment=env, settings=settings, results=results)
