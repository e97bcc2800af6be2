"""The Lipschitz constant of a model's feature map ``g: x -> y`` (SPEC §5).

``g`` is ``model.body``: a :class:`torch.nn.Sequential` whose first child is the input
normalisation ``(x - mean)/std`` and whose last child flattens to ``(N, D)``. For a sequential
composition, ``Lip(g) <= prod_i Lip(child_i)`` (SPEC §5), so three numbers are reported:

``upper_bound`` (GUARANTEED)
    ``prod_i U_i`` with ``U_i = child.lipschitz_upper_bound()`` when the child has that method
    (SOC layers: ``||P_T(S)|| <= 1 + ||S||^T/T! * 1/(1 - ||S||/(T+1))``; the normalisation:
    ``1/min std``), else ``U_i = 1`` when its ``lip_promises`` contain ``"1-lipschitz"``
    (MaxMin, pools, flatten). A child with neither is an error, never silently 1. Every
    multiplication is rounded *up* by one ulp, so the float64 product is itself an upper bound
    of the exact product of the per-layer bounds.

``estimate`` (LOWER estimate, the reference's convention)
    ``prod_i E_i`` with ``E_i = child.lipschitz_estimate(input_shape, iters)`` (power method on
    the layer at its evaluation terms), ``1/min std`` for the normalisation (exact) and 1 for
    1-Lipschitz children. Each ``E_i`` is a lower estimate of ``Lip(child_i)``, but the product
    is *not* a bound of either kind on ``Lip(g)``: this is what the paper's code divides by.

``empirical_lower`` (a true lower bound on ``Lip(g)``)
    ``max ||g(a) - g(b)|| / ||a - b||`` over a few pairs ``a = x + t v, b = x - t v`` found by
    a short power iteration on ``J(x)^T J(x)`` (``J`` the Jacobian of ``g`` at data points or
    random images ``x``), evaluated in float64. Any such ratio is ``<= Lip(g)`` by definition.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from lipcli.sdk.errors import LipError
from lipcli.numerics.precision import in_full_float32_precision
from lipcli._util.records import JsonRecord
from lipcli.sdk.specs import ONE_LIPSCHITZ

#: names used in reports
BOUND_LABEL = "GUARANTEED upper bound"
ESTIMATE_LABEL = "ESTIMATE (paper convention: product of per-layer power-method estimates, not guaranteed)"
EMPIRICAL_LABEL = "empirical LOWER bound (largest output/input distance ratio found)"


def _mul_up(a: float, b: float) -> float:
    """``a * b`` rounded up by one ulp (an upper bound of the exact product, for a, b >= 0)."""
    return math.nextafter(a * b, math.inf)


def body_of(model: nn.Module) -> nn.Sequential:
    """The model's feature map ``g`` (``model.body``), checked to be a Sequential."""
    body = getattr(model, "body", None)
    if not isinstance(body, nn.Sequential):
        raise LipError(
            f"{type(model).__name__} has no 'body' nn.Sequential; lipcli can only bound the "
            "Lipschitz constant of sequential feature maps"
        )
    return body


def model_input_shape(model: nn.Module) -> tuple[int, int, int]:
    """``(C, H, W)`` from the model's ``lipcli_config`` (default ``(in_channels, 32, 32)``)."""
    config = getattr(model, "lipcli_config", None) or {}
    channels = int(config.get("in_channels", getattr(model, "in_channels", 3)))
    size = config.get("image_size") or (32, 32)
    return (channels, int(size[0]), int(size[1]))


