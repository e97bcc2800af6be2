"""Certification driver: model file + data set -> certified accuracy at l2 radii (SPEC §4, §5).

Pipeline (:func:`run_certification`):

1. load the model file (:func:`lipcli.host.models.load_model`, eval mode, the saved power-iteration
   vectors: the operator certified is exactly the saved one) and the data set named on the
   command line or recorded in the file's ``dataset`` slot; check classes and input shape;
2. features ``y = g(x)`` in float32, batched, eval mode, no gradients; then every layer
   counted as 1 by its promise is measured with the trained parameters at the first data
   points (:mod:`lipcli.host.promises`: a broken promise is an error, never a certificate);
3. the head's certificate (``HeadSpec.certificate``; all classes unless ``top_k``):
   ``prepare(head, cache)`` with the file's ``cache[<name>]`` slot, then ``certify`` on the
   features; the certifier works in float64 and returns feature-space radii ``r_y``;
4. ``Lip(g)``: by default the GUARANTEED upper bound of :mod:`lipcli.host.lipschitz`, computed
   fresh (normalisation included); ``lipschitz="estimate"`` uses the reference's product of
   power-method estimates, labelled "ESTIMATE (paper convention, not guaranteed)";
5. input-space radius ``r = r_y / Lip(g)`` (rounded down by one ulp), SPEC §4.

Definitions reported (``N`` points, ``correct_i`` = prediction equals the label, ``r_i`` the
certified radius of the *predicted* class):

* clean accuracy ``= mean_i correct_i``;
* certified accuracy at ``eps`` ``= mean_i [correct_i and r_i >= eps]`` (SPEC §4);
* mean certified radius, ``"all"``: ``mean_i correct_i * r_i`` (0 for misclassified points,
  averaged over all ``N``); ``"correct"``: ``mean`` of ``r_i`` over correctly classified points.

Floating point: the certificates are statements about the network in exact arithmetic with
the stored float32 weights. The head's certificate is computed in float64 with its rounding
accounted for by the certifier, and ``r_y / Lip`` is rounded down; the float32 rounding of
the features themselves is not (measured: features within about 1e-6·``||y||`` of a float64
evaluation of the same network, i.e. radii uncertain by roughly 1e-6·``||y||``/``Lip`` in
input units, an absolute amount, a few 1e-6 on the digits models), which matters only for
radii that close to a requested radius.  The same holds for projection pooling, whose
``cos``/``sin`` of the angle are float32 numbers (unit length up to ~1e-7).

Optional PGD check (:mod:`lipcli.host.attacks`) at each radius ``eps``: every point whose
prediction is certified at ``eps`` is attacked at ``eps``; a success within its certified
radius is a SOUNDNESS VIOLATION. Correctly classified points are attacked too, giving the
empirical robust accuracy ``mean_i [correct_i and attack at eps failed]`` (an upper bound
on the true robust accuracy, which the certified accuracy bounds from below).
"""

from __future__ import annotations

import copy
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.numerics.precision import in_full_float32_precision
from lipcli.sdk.specs import SOUND
from lipcli.host.devices import resolve_device
from lipcli.host.outputs import check_model_writable
from lipcli.host.strictjson import strict_json

#: ``progress(stage, done, total)``; stages: "features", "certificate", "attack eps=...",
#: and with ``lipschitz="estimate"`` the power-method estimate's layers
Progress = Callable[[str, int, int], None]

