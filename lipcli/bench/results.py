"""Typed results of ``lip bench`` (one report dataclass per subcommand and their parts).

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


# ---------------------------------------------------------------------------------------------
# parts every report shares
# ---------------------------------------------------------------------------------------------
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
class GraphSteps(JsonRecord):
    """Steps replayed from a CUDA graph and steps run eagerly (where one was set up)."""

    replays: int
    eager_steps: int


@dataclass
class GraphUse(JsonRecord):
    """Whether training steps were replayed from a CUDA graph (the steps when one was set
    up; the reason when none is used)."""

    captured: bool
    steps: GraphSteps | None = field(default=None, metadata=INLINE)
    reason: str | None = None

    @classmethod
    def of(cls, summary: dict[str, Any]) -> GraphUse:
        """From :meth:`lipcli.train.cuda_graphs.GraphedStep.summary`."""
        return cls(captured=summary["captured"], reason=summary["reason"],
                   steps=GraphSteps(replays=summary["replays"], eager_steps=summary["eager_steps"]))


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


# ---------------------------------------------------------------------------------------------
# lip bench train (Table 1)
# ---------------------------------------------------------------------------------------------
@dataclass
class ModelTiming(JsonRecord):
    """One of the two models of a Table 1 row."""

    JSON_OMIT_NONE = ("kernel_floor", "memory")

    conv: str
    times: StepTimes = field(metadata=INLINE)
    cuda_graphs: GraphUse
    kernel_floor: KernelFloor | None = None
    memory: StepMemory | None = None


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
class StepBenchSettings(JsonRecord):
    """The settings every training-step benchmark reports first."""

    batch_size: int
    steps: int
    warmup: int
    width: int


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


@dataclass(kw_only=True)
class StepBenchReport(BenchReport, Generic[S, R]):
    """A training-step benchmark: its settings and one result per architecture."""

    settings: S
    results: list[R]


@dataclass(kw_only=True)
class TrainBenchReport(StepBenchReport[TrainBenchSettings, Table1Row]):
    """``lip bench train`` (:func:`lipcli.bench.bench_train`)."""

    benchmark: str = "train"


# ---------------------------------------------------------------------------------------------
# lip bench train with component lists
# ---------------------------------------------------------------------------------------------
@dataclass
class VariantRow(JsonRecord):
    """One component combination on one architecture."""

    JSON_OMIT_NONE = ("memory",)

    label: str
    components: dict[str, str]
    parameters: int
    times: StepTimes = field(metadata=INLINE)
    relative_to_reference: float
    relative_to_reference_paired: float
    first_step_loss: float
    final_loss: float
    memory: StepMemory | None = None


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


# ---------------------------------------------------------------------------------------------
# lip bench certify
# ---------------------------------------------------------------------------------------------
@dataclass
class HeadFit(JsonRecord):
    """What :func:`lipcli.bench.certify.fit_head` did."""

    max_steps: int
    steps_taken: int
    target_loss: float
    final_loss: float
    teacher_agreement: float


@dataclass
class Quantiles(JsonRecord):
    """Of the finite values (NaN when there are none)."""

    min: float
    median: float
    max: float


@dataclass
class CertifyBenchSettings(JsonRecord):
    arch: str | None
    conv: str | None
    pool: str | None
    head: str
    num_classes: int
    input_shape: list[int]
    n: int
    batch_size: int
    top_k: int | None
    weights: str
    inputs: str
    fit_head: HeadFit | None


@dataclass
class FeatureTiming(JsonRecord):
    seconds: float
    inputs_per_s: float
    feature_dim: int
    mode: str


@dataclass
class LipschitzTiming(JsonRecord):
    upper_bound: float
    upper_bound_s: float
    estimate: float | None
    estimate_s: float
    estimate_iters: int
    report_total_s: float


@dataclass
class CertificateTiming(JsonRecord):
    """One certificate method (optionally restricted to the top-k classes)."""

    method: str
    top_k: int | None
    exact_classes: bool
    prepare_s: float
    certify_s: float
    inputs_per_s: float | None
    feature_radius: Quantiles
    input_radius: Quantiles
    nonzero_fraction: float
    notes: list[str]
    stats: dict[str, Any]


@dataclass(kw_only=True)
class CertifyBenchReport(BenchReport):
    """``lip bench certify`` (:func:`lipcli.bench.bench_certify`)."""

    benchmark: str = "certify"
    settings: CertifyBenchSettings
    parameters: int
    power_refresh_s: float
    power_refresh_steps: int
    features: FeatureTiming
    lipschitz: LipschitzTiming
    certificates: list[CertificateTiming]
    notes: list[str]
    #: series against lowered feature pass (lipcli.bench.certify.FeaturePath), interleaved
    feature_paths: list[Any] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# lip bench profile
# ---------------------------------------------------------------------------------------------
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