@torch.no_grad()
def layer_input_shapes(model: nn.Module, input_shape: tuple[int, int, int] | None = None) -> dict[str, tuple[int, ...]]:
    """Input shape (without batch dim) of every body child: from ``model.describe()`` when the
    architecture provides it (no computation), else recorded by forward pre-hooks on a dummy
    input of shape ``input_shape`` (default :func:`model_input_shape`)."""
    body = body_of(model)
    shape = input_shape or model_input_shape(model)
    names = [name for name, _ in body.named_children()]
    describe = getattr(model, "describe", None)
    if callable(describe):  # LipConvnet knows its shapes without running the network
        try:
            planned = {name: tuple(inp) for name, inp, _out in describe(shape)}
        except (TypeError, ValueError):
            planned = {}
        if all(name in planned for name in names):
            return {name: planned[name] for name in names}
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for name, child in body.named_children():
        def hook(_mod: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            shapes[name] = tuple(args[0].shape[1:])
        handles.append(child.register_forward_pre_hook(hook))
    try:
        param = next(model.parameters(), None)
        dtype = param.dtype if param is not None else torch.get_default_dtype()
        device = param.device if param is not None else torch.device("cpu")
        body(torch.zeros((1, *shape), dtype=dtype, device=device))
    finally:
        for h in handles:
            h.remove()
    return shapes


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 over the state dict (names, shapes, dtypes, bytes): identifies the weights
    (and power-iteration buffers) that a stored Lipschitz value or result belongs to; equal
    to :func:`~lipcli.host.modelfile.tensors_fingerprint` of the model file's tensors."""
    from lipcli.host.modelfile import tensors_fingerprint

    return tensors_fingerprint(model.state_dict())


def _layer_kind(child: nn.Module) -> str:
    if ONE_LIPSCHITZ in getattr(child, "lip_promises", ()) and not callable(
        getattr(child, "lipschitz_upper_bound", None)
    ):
        return "promise"
    if callable(getattr(child, "lipschitz_upper_bound", None)):
        return "bound"
    return "none"


@dataclass(frozen=True)
class LayerBound:
    """One body child's factor in the GUARANTEED bound: ``upper_bound`` from its
    ``lipschitz_upper_bound()`` (``source`` ``"bound"``) or 1 by its promise (``"promise"``)."""

    name: str
    type: str
    source: str
    upper_bound: float


def guaranteed_upper_bound(model: nn.Module) -> tuple[float, list[LayerBound]]:
    """``(prod_i U_i, per-layer rows)`` — the GUARANTEED bound of SPEC §5 (see module doc).

    Raises :class:`LipError` if a body child neither has ``lipschitz_upper_bound()`` nor
    promises ``"1-lipschitz"``; or if a layer's bound is not a finite number ``>= 0``.
    """
    body = body_of(model)
    total = 1.0
    rows: list[LayerBound] = []
    for name, child in body.named_children():
        kind = _layer_kind(child)
        if kind == "none":
            raise LipError(
                f"layer {name!r} ({type(child).__name__}) neither has lipschitz_upper_bound() "
                f"nor promises {ONE_LIPSCHITZ!r}: cannot bound the network's Lipschitz constant"
            )
        if kind == "bound":
            value = float(child.lipschitz_upper_bound())
            if not math.isfinite(value) or value < 0:
                raise LipError(f"layer {name!r} reported an invalid Lipschitz bound {value!r}")
        else:
            value = 1.0
        total = _mul_up(total, value)
        rows.append(LayerBound(name=name, type=type(child).__name__, source=kind, upper_bound=value))
    return total, rows


def _estimate_of(child: nn.Module, kind: str, shape: tuple[int, ...], iters: int) -> float:
    if kind == "promise":
        return 1.0
    est = getattr(child, "lipschitz_estimate", None)
    if callable(est):
        return float(est(tuple(shape), iters=iters))
    # no power method (e.g. the normalisation, whose bound 1/min std is exact)
    return float(child.lipschitz_upper_bound())


def _random_unit(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    v = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    flat = v.flatten(1)
    return (flat / flat.norm(dim=1, keepdim=True)).view(shape)


@dataclass
class EmpiricalLower(JsonRecord):
    """A true lower bound on ``Lip(g)`` (:func:`empirical_lower_bound`)."""

    value: float
    per_point: list[float]
    points: int
    source: str
    label: str = EMPIRICAL_LABEL


def empirical_lower_bound(
    model: nn.Module,
    data: torch.Tensor | None = None,
    *,
    points: int = 4,
    iters: int = 20,
    step: float = 1e-4,
    seed: int = 0,
) -> EmpiricalLower:
    """A true lower bound on ``Lip(g)``: ``max ||g(x+tv) - g(x-tv)|| / (2t)`` (``||v|| = 1``).

    ``v`` is found per point by power iteration on ``J^T J`` (``J v`` by a central float64
    difference, ``J^T u`` by autograd), which drives the ratio towards ``||J(x)||_2``. All
    evaluation is on a float64 copy of the model in eval mode. ``data``: ``(N, C, H, W)``
    images (the first ``points`` are used); random images in ``[0, 1]`` if ``None``.
    """
    body64 = copy.deepcopy(body_of(model)).double().eval()
    for p in body64.parameters():
        p.requires_grad_(False)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    gen = torch.Generator().manual_seed(seed)
    if data is None:
        x = torch.rand((points, *model_input_shape(model)), generator=gen, dtype=torch.float64)
    else:
        x = data[:points].detach().to(dtype=torch.float64, device="cpu")
    x = x.to(device)
    n = x.shape[0]
    v = _random_unit(tuple(x.shape), gen, torch.float64, device)

    def ratio(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            diff = (body64(x + step * v) - body64(x - step * v)).flatten(1)
        return diff.norm(dim=1) / (2 * step * v.flatten(1).norm(dim=1)), diff / (2 * step)

    best = torch.zeros(n, dtype=torch.float64, device=device)
    for _ in range(max(1, iters)):
        r, jv = ratio(v)
        best = torch.maximum(best, r)
        xg = x.clone().requires_grad_(True)
        with torch.enable_grad():
            out = body64(xg)
            (w,) = torch.autograd.grad(out, xg, grad_outputs=jv.view_as(out))
        norms = w.flatten(1).norm(dim=1).clamp_min(1e-300)
        v = (w.flatten(1) / norms[:, None]).view_as(x)
    r, _ = ratio(v)
    best = torch.maximum(best, r)
    return EmpiricalLower(
        value=float(best.max()),
        per_point=[float(b) for b in best],
        points=n,
        source="data" if data is not None else "random images in [0, 1]",
    )


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
            emp = empirical_lower_bound(model, data)
            t_emp = time.perf_counter() - t0
            # float64 ratios vs a bound for the float32 weights: allow 1e-6 relative slack
            if emp.value > bound * (1 + 1e-6):
                raise LipError(
                    f"SOUNDNESS VIOLATION: empirical Lipschitz lower bound {emp.value:.9g} "
                    f"exceeds the guaranteed upper bound {bound:.9g}"
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