LIPSCHITZ_METHODS = ("bound", "estimate")
ESTIMATE_WARNING = "ESTIMATE (paper convention, not guaranteed)"
BOUND_TEXT = "GUARANTEED upper bound"
RESULTS_KEY = "certify"

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def parse_radii(text: str, unit: float = 255.0) -> list[float]:
    """Parse ``--radii`` into absolute input-space l2 radii (sorted, unique).

    Items are comma separated. A plain number ``v`` means ``v / unit`` (``unit`` 255: pixel
    levels, so ``36`` -> ``36/255``; ``unit`` 1: absolute, ``0.14``). An item ``a/b`` is the
    absolute radius ``a / b`` whatever the unit (``36/255``). Radii must be finite and
    ``>= 0``. Raises :class:`LipUsageError` with the offending item.
    """
    if not math.isfinite(unit) or unit <= 0:
        raise LipUsageError(f"--radius-unit must be a positive number, got {unit!r}")
    items = [item.strip() for item in (text or "").split(",")]
    if not any(items):
        raise LipUsageError("--radii is empty; give comma-separated radii such as 36,72,108")
    out: list[float] = []
    for item in items:
        if not item:
            raise LipUsageError(f"--radii {text!r} has an empty item")
        num, slash, den = item.partition("/")
        try:
            if not _NUMBER.match(num.strip()) or (slash and not _NUMBER.match(den.strip())):
                raise ValueError
            value = float(num) / (float(den) if slash else unit)
        except (ValueError, ZeroDivisionError):
            raise LipUsageError(
                f"bad radius {item!r} in --radii {text!r}; use numbers like 36 or fractions like 36/255"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise LipUsageError(f"radius {item!r} must be finite and >= 0")
        out.append(value)
    return sorted(set(out))


@dataclass
class CertifyOptions:
    """What :func:`run_certification` does (the CLI's options)."""

    radii: list[float]
    radius_unit: float = 255.0
    dataset: str | None = None
    data_dir: str | None = None
    download: bool = False
    split: str = "test"
    limit: int | None = None
    batch_size: int = 256
    device: str = "auto"
    lipschitz: str = "bound"
    lipschitz_iters: int = 50
    top_k: int | None = None
    attack: bool = False
    attack_steps: int = 100
    attack_restarts: int = 2
    write: bool = True
    seed: int = 0
    ignore_class_names: bool = False


@dataclass
class CertifyOutcome:
    """The JSON summary plus per-input arrays (index order of the evaluated split)."""

    summary: dict[str, Any]
    labels: torch.Tensor
    predictions: torch.Tensor
    radius: torch.Tensor  # float64, input space, radius of the predicted class
    violations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def correct(self) -> torch.Tensor:
        return self.predictions == self.labels


class ResultsNotWrittenError(LipError):
    """Certification finished but its results could not be stored in the model file (e.g.
    disk full).  ``outcome`` holds everything that was computed, so that the caller can still
    report it before failing."""

    def __init__(self, message: str, outcome: "CertifyOutcome") -> None:
        super().__init__(message)
        self.outcome = outcome


def _shorten(names: list[str], keep: int = 5) -> str:
    shown = ", ".join(str(n) for n in names[:keep])
    return shown + (f", ... ({len(names)} in all)" if len(names) > keep else "")


def check_class_names(
    recorded: Any, dataset: Any, info: dict[str, Any], model_path: Any, ignore: bool
) -> str | None:
    """Refuse (:class:`LipUsageError`) a data set whose class names differ from the ones the
    model file records (same count, different data: accuracy would be meaningless), unless
    ``ignore``; then return a note.  Nothing is checked when either side has no names."""
    want = recorded.get("classes") if isinstance(recorded, dict) else None
    have = getattr(dataset, "classes", None)
    if not isinstance(want, list) or have is None:
        return None
    want = [str(c) for c in want]
    try:
        have = [str(c) for c in have]
    except TypeError:
        return None
    if want == have:
        return None
    text = (
        f"data set {info['name']!r} has classes [{_shorten(have)}] but {model_path} was trained "
        f"on classes [{_shorten(want)}]"
    )
    if not ignore:
        raise LipUsageError(
            text + "; pass --ignore-class-names to certify on this data anyway"
        )
    return text + " (--ignore-class-names)"


# -- data ----------------------------------------------------------------------------------------
def load_dataset(
    registry: Any,
    recorded: dict[str, Any] | None,
    *,
    name: str | None,
    data_dir: str | None,
    download: bool,
    split: str,
    model_path: str | os.PathLike,
) -> tuple[Any, dict[str, Any]]:
    """Build the evaluation data set from ``--dataset`` or the model file's ``dataset`` slot.

    Returns ``(dataset, info)`` with ``info`` = name, params, split, root, num_classes.
    """
    if name is None:
        if not isinstance(recorded, dict) or not isinstance(recorded.get("name"), str):
            raise LipUsageError(
                f"{model_path} records no data set; pass --dataset NAME (and --data-dir DIR)"
            )
        from lipcli.host.models import recorded_dataset

        # a defective or unknown recorded data set is a defect of the file (exit 1, names it)
        comp = recorded_dataset(model_path, recorded, registry)
    else:
        comp = registry.component("dataset", name)
    spec = comp.spec
    root = data_dir
    if root is None and name is None and isinstance(recorded, dict):
        root = recorded.get("root")
    if root is None and getattr(spec, "needs_root", True):
        raise LipUsageError(f"data set {spec.name!r} needs --data-dir DIR")
    if root is not None and getattr(spec, "needs_root", True) and not download and not Path(root).exists():
        raise LipUsageError(f"--data-dir {root}: no such directory (use --download to fetch)")
    try:
        dataset = comp.build(root, split, download=download, augment=False)
    except LipError:
        raise
    except (FileNotFoundError, NotADirectoryError, KeyError, ValueError) as exc:
        raise LipUsageError(
            f"cannot load data set {spec.name!r} split {split!r} from {root}: {_one_line(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - foreign data set code
        raise LipError(
            f"cannot load data set {spec.name!r} split {split!r} from {root}: {_one_line(exc)}"
        ) from None
    num_classes = spec.num_classes
    if num_classes is None:
        classes = getattr(dataset, "classes", None)
        num_classes = len(classes) if classes is not None else None
    info = {
        "name": spec.name,
        "params": dict(comp.params),
        "split": split,
        "root": None if root is None else str(root),
        "num_classes": num_classes,
    }
    return dataset, info


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def check_compatible(model: nn.Module, dataset: Any, info: dict[str, Any], model_path: Any) -> None:
    """Model/data mismatch (classes, input shape, labels) -> :class:`LipUsageError`."""
    config = model.lipcli_config
    want_classes = int(config["num_classes"])
    if info["num_classes"] is not None and int(info["num_classes"]) != want_classes:
        raise LipUsageError(
            f"data set {info['name']!r} has {info['num_classes']} classes but {model_path} "
            f"was built for {want_classes}"
        )
    if len(dataset) == 0:
        raise LipUsageError(f"data set {info['name']!r} split {info['split']!r} is empty")
    image, label = dataset[0]
    image = torch.as_tensor(image)
    shape = (int(config["in_channels"]), *map(int, config.get("image_size") or (32, 32)))
    if tuple(image.shape) != shape:
        raise LipUsageError(
            f"data set {info['name']!r} gives images of shape {tuple(image.shape)} but "
            f"{model_path} expects {shape}"
        )


# -- main ----------------------------------------------------------------------------------------
def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _stack(dataset: Any, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = [], []
    for i in indices:
        img, lab = dataset[i]
        images.append(torch.as_tensor(img, dtype=torch.float32))
        labels.append(int(lab))
    return torch.stack(images), torch.tensor(labels, dtype=torch.long)


def _check_options(options: CertifyOptions) -> None:
    """Usage errors in ``options`` (before any work)."""
    if options.lipschitz not in LIPSCHITZ_METHODS:
        raise LipUsageError(f"--lipschitz must be one of {', '.join(LIPSCHITZ_METHODS)}")
    if options.batch_size < 1:
        raise LipUsageError("--batch-size must be >= 1")
    if options.limit is not None and options.limit < 1:
        raise LipUsageError("--limit must be >= 1")
    if options.top_k is not None and options.top_k < 1:
        raise LipUsageError("--top-k must be >= 1")
    if options.attack and (options.attack_steps < 1 or options.attack_restarts < 1):
        raise LipUsageError("--attack-steps and --attack-restarts must be >= 1")
    if options.lipschitz_iters < 1:
        raise LipUsageError(f"--lipschitz-iters must be >= 1, got {options.lipschitz_iters}")
    if not options.radii:
        raise LipUsageError("no radii given")


@dataclass
class _Features:
    """Step 2: features ``y = g(x)`` (float32, CPU), labels and the forward pass's predictions."""

    features: torch.Tensor
    labels: torch.Tensor
    forward_predictions: torch.Tensor


def _extract_features(
    model: nn.Module, dataset: Any, n: int, batch_size: int, device: torch.device,
    dataset_name: str, report: Progress,
) -> _Features:
    num_classes = int(model.lipcli_config["num_classes"])
    feats, labels_list, fwd_preds = [], [], []
    with torch.no_grad():
        for start, stop in _batches(n, batch_size):
            images, labels = _stack(dataset, list(range(start, stop)))
            if bool(((labels < 0) | (labels >= num_classes)).any()):
                raise LipUsageError(
                    f"data set {dataset_name!r} has labels outside 0..{num_classes - 1}"
                )
            y = model.features(images.to(device))
            feats.append(y.float().cpu())
            fwd_preds.append(model.head(y).argmax(1).cpu())
            labels_list.append(labels)
            report("features", stop, n)
    features = torch.cat(feats)
    if not bool(torch.isfinite(features).all()):
        raise LipError("the model produced non-finite features; cannot certify")
    return _Features(features, torch.cat(labels_list), torch.cat(fwd_preds))


@dataclass
class _CertificateRun:
    """Step 3: the head's certificate on the features (feature-space radii) and its cache."""

    name: str
    component: Any
    certifier: Any
    result: Any  # lipcli.sdk.certificates.CertifyResult
    cache: Any
    cache_before: Any  # snapshot of the file's cache slot, to detect changes

    @property
    def promises_sound(self) -> bool:
        return SOUND in getattr(self.component.spec, "promises", ()) or SOUND in getattr(
            self.certifier, "promises", ()
        )


def _certify_features(
    reg: Any, model: nn.Module, file_cache: dict[str, Any], features: torch.Tensor,
    options: CertifyOptions, device: torch.device, report: Progress, times: dict[str, float],
) -> _CertificateRun:
    from lipcli.sdk.certificates import CertifyResult

    name = reg.get("head", model.lipcli_config["head"]["name"]).certificate
    component = reg.component("certificate", name)
    certifier = component.build()
    old_cache = file_cache.get(name)
    # certifiers may grow the cache dict in place: compare against a snapshot
    snapshot = copy.deepcopy(old_cache)
    t0 = time.perf_counter()
    head = model.head
    cache = certifier.prepare(head, copy.deepcopy(old_cache))
    times["certificate_prepare"] = time.perf_counter() - t0
    results = []
    n = features.shape[0]
    for start, stop in _batches(n, options.batch_size):
        results.append(certifier.certify(head, features[start:stop].to(device), top_k=options.top_k))
        report("certificate", stop, n)
    result = CertifyResult.concatenate(results)
    cache = getattr(certifier, "cache", None) or cache
    times["certificate"] = time.perf_counter() - t0
    return _CertificateRun(name, component, certifier, result, cache, snapshot)


@dataclass
class _LipschitzConstant:
    """Step 4: ``Lip(g)`` used for the radii, with the guaranteed bound always computed."""

    value: float
    bound: float
    estimate: float | None
    fingerprint: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value) and self.value > 0):
            raise LipError(f"invalid Lipschitz constant {self.value!r}")


def _lipschitz_constant(
    model: nn.Module, stored: Any, options: CertifyOptions, notes: list[str], report: Progress,
) -> _LipschitzConstant:
    """The fresh guaranteed bound; with ``lipschitz="estimate"`` the power estimate (read from
    the file's ``lipschitz`` slot when it was made for the same weights and iterations)."""
    from lipcli.host.lipschitz import guaranteed_upper_bound, lipschitz_report, weights_fingerprint

    fingerprint = weights_fingerprint(model)
    bound, _ = guaranteed_upper_bound(model)
    stored = stored if isinstance(stored, dict) else {}
    same_weights = stored.get("weights_sha256") == fingerprint
    estimate = None
    if options.lipschitz == "estimate":
        if (
            same_weights and stored.get("estimate_iters") == options.lipschitz_iters
            and isinstance(stored.get("estimate"), (int, float))
        ):
            estimate = float(stored["estimate"])
            notes.append("Lipschitz estimate read from the model file (same weights)")
        else:
            estimate = lipschitz_report(
                model, estimate=True, iters=options.lipschitz_iters, progress=report
            )["estimate"]
    if (
        same_weights and isinstance(stored.get("upper_bound"), (int, float))
        and not math.isclose(float(stored["upper_bound"]), bound, rel_tol=1e-6)
    ):
        notes.append(
            f"the Lipschitz bound stored in the model file ({stored['upper_bound']:.9g}) "
            f"differs from the fresh one ({bound:.9g}); the fresh one is used"
        )
    value = float(estimate) if estimate is not None else bound
    return _LipschitzConstant(value, bound, estimate, fingerprint)


def _input_radii(feature_radius: torch.Tensor, lipschitz: float) -> torch.Tensor:
    """Step 5: ``r_y / Lip`` rounded down by one ulp (an infinite certificate stays infinite,
    not the largest double)."""
    quotient = feature_radius / lipschitz
    return torch.where(
        torch.isinf(quotient), quotient, torch.nextafter(quotient, torch.zeros_like(quotient))
    )


def _certified_rows(
    correct: torch.Tensor, radius: torch.Tensor, options: CertifyOptions,
) -> list[dict[str, Any]]:
    """Certified accuracy at each requested radius (see the module docstring)."""
    n = correct.shape[0]
    rows = []
    for eps in options.radii:
        cert = correct & (radius >= eps)
        rows.append({
            "radius": eps,
            "radius_units": eps * options.radius_unit,
            "certified_accuracy": int(cert.sum()) / n,
            "certified": int(cert.sum()),
        })
    return rows


def _mean_certified_radius(correct: torch.Tensor, radius: torch.Tensor) -> dict[str, Any]:
    masked = torch.where(correct, radius, torch.zeros_like(radius))
    return {
        "all": float(masked.mean()),  # may be inf: --json writes "inf" (strict JSON)
        "correct": float(radius[correct].mean()) if bool(correct.any()) else 0.0,
        "definition": (
            "input-space l2; 'all': mean over all points of the certified radius, 0 for "
            "misclassified points; 'correct': mean over correctly classified points"
        ),
    }


def _soundness_note(guaranteed: bool, cert: _CertificateRun, options: CertifyOptions) -> str | None:
    """Why a run is not a guaranteed certificate (``None`` when it is)."""
    reasons = []
    if not guaranteed:
        reasons.append(f"Lipschitz {ESTIMATE_WARNING}")
    if not cert.result.exact_classes:
        reasons.append(f"top-{options.top_k} classes heuristic")
    if not cert.promises_sound:
        reasons.append(f"certificate {cert.name!r} does not promise soundness")
    return "NOT a guaranteed certificate: " + "; ".join(reasons) if reasons else None


def _store_results(
    model_path: str | os.PathLike, metadata: dict[str, Any], cert: _CertificateRun,
    file_cache: dict[str, Any], outcome: CertifyOutcome,
) -> None:
    """Write ``results["certify"]`` (and a changed certificate cache) into the model file;
    sets ``summary["written"]``.  A failed write raises :class:`ResultsNotWrittenError`
    carrying the finished outcome."""
    from lipcli.host.modelfile import update_metadata

    summary = outcome.summary
    updates: dict[str, Any] = {}
    if isinstance(cert.cache, dict) and cert.cache != cert.cache_before:
        file_cache[cert.name] = cert.cache
        updates["cache"] = file_cache
    stored_results = metadata.get("results")
    stored_results = dict(stored_results) if isinstance(stored_results, dict) else {}
    stored_results[RESULTS_KEY] = strict_json(summary)
    updates["results"] = stored_results
    summary["written"] = []
    try:
        update_metadata(model_path, updates)
    except (LipError, OSError) as exc:
        text = str(exc) if isinstance(exc, LipError) else f"cannot write {model_path}: {exc.strerror or exc}"
        raise ResultsNotWrittenError(
            f"{text} (the results were not stored in the model file)", outcome
        ) from None
    summary["written"] = sorted(updates)


@in_full_float32_precision
def run_certification(
    model_path: str | os.PathLike,
    options: CertifyOptions,
    *,
    registry: Any = None,
    progress: Progress | None = None,
) -> CertifyOutcome:
    """Certify the model in ``model_path`` (see the module docstring). Writes the summary to
    the file's ``results["certify"]`` and the certificate cache to ``cache[<name>]`` unless
    ``options.write`` is false or an attack found a soundness violation.  Runs with TF32
    disabled (:mod:`lipcli.numerics.precision`)."""
    from lipcli.host.lipschitz import BOUND_LABEL
    from lipcli.host.models import load_model
    from lipcli.host.plugins import get_registry

    report = progress or (lambda stage, done, total: None)
    _check_options(options)
    device = resolve_device(options.device)
    if options.write:
        check_model_writable(model_path)
    reg = registry or get_registry()
    times: dict[str, float] = {}
    t_start = time.perf_counter()

    # -- 1. model and data set -------------------------------------------------------------------
    t0 = time.perf_counter()
    model, mf = load_model(model_path, registry=reg, device=device)
    model.eval()
    config = model.lipcli_config
    times["load"] = time.perf_counter() - t0
    notes: list[str] = []
    dataset, ds_info = load_dataset(
        reg, mf.metadata.get("dataset"), name=options.dataset, data_dir=options.data_dir,
        download=options.download, split=options.split, model_path=model_path,
    )
    recorded = mf.metadata.get("dataset")
    if options.dataset is not None and isinstance(recorded, dict) and recorded.get("name") not in (
        None, ds_info["name"]
    ):
        notes.append(f"model was trained on {recorded.get('name')!r}, evaluated on {ds_info['name']!r}")
    check_compatible(model, dataset, ds_info, model_path)
    class_note = check_class_names(recorded, dataset, ds_info, model_path, options.ignore_class_names)
    if class_note:
        notes.append(class_note)
    n = len(dataset) if options.limit is None else min(options.limit, len(dataset))
    ds_info["size"] = n
    ds_info["limit"] = options.limit

    # -- 2. features (float32, eval mode) --------------------------------------------------------
    from lipcli.host.promises import capture_inputs, verify_promises

    t0 = time.perf_counter()
    with capture_inputs(model) as layer_inputs:  # for the promise check below
        feats = _extract_features(model, dataset, n, options.batch_size, device, ds_info["name"], report)
    times["features"] = time.perf_counter() - t0
    # -- 2b. every layer counted as 1 by its promise, measured with the trained parameters at
    #    the first data points (lipcli.host.promises; a broken promise is an error) ----------------
    promises = verify_promises(model, inputs=layer_inputs).to_json()
    times["promises"] = promises["time_s"]

    # -- 3. certificate (feature space) ----------------------------------------------------------
    file_cache = mf.metadata.get("cache")
    file_cache = dict(file_cache) if isinstance(file_cache, dict) else {}
    cert = _certify_features(reg, model, file_cache, feats.features, options, device, report, times)
    predictions = cert.result.predictions.cpu().long()
    differ = int((predictions != feats.forward_predictions).sum())
    if differ:
        notes.append(
            f"{differ} inputs where the float32 forward pass and the float64 certifier predict "
            "different classes (near ties); the certifier's predictions are used"
        )

    # -- 4. Lipschitz constant of g (normalisation included) -------------------------------------
    t0 = time.perf_counter()
    lip = _lipschitz_constant(model, mf.metadata.get("lipschitz"), options, notes, report)
    times["lipschitz"] = time.perf_counter() - t0

    # -- 5. input-space radii and certified accuracy ---------------------------------------------
    radius = _input_radii(cert.result.radius.cpu().double(), lip.value)
    labels = feats.labels
    correct = predictions == labels
    rows = _certified_rows(correct, radius, options)

    # -- PGD check -------------------------------------------------------------------------------
    violations: list[dict[str, Any]] = []
    attack_info = None
    if options.attack:
        t0 = time.perf_counter()
        violations, attack_info = _attack_radii(
            model, dataset, predictions, correct, radius, options, rows, device, report
        )
        times["attack"] = time.perf_counter() - t0

    times["total"] = time.perf_counter() - t_start
    guaranteed = options.lipschitz == "bound"
    cres = cert.result
    n_correct = int(correct.sum())
    summary: dict[str, Any] = {
        "model": str(model_path),
        "weights_sha256": lip.fingerprint,
        "arch": config["arch"]["name"],
        "head": config["head"]["name"],
        "dataset": ds_info,
        "device": str(device),
        "certificate": {
            "name": cert.name,
            "provider": cert.component.provider,
            "promises_sound": cert.promises_sound,
            "classes": (
                "all classes (exact)" if cres.exact_classes
                else f"top-{options.top_k} other classes (HEURISTIC, not a certificate)"
            ),
            "exact_classes": bool(cres.exact_classes),
            "top_k": options.top_k,
            "notes": list(cres.notes),
            "stats": cres.stats,
        },
        "lipschitz": {
            "method": options.lipschitz,
            "value": lip.value,
            "guaranteed": guaranteed,
            "label": BOUND_TEXT if guaranteed else ESTIMATE_WARNING,
            "upper_bound": lip.bound,
            "upper_bound_label": BOUND_LABEL,
            "estimate": lip.estimate,
            "includes_normalization": True,
        },
        "sound": bool(guaranteed and cres.exact_classes and cert.promises_sound),
        "total": n,
        "correct": n_correct,
        "clean_accuracy": n_correct / n,
        "radius_unit": options.radius_unit,
        "radii": rows,
        "mean_certified_radius": _mean_certified_radius(correct, radius),
        "attack": attack_info,
        "violations": len(violations),
        "promises": promises,
        "time_s": times,
        "notes": notes,
    }
    unsound = _soundness_note(guaranteed, cert, options)
    if unsound:
        summary["notes"].append(unsound)
    outcome = CertifyOutcome(
        summary=summary, labels=labels, predictions=predictions, radius=radius,
        violations=violations,
    )
    if options.write and not violations:
        _store_results(model_path, mf.metadata, cert, file_cache, outcome)
    else:
        summary["written"] = []
    return outcome


def _attack_radii(
    model: nn.Module,
    dataset: Any,
    predictions: torch.Tensor,
    correct: torch.Tensor,
    radius: torch.Tensor,
    options: CertifyOptions,
    rows: list[dict[str, Any]],
    device: torch.device,
    report: Progress,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """PGD at every radius (see the module docstring); fills ``rows`` in place."""
    from lipcli.host.attacks import pgd_l2

    for p in model.parameters():
        p.requires_grad_(False)
    n = predictions.shape[0]
    broken = torch.zeros(n, dtype=torch.bool)  # attack succeeded at some smaller radius
    violations: list[dict[str, Any]] = []
    for row in rows:
        eps = row["radius"]
        target = (~broken) & (correct | (radius >= eps))
        idx = target.nonzero().squeeze(1).tolist()
        stage = f"attack eps={row['radius_units']:g}"
        report(stage, 0, len(idx))
        for bstart, bstop in _batches(len(idx), options.batch_size):
            chunk = idx[bstart:bstop]
            images, _ = _stack(dataset, chunk)
            images = images.to(device)
            preds = predictions[chunk].to(device)
            res = pgd_l2(
                model, images, preds, eps, steps=options.attack_steps,
                restarts=options.attack_restarts, seed=options.seed + bstart,
            )
            success = res.success.cpu()
            dist = res.distance.cpu()
            for j, i in enumerate(chunk):
                if not bool(success[j]):
                    continue
                broken[i] = True
                if float(dist[j]) <= float(radius[i]):
                    violations.append({
                        "index": i, "radius": eps, "certified_radius": float(radius[i]),
                        "attack_distance": float(dist[j]), "margin": float(res.margin[j]),
                    })
            report(stage, bstop, len(idx))
        row["attacked"] = len(idx)
        row["empirical_robust_accuracy"] = int((correct & ~broken).sum()) / n
        row["violations"] = sum(1 for v in violations if v["radius"] == eps)
    info = {
        "steps": options.attack_steps,
        "restarts": options.attack_restarts,
        "norm": "l2",
        "box": [0.0, 1.0],
        "violations": len(violations),
        "violation_examples": violations[:5],
    }
    return violations, info
