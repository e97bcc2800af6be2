"""The typed reports of ``lip bench``, one module per command: :mod:`.train`
(:class:`TrainBenchReport`, ``lip bench train``), :mod:`.components`
(:class:`ComponentBenchReport`, ``lip bench train`` with component lists), :mod:`.certify`
(:class:`CertifyBenchReport`) and :mod:`.profile` (:class:`ProfileReport`); the parts they
share (environment, step times, memory, CUDA-graph use) are in :mod:`.common`.
``report.to_json()`` is the JSON that ``--json`` prints and ``--output`` writes."""

from lipcli.bench.reports.certify import (CertificateTiming, CertifyBenchReport, CertifyBenchSettings,
                                          FeaturePath, FeatureTiming, HeadFit, LipschitzTiming, Quantiles)
from lipcli.bench.reports.common import (BenchReport, Environment, FastExact, GpuEnvironment, GraphUse,
                                         KernelFloor, StepBenchReport, StepBenchSettings, StepMemory,
                                         StepSettings, StepTimes)
from lipcli.bench.reports.components import (ComponentBenchReport, ComponentBenchSettings, VariantRow,
                                             VariantsResult)
from lipcli.bench.reports.profile import (CategoryTime, GpuProfile, KernelTime, NodeTime, OperatorTime,
                                          ProfileReport, ProfileSettings)
from lipcli.bench.reports.train import ModelTiming, Table1Row, TrainBenchReport, TrainBenchSettings

__all__ = [
    "BenchReport", "CategoryTime", "CertificateTiming", "CertifyBenchReport", "CertifyBenchSettings",
    "ComponentBenchReport", "ComponentBenchSettings", "Environment", "FastExact", "FeaturePath", "FeatureTiming",
    "GpuEnvironment", "GpuProfile", "GraphUse", "HeadFit", "KernelFloor", "KernelTime",
    "LipschitzTiming", "ModelTiming", "NodeTime", "OperatorTime", "ProfileReport", "ProfileSettings",
    "Quantiles", "StepBenchReport", "StepBenchSettings", "StepMemory", "StepSettings", "StepTimes",
    "Table1Row", "TrainBenchReport", "TrainBenchSettings", "VariantRow", "VariantsResult",
]
