"""The parts every ``lip bench`` report shares: where it was measured (:class:`Environment`),
the report base classes, and the records of timed training steps (settings, times, memory,
CUDA-graph use, kernel floor).

``report.to_json()`` is the JSON that ``lip bench ... --json`` prints and ``--output`` writes
(keys in field order; parts declared ``field(metadata=INLINE)`` put their keys in the
parent's place: see :mod:`lipcli._util.records`).  The tables of :mod:`lipcli.cli.bench_tables`
read the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from lipcli._util.records import INLINE, JsonRecord

S = TypeVar("S")  # a report's settings
R = TypeVar("R")  # a report's per-architecture result

@dataclass
class GpuEnvironment(JsonRecord):
    """The CUDA part of :class:`Environment` (absent on CPU)."""

    cuda: str | None
    cudnn: int | None
    cudnn_benchmark: bool
    #: (convolution, matmul) float32 precision: "tf32"/"ieee"/"none" or the allow_tf32 flags
    fp32_precision: list[Any]
    gpu_memory_gib: float


@dataclass
class Environment(JsonRecord):
    """Where the numbers were measured: device, threads, versions, load before (and after)."""

    JSON_OMIT_NONE = ("load_average_after",)

    device: str
    device_name: str
    torch: str
    python: str
    lipcli: str
    platform: str
    cpu_count: int | None
    torch_threads: int
    torch_interop_threads: int
    timestamp: str
    load_average_1m_5m_15m: list[float] | None
    gpu: GpuEnvironment | None = field(default=None, metadata=INLINE)
    load_average_after: list[float] | None = None


@dataclass(kw_only=True)
class BenchReport(JsonRecord):
    """What every ``lip bench`` report starts with: its kind and where it was measured."""

    benchmark: str
    environment: Environment


@dataclass
class StepSettings(JsonRecord):
    """Settings of the training-step benchmarks: inputs, epoch size, recipe."""

    input_shape: list[int]
    epoch_images: int
    steps_per_epoch: int
    optimizer: str
    step: str
    epoch_time: str
    inputs: str


@dataclass
class StepTimes(JsonRecord):
    """Timed training steps of one model (seconds) and what they imply."""

    step_times_s: list[float]
    median_step_s: float
    min_step_s: float
    max_step_s: float
    iqr_step_s: float
    images_per_s: float
    epoch_s: float


@dataclass
class StepMemory(JsonRecord):
    """Peak memory of one training step (:func:`lipcli.bench.memory.measure_step_memory`);
    the peaks are ``None`` where the method is unavailable."""

    method: str
    peak_step_mib: float | None
    peak_total_mib: float | None
    saved_activations_mib: float
    saved_tensors: int


@dataclass
class GraphUse(JsonRecord):
    """Whether training steps were replayed from a CUDA graph: the steps replayed and run
    eagerly when one was set up (absent otherwise), the reason when none is used."""

    JSON_OMIT_NONE = ("replays", "eager_steps")

    captured: bool
    replays: int | None = None
    eager_steps: int | None = None
    reason: str | None = None

    @classmethod
    def of(cls, summary: dict[str, Any]) -> GraphUse:
        """From :meth:`lipcli.train.cuda_graphs.GraphedStep.summary`."""
        return cls(captured=summary["captured"], replays=summary["replays"],
                   eager_steps=summary["eager_steps"], reason=summary["reason"])


@dataclass
class KernelFloor(JsonRecord):
    """GPU kernel time per step and its convolution part (:func:`lipcli.bench.profile.kernel_floor`)."""

    JSON_OMIT_NONE = ("step_over_conv_kernel",)

    conv_kernel_ms_per_step: float
    gpu_kernel_ms_per_step: float
    profiled_step_ms: float
    profiled_steps: int
    #: median step time / convolution kernel time (when that is > 0)
    step_over_conv_kernel: float | None = None


@dataclass
class FastExact(JsonRecord):
    fast: float
    exact: float


@dataclass
class StepBenchSettings(JsonRecord):
    """The settings every training-step benchmark reports first."""

    batch_size: int
    steps: int
    warmup: int
    width: int


@dataclass(kw_only=True)
class StepBenchReport(BenchReport, Generic[S, R]):
    """A training-step benchmark: its settings and one result per architecture."""

    settings: S
    results: list[R]
