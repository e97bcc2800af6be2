"""The Lipschitz report of ``lip lipschitz`` (:func:`lipschitz_report`): the GUARANTEED bound,
the power-method estimate and the empirical lower bound (see :mod:`lipcli.lipschitz.bound`),
and the model file's ``lipschitz`` slot (:func:`merge_stored_record`)."""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from lipcli._util.records import JsonRecord
from lipcli.lipschitz.bound import (
    BOUND_LABEL,
    EMPIRICAL_LABEL,
    ESTIMATE_LABEL,
    _estimate_of,
    body_of,
    guaranteed_upper_bound,
    layer_input_shapes,
    lowered_upper_bound,
    weights_fingerprint,
)
from lipcli.lipschitz.empirical import EmpiricalLower, empirical_lower_bound
from lipcli.lowering.network import lowered_network
from lipcli.numerics.precision import in_full_float32_precision
from lipcli.sdk.errors import LipError


def _empirical_passes() -> int:
    """Forward passes of :func:`empirical_lower_bound` with its defaults: ``points`` inputs,
    ``iters`` power steps of about three passes each (two differences and one backward)."""
    params = inspect.signature(empirical_lower_bound).parameters
    return 3 * int(params["points"].default) * int(params["iters"].default)


@dataclass
class LayerLipschitz(JsonRecord):
    """One body child: its guaranteed bound (``source`` ``"bound"`` or ``"promise"``) and its
    power-method estimate (``None`` when not computed)."""

    name: str
    type: str
    input_shape: list[int]
    source: str
    upper_bound: float
    estimate: float | None


@dataclass
class LipschitzReport(JsonRecord):
    """What :func:`lipschitz_report` finds (``to_json()``: ``lip lipschitz --json`` and, without
    ``promises``/``model``, the model file's ``lipschitz`` slot).  The last four fields are
    set by the caller and absent from the JSON while ``None``."""

    JSON_OMIT_NONE = ("promises", "model", "written", "carried_over")

    upper_bound: float
    upper_bound_label: str
    estimate: float | None
    estimate_label: str
    estimate_iters: int | None
    empirical_lower: EmpiricalLower | None
    layers: list[LayerLipschitz]
    includes_normalization: bool
    weights_sha256: str
    time_s: dict[str, float] = field(default_factory=dict)
    promises: Any = None  # lipcli.lipschitz.promises.PromiseCheck, when checked
    model: str | None = None
    written: bool | None = None
    carried_over: list[str] | None = None

    def record(self) -> dict[str, Any]:
        """The JSON of the report itself (what the model file's ``lipschitz`` slot is made of)."""
        return {k: v for k, v in self.to_json().items() if k not in ("promises", "model", "written", "carried_over")}


