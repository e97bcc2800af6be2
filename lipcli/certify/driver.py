"""The certification driver :func:`run_certification` (pipeline in the package docstring)."""

from __future__ import annotations

import os
import time
from typing import Any

from lipcli.certify.attack import attack_radii
from lipcli.certify.data import check_class_names, check_compatible, limit_subset, load_dataset
from lipcli.certify.options import CertifyOptions
from lipcli.certify.results import (
    BOUND_TEXT,
    ESTIMATE_WARNING,
    AttackInfo,
    CertificateUsed,
    CertifyOutcome,
    CertifySummary,
    LipschitzUsed,
    ResultsNotWrittenError,
    Violation,
)
from lipcli.certify.steps import (
    CertificateRun,
    Progress,
    certified_rows,
    certify_features,
    extract_features,
    input_radii,
    lipschitz_constant,
    mean_certified_radius,
    soundness_note,
)
from lipcli._util.devices import resolve_device
from lipcli._util.outputs import check_model_writable
from lipcli._util.strictjson import strict_json
from lipcli.numerics.precision import in_full_float32_precision
from lipcli.sdk.errors import LipError
from lipcli.host.modelfile import update_metadata, update_results_locked
from lipcli.host.plugins import get_registry
from lipcli.lipschitz.bound import BOUND_LABEL
from lipcli.lowering.network import lowered_network
from lipcli.lipschitz.promises import capture_inputs, verify_promises
from lipcli.host.models import load_model

#: the model file's ``results`` key holding the summary
RESULTS_KEY = "certify"
#: the ``results`` key listing the summaries of distinct certifications (oldest first; a run
#: of the same evaluation replaces its record), so that concurrent runs all keep theirs
HISTORY_KEY = "certify_runs"
MAX_HISTORY = 16


def evaluation_key(record: Any) -> str:
    """What makes two stored certifications the same evaluation: the weights, the data
    (name, parameters, split, points, limit), the certificate, the Lipschitz constant, the
    radii and the attack settings."""
    import json

    if not isinstance(record, dict):
        return ""
    ds = record.get("dataset") if isinstance(record.get("dataset"), dict) else {}
    cert = record.get("certificate") if isinstance(record.get("certificate"), dict) else {}
    lip = record.get("lipschitz") if isinstance(record.get("lipschitz"), dict) else {}
    attack = record.get("attack") if isinstance(record.get("attack"), dict) else {}
    key = [record.get("weights_sha256"), [ds.get(k) for k in ("name", "params", "split", "size", "limit")],
           cert.get("name"), cert.get("top_k"), lip.get("method"),
           [r.get("radius") for r in record.get("radii") or [] if isinstance(r, dict)],
           [attack.get(k) for k in ("steps", "restarts")]]
    return json.dumps(key, sort_keys=True, default=str)


