"""Typed results of a certification run (:class:`CertifySummary` and its parts).

``summary.to_json()`` is the JSON that ``lip certify --json`` prints and that the model file's
``results["certify"]`` slot stores (keys in field order; see :mod:`lipcli._util.records`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lipcli.lipschitz.promises import PromiseCheck
from lipcli._util.records import JsonRecord
from lipcli.sdk.errors import LipError

ESTIMATE_WARNING = "ESTIMATE (paper convention, not guaranteed)"
BOUND_TEXT = "GUARANTEED upper bound"
MEAN_RADIUS_DEFINITION = (
    "input-space l2; 'all': mean over all points of the certified radius, 0 for "
    "misclassified points; 'correct': mean over correctly classified points"
)


@dataclass
class EvalDataset(JsonRecord):
    """The data set evaluated (``size`` points of ``split``; ``limit`` as requested)."""

    name: str
    params: dict[str, Any]
    split: str
    root: str | None
    num_classes: int | None
    size: int | None = None
    limit: int | None = None


@dataclass
class CertificateUsed(JsonRecord):
    """The head's certificate and what it reported."""

    name: str
    provider: str
    promises_sound: bool
    classes: str
    exact_classes: bool
    top_k: int | None
    notes: list[str]
    stats: Any


@dataclass
class LipschitzUsed(JsonRecord):
    """``Lip(g)`` divided by: ``value`` (the bound, or the estimate when asked), of the
    operator that ran: ``dense_layers`` the layers that ran as dense float32 matrices (the
    eval lowering; ``upper_bound`` covers them), empty when every layer ran literally."""

    method: str
    value: float
    guaranteed: bool
    label: str
    upper_bound: float
    upper_bound_label: str
    estimate: float | None
    includes_normalization: bool = True
    dense_layers: list[str] = field(default_factory=list)


@dataclass
class RadiusRow(JsonRecord):
    """Certified accuracy at one radius; the PGD columns only when attacked."""

    JSON_OMIT_NONE = ("attacked", "empirical_robust_accuracy", "violations")

    radius: float
    radius_units: float
    certified_accuracy: float
    certified: int
    attacked: int | None = None
    empirical_robust_accuracy: float | None = None
    violations: int | None = None


@dataclass
class MeanCertifiedRadius(JsonRecord):
    all: float  # may be inf: --json writes "inf" (strict JSON)
    correct: float
    definition: str = MEAN_RADIUS_DEFINITION


@dataclass
class Violation(JsonRecord):
    """A point whose certified prediction PGD changed within its certified radius."""

    index: int
    radius: float
    certified_radius: float
    attack_distance: float
    margin: float


@dataclass
class AttackInfo(JsonRecord):
    steps: int
    restarts: int
    norm: str
    box: list[float]
    violations: int
    violation_examples: list[Violation]


@dataclass
class CertifySummary(JsonRecord):
    """Everything one certification run reports (``to_json()``: ``--json`` and the model
    file's ``results["certify"]``; ``written``, ``per_sample`` and ``plot`` are absent there
    while ``None``)."""

    JSON_OMIT_NONE = ("written", "per_sample", "plot")

    model: str
    weights_sha256: str
    arch: str
    head: str
    dataset: EvalDataset
    device: str
    certificate: CertificateUsed
    lipschitz: LipschitzUsed
    sound: bool
    total: int
    correct: int
    clean_accuracy: float
    radius_unit: float
    radii: list[RadiusRow]
    mean_certified_radius: MeanCertifiedRadius
    attack: AttackInfo | None
    violations: int
    promises: PromiseCheck
    time_s: dict[str, float]
    notes: list[str]
    #: features, logits and margins computed in float64 (``--exact``, lipcli.certify.exact)
    exact: bool = False
    written: list[str] | None = None  # model-file slots updated
    per_sample: str | None = None  # set by the front end that wrote them
    plot: str | None = None


@dataclass
class CertifyOutcome:
    """The summary plus per-input arrays (in the order of ``indices`` in the split)."""

    summary: CertifySummary
    labels: torch.Tensor
    predictions: torch.Tensor
    radius: torch.Tensor  # float64, input space, radius of the predicted class
    violations: list[Violation] = field(default_factory=list)
    indices: list[int] | None = None  # the points' indices in the split (None: all, in order)

    @property
    def correct(self) -> torch.Tensor:
        return self.predictions == self.labels


class ResultsNotWrittenError(LipError):
    """Certification finished but its results could not be stored in the model file (e.g.
    disk full).  ``outcome`` holds everything that was computed, so that the caller can still
    report it before failing."""

    def __init__(self, message: str, outcome: CertifyOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome
