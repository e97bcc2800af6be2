"""The report of ``lip bench train`` with component lists (one row per combination)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lipcli._util.records import INLINE, JsonRecord
from lipcli.bench.reports.common import (
    StepBenchReport, StepBenchSettings, StepMemory, StepSettings, StepTimes,
)


@dataclass
class OptimizerTiming(JsonRecord):
    """A recipe's own optimiser step against the benchmark's SGD step on the same gradients
    (:mod:`lipcli.bench.optimizer_share`); ``share``: its part of a step that uses it."""

    name: str
    step_ms: float
    sgd_step_ms: float
    share: float


@dataclass
class VariantRow(JsonRecord):
    """One component combination on one architecture."""

    JSON_OMIT_NONE = ("memory", "optimizer")

    label: str
    components: dict[str, str]
    parameters: int
    times: StepTimes = field(metadata=INLINE)
    relative_to_reference: float
    relative_to_reference_paired: float
    first_step_loss: float
    final_loss: float
    memory: StepMemory | None = None
    optimizer: OptimizerTiming | None = None


@dataclass
class VariantsResult(JsonRecord):
    """Every variant on one architecture (:func:`lipcli.bench.compare.bench_components_arch`)."""

    arch: str
    reference: str
    varying: list[str]
    variants: list[VariantRow]


@dataclass
class ComponentBenchSettings(StepBenchSettings):
    num_classes: int
    seed: int
    choices: dict[str, list[str]]
    schedule: str
    step: StepSettings = field(metadata=INLINE)


@dataclass(kw_only=True)
class ComponentBenchReport(StepBenchReport[ComponentBenchSettings, VariantsResult]):
    """``lip bench train --conv a,b,...`` (:func:`lipcli.bench.compare.bench_components`)."""

    benchmark: str = "train-components"