def _with_history(results: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """``results`` with ``record`` as the latest certification and in the history."""
    history = results.get(HISTORY_KEY)
    history = [r for r in history if isinstance(r, dict)] if isinstance(history, list) else []
    key = evaluation_key(record)
    history = [r for r in history if evaluation_key(r) != key] + [record]
    return {**results, RESULTS_KEY: record, HISTORY_KEY: history[-MAX_HISTORY:]}


def _store_results(
    model_path: str | os.PathLike, weights_sha256: str, cert: CertificateRun, outcome: CertifyOutcome,
) -> None:
    """Write ``results["certify"]`` (and a changed certificate cache) into the model file;
    sets ``summary.written``.  Under the model file's lock the file is read again: the slots
    are merged into what it holds now (another write-back meanwhile is kept), and nothing is
    written when its weights are no longer those certified (``weights_sha256``: replaced
    during the run).  A failed write raises :class:`ResultsNotWrittenError` carrying the
    finished outcome."""
    summary = outcome.summary
    record = strict_json(summary.to_json())
    changed = isinstance(cert.cache, dict) and cert.cache != cert.cache_before

    def merge(metadata: dict[str, Any]) -> dict[str, Any]:
        updates: dict[str, Any] = {}
        if changed:
            cache = metadata.get("cache")
            updates["cache"] = {**(cache if isinstance(cache, dict) else {}), cert.name: cert.cache}
        results = metadata.get("results")
        updates["results"] = _with_history(results if isinstance(results, dict) else {}, record)
        return updates

    summary.written = []
    try:
        written = update_results_locked(model_path, merge, weights_sha256=weights_sha256,
                                        what="certification")
    except (LipError, OSError) as exc:
        text = str(exc) if isinstance(exc, LipError) else f"cannot write {model_path}: {exc.strerror or exc}"
        if "results not written" not in text:
            text += " (the results were not stored in the model file)"
        raise ResultsNotWrittenError(text, outcome) from None
    summary.written = sorted(written)


@in_full_float32_precision
def run_certification(
    model_path: str | os.PathLike,
    options: CertifyOptions,
    *,
    registry: Any = None,
    progress: Progress | None = None,
) -> CertifyOutcome:
    """Certify the model in ``model_path`` (see the package docstring). Writes the summary to
    the file's ``results["certify"]`` and the certificate cache to ``cache[<name>]`` unless
    ``options.write`` is false or an attack found a soundness violation.  Runs with TF32
    disabled (:mod:`lipcli.numerics.precision`)."""

    report = progress or (lambda stage, done, total: None)
    options.check()
    device = resolve_device(options.device)
    if options.write:
        check_model_writable(model_path, hint="certify without writing them to leave the file unchanged")
    reg = registry or get_registry()
    times: dict[str, float] = {}
    t_start = time.perf_counter()

    # -- 1. model and data set -------------------------------------------------------------------
    t0 = time.perf_counter()
    model, mf = load_model(model_path, registry=reg, device=device)
    model.eval()
    from lipcli.host.modelfile import tensors_fingerprint

    loaded_sha256 = tensors_fingerprint(mf.tensors)  # the weights certified (checked before the write)
    config = model.lipcli_config
    times["load"] = time.perf_counter() - t0
    notes: list[str] = []
    recorded = mf.metadata.get("dataset")
    dataset, ds_info = load_dataset(
        reg, recorded, name=options.dataset, data_dir=options.data_dir,
        download=options.download, split=options.split, model_path=model_path,
    )
    if options.dataset is not None and isinstance(recorded, dict) and recorded.get("name") not in (
        None, ds_info.name
    ):
        notes.append(f"model was trained on {recorded.get('name')!r}, evaluated on {ds_info.name!r}")
    check_compatible(model, dataset, ds_info, model_path)
    class_note = check_class_names(recorded, dataset, ds_info, model_path, options.ignore_class_names)
    if class_note:
        notes.append(class_note)
    n = len(dataset) if options.limit is None else min(options.limit, len(dataset))
    ds_info.size = n
    ds_info.limit = options.limit
    dataset, indices = limit_subset(dataset, n, notes)  # indices: None for the whole split

    # -- 2. features (float32, eval mode), by the eval lowering (lipcli.lowering:
    #    dense matrices where cheaper, built once per model and input shape) ------------------------
    t0 = time.perf_counter()
    network = lowered_network(model, tuple(dataset[0][0].shape), dense_max_mib=options.dense_max_mib,
                              series=options.series, inputs=options.eval_inputs(n))
    times["lowering"] = time.perf_counter() - t0
    if network.dense_layers:
        notes.append(
            f"eval lowering: {len(network.dense_layers)} layers run as dense float32 matrices "
            f"(cap {network.dense_max_mib:g} MiB per layer, built in {times['lowering']:.1f} s "
            "where that pays off on this run's inputs); the Lipschitz bound covers them"
        )

    t0 = time.perf_counter()
    with capture_inputs(model) as layer_inputs:  # for the promise check below
        feats = extract_features(model, dataset, n, options.batch_size, device, ds_info.name, report,
                                 network)
    times["features"] = time.perf_counter() - t0
    # -- 2b. every layer counted as 1 by its promise, measured with the trained parameters at
    #    the first data points (lipcli.lipschitz.promises; a broken promise is an error) ----------------
    promises = verify_promises(model, inputs=layer_inputs)
    times["promises"] = promises.time_s

    # -- 3. certificate (feature space) ----------------------------------------------------------
    file_cache = mf.metadata.get("cache")
    file_cache = dict(file_cache) if isinstance(file_cache, dict) else {}
    cert = certify_features(reg, model, file_cache, feats.features, options, device, report, times)
    predictions = cert.result.predictions.cpu().long()
    differ = int((predictions != feats.forward_predictions).sum())
    if differ:
        notes.append(
            f"{differ} inputs where the float32 forward pass and the float64 certifier predict "
            "different classes (near ties); the certifier's predictions are used"
        )

    # -- 4. Lipschitz constant of g (normalisation included) -------------------------------------
    t0 = time.perf_counter()
    lip = lipschitz_constant(model, mf.metadata.get("lipschitz"), options, notes, report, network)
    times["lipschitz"] = time.perf_counter() - t0

    # -- 5. input-space radii and certified accuracy ---------------------------------------------
    radius = input_radii(cert.result.radius.cpu().double(), lip.value)
    labels = feats.labels
    correct = predictions == labels
    rows = certified_rows(correct, radius, options)

    # -- PGD check -------------------------------------------------------------------------------
    violations: list[Violation] = []
    attack_info: AttackInfo | None = None
    if options.attack:
        t0 = time.perf_counter()
        violations, attack_info = attack_radii(
            network, dataset, predictions, correct, radius, options, rows, device, report
        )
        times["attack"] = time.perf_counter() - t0
        for v in violations if indices is not None else ():
            v.index = indices[v.index]  # the point's index in the split

    times["total"] = time.perf_counter() - t_start
    guaranteed = options.lipschitz == "bound"
    cres = cert.result
    n_correct = int(correct.sum())
    summary = CertifySummary(
        model=str(model_path),
        weights_sha256=lip.fingerprint,
        arch=config["arch"]["name"],
        head=config["head"]["name"],
        dataset=ds_info,
        device=str(device),
        certificate=CertificateUsed(
            name=cert.name,
            provider=cert.component.provider,
            promises_sound=cert.promises_sound,
            classes=(
                "all classes (exact)" if cres.exact_classes
                else f"top-{options.top_k} other classes (HEURISTIC, not a certificate)"
            ),
            exact_classes=bool(cres.exact_classes),
            top_k=options.top_k,
            notes=list(cres.notes),
            stats=cres.stats,
        ),
        lipschitz=LipschitzUsed(
            method=options.lipschitz,
            value=lip.value,
            guaranteed=guaranteed,
            label=BOUND_TEXT if guaranteed else ESTIMATE_WARNING,
            upper_bound=lip.bound,
            upper_bound_label=BOUND_LABEL,
            estimate=lip.estimate,
            dense_layers=list(network.dense_layers),
        ),
        sound=bool(guaranteed and cres.exact_classes and cert.promises_sound),
        total=n,
        correct=n_correct,
        clean_accuracy=n_correct / n,
        radius_unit=options.radius_unit,
        radii=rows,
        mean_certified_radius=mean_certified_radius(correct, radius),
        attack=attack_info,
        violations=len(violations),
        promises=promises,
        time_s=times,
        notes=notes,
    )
    unsound = soundness_note(guaranteed, cert, options)
    if unsound:
        summary.notes.append(unsound)
    outcome = CertifyOutcome(
        summary=summary, labels=labels, predictions=predictions, radius=radius,
        violations=violations, indices=indices,
    )
    if options.write and not violations:
        _store_results(model_path, loaded_sha256, cert, outcome)
    else:
        summary.written = []
    return outcome
