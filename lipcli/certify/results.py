"""Typed results of a certification run (:class:`CertifySummary` and its parts).

``summary.to_json()`` is the JSON that ``lip certify --json`` prints and that the model file's
``results["certify"]`` slot stores (keys in field order; see :mod:`lipcli._util.records`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lipcli.certify.options import CertifyOptions
from lipcli.lipschitz.bound import BOUND_LABEL
from lipcli.lipschitz.promises import PromiseCheck
from lipcli._util.records import JsonRecord
from lipcli.sdk.certificates import CertifyResult
from lipcli.sdk.errors import LipError
from lipcli.sdk.specs import SOUND, Component

ESTIMATE_WARNING = "ESTIMATE (paper convention, not guaranteed)"
BOUND_TEXT = "GUARANTEED upper bound"
MEAN_RADIUS_DEFINITION = (
    "input-space l2; 'all': mean over all points of the certified radius, 0 for "
    "misclassified points; 'correct': mean over correctly classified points"
)


@dataclass
class CertificateRun:
    """Step 3: the head's certificate on the features (feature-space radii) and its cache."""

    name: str
    component: Component
    certifier: Any
    result: CertifyResult
    cache: Any
    cache_before: Any  # snapshot of the file's cache slot, to detect changes

    @property
    def promises_sound(self) -> bool:
        return SOUND in getattr(self.component.spec, "promises", ()) or SOUND in getattr(
            self.certifier, "promises", ()
        )


@dataclass
class LipschitzConstant:
    """Step 4: ``Lip(g)`` used for the radii, with the guaranteed bound always computed."""

    value: float
    bound: float
    estimate: float | None
    fingerprint: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value > 0):
            raise LipError(f"invalid Lipschitz constant {self.value!r}")


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

    @classmethod
    def of(cls, cert: CertificateRun, top_k: int | None) -> CertificateUsed:
        """What the run ``cert`` used and reported (``top_k``: the competing classes asked for)."""
        result = cert.result
        return cls(
            name=cert.name,
            provider=cert.component.provider,
            promises_sound=cert.promises_sound,
            classes=(
                "all classes (exact)" if result.exact_classes
                else f"top-{top_k} other classes (HEURISTIC, not a certificate)"
            ),
            exact_classes=bool(result.exact_classes),
            top_k=top_k,
            notes=list(result.notes),
            stats=result.stats,
        )


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

    @classmethod
    def of(cls, method: str, lip: LipschitzConstant, dense_layers: list[str]) -> LipschitzUsed:
        """The constant ``lip`` used by ``method`` (``"bound"``: guaranteed) for the operator
        that ran, whose dense layers are ``dense_layers``."""
        guaranteed = method == "bound"
        return cls(
            method=method,
            value=lip.value,
            guaranteed=guaranteed,
            label=BOUND_TEXT if guaranteed else ESTIMATE_WARNING,
            upper_bound=lip.bound,
            upper_bound_label=BOUND_LABEL,
            estimate=lip.estimate,
            dense_layers=list(dense_layers),
        )


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

    @classmethod
    def assemble(
        cls, *, model: str, config: dict[str, Any], dataset: EvalDataset, device: str,
        options: CertifyOptions, cert: CertificateRun, lip: LipschitzConstant,
        dense_layers: list[str], correct: torch.Tensor, radii: list[RadiusRow],
        mean_radius: MeanCertifiedRadius, attack: AttackInfo | None, violations: int,
        promises: PromiseCheck, times: dict[str, float], notes: list[str],
    ) -> CertifySummary:
        """The summary of a run on the model file ``model`` (its ``config``): ``correct``
        marks the correctly classified points, ``notes`` (the list is kept) gets the reason
        why the run is not a guaranteed certificate, when it is not (:func:`soundness_note`)."""
        lipschitz = LipschitzUsed.of(options.lipschitz, lip, dense_layers)
        total, n_correct = int(correct.shape[0]), int(correct.sum())
        unsound = soundness_note(lipschitz.guaranteed, cert, options)
        if unsound:
            notes.append(unsound)
        return cls(
            model=model, weights_sha256=lip.fingerprint, arch=config["arch"]["name"],
            head=config["head"]["name"], dataset=dataset, device=device,
            certificate=CertificateUsed.of(cert, options.top_k), lipschitz=lipschitz,
            sound=bool(lipschitz.guaranteed and cert.result.exact_classes and cert.promises_sound),
            total=total, correct=n_correct, clean_accuracy=n_correct / total,
            radius_unit=options.radius_unit, radii=radii, mean_certified_radius=mean_radius,
            attack=attack, violations=violations, promises=promises, time_s=times, notes=notes,
            exact=options.exact,
        )


@dataclass
class CertifyOutcome:
    """The summary plus per-input arrays (in the order of ``indices`` in the split)."""

    summary: CertifySummary
    labels: torch.Tensor
    predictions: torch.Tensor
    radius: torch.Tensor  # float64, input space, radius of the predicted class
    violations: list[Violation] = field(default_factory=list)
    indices: list[int] | None = None  # the points' indices in the split (None: all, in order)
    #: the model certified and the points it was certified on (in ``indices`` order), for a
    #: caller that goes on with them (``lip import --compare``); not part of the summary
    model: Any = field(default=None, repr=False)
    dataset: Any = field(default=None, repr=False)

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


def soundness_note(guaranteed: bool, cert: CertificateRun, options: CertifyOptions) -> str | None:
    """Why a run is not a guaranteed certificate (``None`` when it is)."""
    reasons = []
    if not guaranteed:
        reasons.append(f"Lipschitz {ESTIMATE_WARNING}")
    if not cert.result.exact_classes:
        reasons.append(f"top-{options.top_k} classes heuristic")
    if not cert.promises_sound:
        reasons.append(f"certificate {cert.name!r} does not promise soundness")
    return "NOT a guaranteed certificate: " + "; ".join(reasons) if reasons else None