@in_full_float32_precision
def lipschitz_report(
    model: nn.Module,
    *,
    estimate: bool = True,
    iters: int = 50,
    empirical: bool = False,
    data: torch.Tensor | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> LipschitzReport:
    """Per-layer and whole-network Lipschitz numbers of ``g = model.body`` (SPEC §5).

    Returns a :class:`LipschitzReport`: ``layers`` (:class:`LayerLipschitz`: name, type,
    input_shape, source (``"bound"``/``"promise"``), upper_bound, estimate), ``upper_bound``
    (guaranteed, normalisation included), ``estimate`` (product of power-method estimates;
    ``None`` if ``estimate=False``), ``empirical_lower`` (an :class:`EmpiricalLower` or
    ``None``), the labels of the three, ``weights_sha256`` and timings in seconds. The model is evaluated in eval mode (its
    train/eval state is restored afterwards). ``progress(stage, done, total)`` is called after
    each layer's power-method estimate (the slow part).
    """
    was_training = model.training
    model.eval()
    try:
        t0 = time.perf_counter()
        shapes = layer_input_shapes(model)
        t_shapes = time.perf_counter() - t0
        t0 = time.perf_counter()
        bound, rows = guaranteed_upper_bound(model)
        t_bound = time.perf_counter() - t0
        est_total: float | None = None
        estimates: list[float | None] = [None] * len(rows)
        t_est = 0.0
        if estimate:
            t0 = time.perf_counter()
            est_total = 1.0
            children = dict(body_of(model).named_children())
            for done, row in enumerate(rows, 1):
                e = _estimate_of(children[row.name], row.source, shapes[row.name], iters)
                estimates[done - 1] = e
                est_total *= e
                if progress is not None:
                    progress("power-method estimate (layers)", done, len(rows))
            t_est = time.perf_counter() - t0
        emp = None
        t_emp = 0.0
        if empirical:
            t0 = time.perf_counter()
            # measured on the operator that runs (the eval lowering) against its bound
            # (the device's default cap; lowered where the build pays off on this check's passes)
            network = lowered_network(model, inputs=_empirical_passes())
            ran_bound = lowered_upper_bound(model, network, (bound, rows))[0]
            emp = empirical_lower_bound(model, data, body=network.body)
            t_emp = time.perf_counter() - t0
            # float64 ratios vs a bound for the float32 weights: allow 1e-6 relative slack
            if emp.value > ran_bound * (1 + 1e-6):
                raise LipError(
                    f"SOUNDNESS VIOLATION: empirical Lipschitz lower bound {emp.value:.9g} "
                    f"exceeds the guaranteed upper bound {ran_bound:.9g} of the operator that runs"
                )
    finally:
        model.train(was_training)
    return LipschitzReport(
        upper_bound=bound,
        upper_bound_label=BOUND_LABEL,
        estimate=est_total,
        estimate_label=ESTIMATE_LABEL,
        estimate_iters=iters if estimate else None,
        empirical_lower=emp,
        layers=[
            LayerLipschitz(name=row.name, type=row.type, input_shape=list(shapes.get(row.name, ())),
                           source=row.source, upper_bound=row.upper_bound, estimate=e)
            for row, e in zip(rows, estimates)
        ],
        includes_normalization=True,
        weights_sha256=weights_fingerprint(model),
        time_s={"shapes": t_shapes, "upper_bound": t_bound, "estimate": t_est, "empirical": t_emp},
    )


def merge_stored_record(record: dict[str, Any], stored: Any) -> dict[str, Any]:
    """The ``lipschitz`` slot to write: ``record`` (a fresh :meth:`LipschitzReport.record`)
    plus what it did not recompute, kept from the ``stored`` slot.

    A fresh report made without the power estimate (``--no-estimate``) or without the
    empirical search has ``None`` there; the stored estimate (with its per-layer values and
    iteration count) and empirical lower bound are kept instead, but only when ``stored``
    belongs to the same weights (equal ``weights_sha256``): a value for other weights is
    dropped, never relabelled.  The guaranteed bound is always the fresh one, and the labels
    are this lipcli's (:data:`BOUND_LABEL`, :data:`ESTIMATE_LABEL`, :data:`EMPIRICAL_LABEL`);
    ``carried_over`` lists the kept fields.
    """
    out = dict(record)
    out["upper_bound_label"] = BOUND_LABEL
    out["estimate_label"] = ESTIMATE_LABEL
    if not isinstance(stored, dict) or stored.get("weights_sha256") != record.get("weights_sha256"):
        return out
    kept: list[str] = []

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if out.get("estimate") is None and number(stored.get("estimate")):
        out["estimate"] = float(stored["estimate"])
        out["estimate_iters"] = stored.get("estimate_iters")
        old_rows = {row.get("name"): row for row in stored.get("layers") or [] if isinstance(row, dict)}
        layers = []
        for row in out.get("layers") or []:
            row = dict(row)
            old = old_rows.get(row.get("name"), {}).get("estimate")
            if row.get("estimate") is None and number(old):
                row["estimate"] = float(old)
            layers.append(row)
        out["layers"] = layers
        kept.append("estimate")
    emp = stored.get("empirical_lower")
    if out.get("empirical_lower") is None and isinstance(emp, dict) and number(emp.get("value")):
        out["empirical_lower"] = {**emp, "label": EMPIRICAL_LABEL}
        kept.append("empirical_lower")
    if kept:
        out["carried_over"] = kept
    return out
