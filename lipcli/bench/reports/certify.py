"""The report of ``lip bench certify`` (feature, certificate and Lipschitz throughput)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lipcli._util.records import JsonRecord
from lipcli.bench.reports.common import BenchReport


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


@dataclass
class FeaturePath(JsonRecord):
    """One feature path of ``lip bench certify``: ``"series"`` (every layer literal,
    ``lip certify --series``) or ``"lowered"`` (the eval lowering ``lip certify`` runs)."""

    path: str
    flop_per_input: int
    seconds: list[float]
    inputs_per_s: float
    build_s: float
    dense_layers: list[str]
    lipschitz_upper_bound: float


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
    #: series against lowered feature pass (:func:`lipcli.bench.certify.feature_paths`), interleaved
    feature_paths: list[FeaturePath] = field(default_factory=list)
