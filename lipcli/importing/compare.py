"""``lip import --compare``: certified accuracy by the source's own rule beside lipcli's.

lipcli's side is ``lip certify`` on the imported model file (:func:`run_certification`: the
GUARANTEED bound, every class).  The source's side is the importer's
``source_certificates(model, images)`` on the same points of the same split: the source's
Lipschitz *estimate*, its head formula, its top-k, its comparison (``radius > r`` for the
paper's code).  Per radius: both certified accuracies and the number of points the source
certifies that lipcli does not (over-claims unless lipcli's certificate is merely looser).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from lipcli.certify.data import load_dataset, stack
from lipcli.certify.driver import run_certification
from lipcli.certify.options import CertifyOptions
from lipcli.host.plugins import Registry

__all__ = ["CompareRow", "ImportComparison", "check_compare_data", "compare_certificates"]

#: images per batch for the source's rule
_BATCH = 256


@dataclass
class CompareRow:
    radius: float
    radius_units: float
    source_certified_accuracy: float | None
    lipcli_certified_accuracy: float
    source_only: int | None


@dataclass
class ImportComparison:
    points: int
    clean_accuracy: float
    lipcli_lipschitz: float
    source_lipschitz: float | None
    source_label: str
    rows: list[CompareRow] = field(default_factory=list)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _source_side(importer: Any, model: torch.nn.Module, images: torch.Tensor) -> Any:
    rule = getattr(importer, "source_certificates", None)
    if rule is None:
        return None
    parts = [rule(model, images[i:i + _BATCH]) for i in range(0, len(images), _BATCH)]
    if any(p is None for p in parts) or not parts:
        return None
    first = parts[0]
    return type(first)(predictions=torch.cat([p.predictions for p in parts]),
                       radii=torch.cat([p.radii.double() for p in parts]),
                       lipschitz=first.lipschitz, label=first.label, strict=first.strict)


def check_compare_data(options: CertifyOptions, record: dict[str, Any] | None, out: str | os.PathLike,
                       registry: Registry) -> Any:
    """Read the data ``compare_certificates`` will use (``record``: the data set the model file
    will record), before that file is written: a bad data set or folder is refused first;
    returns ``(dataset, info)`` for the comparison (read once)."""
    return load_dataset(registry, record, name=options.dataset, data_dir=options.data_dir,
                 download=options.download, split=options.split, model_path=out)


def compare_certificates(model_path: str | os.PathLike, importer: Any, options: CertifyOptions,
                         registry: Registry, loaded: Any = None) -> ImportComparison:
    """Certify ``model_path`` both ways on ``options``' data (see the module); ``loaded``: the
    model, model file and data a caller holds (:func:`lipcli.certify.driver.run_certification`),
    so that nothing is built, read or loaded twice."""
    outcome = run_certification(model_path, options, registry=registry, loaded=loaded)
    model, dataset = outcome.model, outcome.dataset  # the points certified, in their order
    images, labels = stack(dataset, list(range(len(dataset))))
    correct = outcome.predictions.cpu() == labels
    source = _source_side(importer, model, images)
    summary = outcome.summary
    comparison = ImportComparison(
        points=len(labels), clean_accuracy=float(correct.double().mean()),
        lipcli_lipschitz=float(summary.lipschitz.value),
        source_lipschitz=None if source is None else float(source.lipschitz),
        source_label="" if source is None else source.label,
        note=("the importer does not reproduce the source's certificate rule for this model"
              if source is None else None),
    )
    for eps in options.radii:
        ours = correct & (outcome.radius.cpu() >= eps)
        row = CompareRow(radius=eps, radius_units=eps * options.radius_unit,
                         lipcli_certified_accuracy=float(ours.double().mean()),
                         source_certified_accuracy=None, source_only=None)
        if source is not None:
            src_correct = source.predictions.cpu() == labels
            over = source.radii.cpu() > eps if source.strict else source.radii.cpu() >= eps
            theirs = src_correct & over
            row.source_certified_accuracy = float(theirs.double().mean())
            row.source_only = int((theirs & ~ours).sum())
        comparison.rows.append(row)
    return comparison
