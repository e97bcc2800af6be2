"""The report of ``lip bench train`` (Table 1: fast versus exact SOC per architecture)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lipcli._util.records import INLINE, JsonRecord
from lipcli.bench.reports.common import (
    FastExact, GraphUse, KernelFloor, StepBenchReport, StepBenchSettings, StepMemory,
    StepSettings, StepTimes,
)


@dataclass
class ModelTiming(JsonRecord):
    """One of the two models of a Table 1 row."""

    JSON_OMIT_NONE = ("kernel_floor", "memory", "compile_s")

    conv: str
    times: StepTimes = field(metadata=INLINE)
    cuda_graphs: GraphUse
    kernel_floor: KernelFloor | None = None
    memory: StepMemory | None = None
    #: seconds spent compiling the step (``--compile``; in the warm-up steps, not timed)
    compile_s: float | None = None


@dataclass
class Table1Row(JsonRecord):
    """Fast vs exact SOC on one architecture (:func:`lipcli.bench.table1.bench_train_arch`)."""

    arch: str
    soc_layers: int | None
    parameters: int
    initial_state_identical: bool
    first_step_loss: FastExact
    first_step_loss_abs_diff: float
    final_loss: FastExact
    fast: ModelTiming
    exact: ModelTiming
    reduction_pct: float
    reduction_pct_paired: float


@dataclass
class TrainBenchSettings(StepBenchSettings):
    head: str
    pool: str
    num_classes: int
    seed: int
    fast_conv: str
    exact_conv: str
    schedule: str
    cuda_graphs: bool
    kernel_floor: str | None
    step: StepSettings = field(metadata=INLINE)
    #: the torch.compile mode of both models' forward ("off": eager)
    compile: str = "off"


@dataclass(kw_only=True)
class TrainBenchReport(StepBenchReport[TrainBenchSettings, Table1Row]):
    """``lip bench train`` (:func:`lipcli.bench.bench_train`)."""

    benchmark: str = "train"
