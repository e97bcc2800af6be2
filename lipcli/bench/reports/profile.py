"""The report of ``lip bench profile`` (where a training step's time goes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lipcli._util.records import INLINE, JsonRecord
from lipcli.bench.reports.common import BenchReport


@dataclass
class CategoryTime(JsonRecord):
    category: str
    label: str
    ms_per_step: float
    share_pct: float


@dataclass
class OperatorTime(JsonRecord):
    op: str
    category: str
    ms_per_step: float
    share_pct: float


@dataclass
class NodeTime(JsonRecord):
    node: str
    ms_per_step: float
    share_pct: float


@dataclass
class KernelTime(JsonRecord):
    kernel: str
    ms_per_step: float
    category: str


@dataclass
class ProfileSettings(JsonRecord):
    arch: str
    conv: str
    head: str
    pool: str
    width: int
    batch_size: int
    steps: int
    warmup: int
    num_classes: int
    input_shape: list[int]
    time_basis: str
    convolution_rule: str


@dataclass
class GpuProfile(JsonRecord):
    """The CUDA part of :class:`ProfileReport` (absent on CPU)."""

    gpu_busy_ms_per_step: float
    gpu_idle_ms_per_step: float
    cpu_operator_ms_per_step: float
    device_events_ms_per_step: float
    kernels_without_launch_record: list[KernelTime]


@dataclass(kw_only=True)
class ProfileReport(BenchReport):
    """``lip bench profile`` (:func:`lipcli.bench.bench_profile`); ``target_pct`` and
    ``target_met`` are set by :meth:`check_target` (absent from the JSON until then)."""

    JSON_OMIT_NONE = ("target_pct", "target_met")

    benchmark: str = "profile"
    settings: ProfileSettings
    step_ms_unprofiled_median: float
    step_ms_profiled: float
    categories: list[CategoryTime]
    convolution_share_pct: float
    convolution_share_of_operators_pct: float | None
    top_operators: list[OperatorTime]
    backward_non_convolution_by_node: list[NodeTime]
    gpu: GpuProfile | None = field(default=None, metadata=INLINE)
    target_pct: float | None = None
    target_met: bool | None = None

    def check_target(self, target_pct: float) -> bool:
        """Record whether the convolution share reaches ``target_pct`` (%); returns it."""
        self.target_pct = target_pct
        self.target_met = self.convolution_share_pct >= target_pct
        return self.target_met
