"""``lip bench train --recipe NAME``: the training step of each recipe's network beside
LipConvnet-5 with lipcli's default components, interleaved in one run.

A recipe's network is its ``arch``, ``conv``, ``activation``, ``pool`` and ``head`` values
(lipcli's defaults, :data:`lipcli.host.models.DEFAULTS`, for those it does not set); the
benchmark's ``width`` replaces the recipe's own (its other architecture parameters stay).  Every
row runs the same step, :class:`lipcli.bench.step.RecipeStep` (SGD, cross-entropy) on the same
CIFAR-shaped synthetic batches, so the rows compare the networks; each recipe's own optimiser is
then timed apart, against that SGD on the same gradients, with its share of a step
(:mod:`lipcli.bench.optimizer_share`); the losses and ε schedules are not timed.
The rows and the report are those of :func:`lipcli.bench.compare.bench_components_arch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lipcli.bench.compare import bench_components_arch
from lipcli.bench.inputs import Progress, _no_progress, arch_settings, environment, record_load_after
from lipcli.bench.optimizer_share import time_recipe_optimizers
from lipcli.bench.reports import ComponentBenchReport, ComponentBenchSettings
from lipcli.bench.step import step_settings
from lipcli.host.models import DEFAULTS
from lipcli.host.plugins import get_registry
from lipcli.host.recipes import resolve_recipe
from lipcli.host.registry import Registry
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.specs import RecipeSpec

__all__ = ["REFERENCE_ARCH", "bench_recipes", "parse_recipe_widths", "recipe_network", "split_recipe_names"]

#: the row every recipe is timed beside (with lipcli's default components)
REFERENCE_ARCH = "lipconvnet-5"


def split_recipe_names(texts: Sequence[str]) -> list[str]:
    """``--recipe`` values (each ``NAME`` or ``NAME,NAME,...``) as one list of names."""
    names = [name.strip() for text in texts for name in text.split(",")]
    if not names or not all(names):
        raise LipUsageError(f"bad --recipe {','.join(texts)!r}; use NAME[,NAME...]")
    return names


def parse_recipe_widths(text: str | None, names: Sequence[str]) -> dict[str, int]:
    """``NAME=WIDTH[,NAME=WIDTH]`` (``--recipe-widths``) for recipes among ``names``."""
    if text is None:
        return {}
    widths: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in names or not value.strip().isdigit() or int(value) < 1:
            raise LipUsageError(f"bad --recipe-widths {text!r}; use NAME=WIDTH[,NAME=WIDTH] with NAME one of "
                                f"--recipe ({', '.join(names)}) and WIDTH a positive integer (the "
                                "architecture's own range applies)")
        widths[name] = int(value)
    return widths


def recipe_network(spec: RecipeSpec) -> dict[str, str]:
    """The recipe's network: ``arch`` and the layer components, lipcli's defaults where the
    recipe sets none."""
    if not isinstance(spec.values.get("arch"), str):
        raise LipUsageError(f"recipe {spec.label} names no architecture; nothing to time")
    return {"arch": spec.values["arch"],
            **{kind: str(spec.values.get(kind, default)) for kind, default in DEFAULTS.items()}}


def bench_recipes(
    names: Sequence[str],
    *,
    device: torch.device | str = "cpu",
    progress: Progress = _no_progress,
    registry: Registry | None = None,
    recipe_widths: dict[str, int] | None = None,
    **options: Any,
) -> ComponentBenchReport:
    """LipConvnet-5 (lipcli's defaults) and the network of each recipe ``names`` (``NAME`` or
    ``NAME@VERSION``, resolved as ``lip train --recipe`` resolves them: exit 2 for an unknown
    one), interleaved; ``recipe_widths``: a width of its own for some recipes (name as given;
    the row's ``components`` record it); ``options`` as
    :func:`lipcli.bench.compare.bench_components`'."""
    names = list(dict.fromkeys(names))
    if not names:
        raise LipUsageError("give at least one recipe")
    reg = registry or get_registry()
    specs = [resolve_recipe(reg, name) for name in names]
    widths = dict(recipe_widths or {})
    variants = [{"arch": REFERENCE_ARCH, **DEFAULTS}, *(
        {**recipe_network(spec), **({"width": str(widths[name])} if name in widths else {})}
        for name, spec in zip(names, specs))]
    labels = [REFERENCE_ARCH, *(spec.label for spec in specs)]
    s = arch_settings(bench_components_arch, options)
    device = torch.device(device)
    env = environment(device)
    result = bench_components_arch(f"{REFERENCE_ARCH} and recipes", variants, device=device,
                                   progress=progress, labels=labels, **options)
    result.varying = ["recipe"]
    time_recipe_optimizers(result.variants[1:], specs, width=s["width"], num_classes=s["num_classes"],
                           seed=s["seed"], batch_size=s["batch_size"], steps=s["steps"], warmup=s["warmup"],
                           device=device, progress=progress)
    record_load_after(env)
    settings = ComponentBenchSettings(
        batch_size=s["batch_size"], steps=s["steps"], warmup=s["warmup"], width=s["width"],
        num_classes=s["num_classes"], seed=s["seed"], choices={"recipe": [spec.label for spec in specs]},
        schedule=(
            "interleaved: each round every network takes one step on the same synthetic batch, "
            "the starting network rotating between rounds; warm-up rounds not timed; every row "
            "runs the same SGD + cross-entropy step; each recipe's own optimiser is then timed against "
            "that SGD on the same gradients (lipcli.bench.optimizer_share; the recipes' losses are not timed)"
        ),
        step=step_settings(s["batch_size"]),
    )
    return ComponentBenchReport(environment=env, settings=settings, results=[result])
