"""The certification driver :func:`run_certification` (pipeline in the package docstring)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.certify.attack import attack_radii
from lipcli.certify.exact import EXACT_NOTE, float64_network
from lipcli.certify.data import check_class_names, check_compatible, limit_subset, load_dataset, stack
from lipcli.compiling import compiled_or_none
from lipcli.certify.options import CertifyOptions
from lipcli.certify.results import (
    AttackInfo,
    CertificateRun,
    CertifyOutcome,
    CertifySummary,
    EvalDataset,
    RadiusRow,
    ResultsNotWrittenError,
    Violation,
)
from lipcli.certify.steps import (
    Features,
    Progress,
    certified_rows,
    certify_features,
    extract_features,
    input_radii,
    lipschitz_constant,
    mean_certified_radius,
)
from lipcli._util.devices import resolve_device
from lipcli._util.outputs import check_model_writable
from lipcli._util.strictjson import strict_json
from lipcli.numerics.precision import in_full_float32_precision
from lipcli.sdk.errors import LipError, memory_step
from lipcli.host.modelfile import ModelFile, tensors_fingerprint, update_results_locked
from lipcli.host.plugins import Registry, get_registry
from lipcli.lowering.network import lowered_network
from lipcli.lipschitz.promises import PromiseCheck, capture_inputs, verify_promises
from lipcli.host.models import load_model

#: the data points whose layer inputs the promise check measures (capture_inputs' default)
PROMISE_POINTS = 8
#: the model file's ``results`` key holding the summary
RESULTS_KEY = "certify"
#: the ``results`` key listing the summaries of distinct certifications (oldest first; a run
#: of the same evaluation replaces its record), so that concurrent runs all keep theirs
HISTORY_KEY = "certify_runs"
MAX_HISTORY = 16


#: per step of :func:`run_certification`: the settings that size its memory and what to do when
#: it runs out (templates of :func:`lipcli.sdk.errors.memory_step`); nothing has been written then
_KEEP = "; the model file is unchanged"
_SIZED = {
    "lowering": ("{dense_max_mib} (the dense layers' size) and the model's width",
                 "lower {dense_max_mib} (0: no dense layer) or use {exact}" + _KEEP),
    "batch": ("{batch_size}", "lower {batch_size} and run again" + _KEEP),
    "lipschitz": ("the model's width and {lipschitz_iters}",
                  "run it where more memory is free (or with a lower {lipschitz_iters})" + _KEEP),
    "attack": ("{batch_size} and {attack_restarts}",
               "lower {batch_size} or {attack_restarts} and run again" + _KEEP),
}


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
           [attack.get(k) for k in ("steps", "restarts")], bool(record.get("exact"))]
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


@dataclass
class _Evaluation:
    """Step 1 of :func:`run_certification`: the model, its file and the evaluation data."""

    model: nn.Module
    mf: ModelFile
    loaded_sha256: str  # the weights certified (checked again before the write)
    dataset: Any
    ds_info: EvalDataset
    n: int
    indices: list[int] | None  # the points' indices in the split (None: the whole split)


def _load(
    model_path: str | os.PathLike, options: CertifyOptions, reg: Registry, device: torch.device,
    times: dict[str, float], notes: list[str], loaded: Any = None,
) -> _Evaluation:
    """Step 1: the model (eval mode, on ``device``) and the data set, checked against each
    other; ``loaded``: ``(model, model file, (dataset, info) or None)`` a caller already holds
    (the model carrying exactly the file's tensors: ``lip import --compare``)."""
    t0 = time.perf_counter()
    model, mf, data = loaded if loaded is not None else (*load_model(model_path, registry=reg, device=device), None)
    model.to(device).eval()
    loaded_sha256 = tensors_fingerprint(mf.tensors)
    times["load"] = time.perf_counter() - t0
    recorded = mf.metadata.get("dataset")
    dataset, ds_info = data if data is not None else load_dataset(
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
    return _Evaluation(model, mf, loaded_sha256, dataset, ds_info, n, indices)


def _lower(ev: _Evaluation, options: CertifyOptions, times: dict[str, float],
           notes: list[str]) -> tuple[nn.Module, Any]:
    """Step 2a: ``(model that runs, network)`` computing the features: the eval lowering
    (lipcli.lowering: dense matrices where cheaper, built once per model and input
    shape), or with ``options.exact`` a float64 copy with every layer literal
    (lipcli.certify.exact)."""
    model, dataset, n = ev.model, ev.dataset, ev.n
    t0 = time.perf_counter()
    shape = tuple(dataset[0][0].shape)
    run_model, network = float64_network(model) if options.exact else (model, lowered_network(
        model, shape, dense_max_mib=options.dense_max_mib, series=options.series,
        inputs=options.eval_inputs(n)))
    notes.extend([EXACT_NOTE] if options.exact else [])
    times["lowering"] = time.perf_counter() - t0
    if network.dense_layers:
        notes.append(
            f"eval lowering: {len(network.dense_layers)} layers run as dense float32 matrices "
            f"(cap {network.dense_max_mib:g} MiB per layer, built in {times['lowering']:.1f} s "
            "where that pays off on this run's inputs); the Lipschitz bound covers them"
        )
    return run_model, network


def _features(
    ev: _Evaluation, run_model: nn.Module, network: Any, options: CertifyOptions, device: torch.device, report: Progress,
    times: dict[str, float], notes: list[str],
) -> tuple[Features, PromiseCheck]:
    """Step 2b: the features (float32, eval mode) by ``network``, and every layer counted as 1
    by its promise measured with the trained parameters at the first data points
    (lipcli.lipschitz.promises; a broken promise is an error)."""
    t0 = time.perf_counter()
    compiled = None if options.exact else compiled_or_none(
        network.features, options.compile, options.compile_mode, device, "the certification feature pass")
    if compiled is None:
        with capture_inputs(run_model) as layer_inputs:  # for the promise check below
            feats = extract_features(run_model, ev.dataset, ev.n, options.batch_size, device, ev.ds_info.name,
                                     report, network)
    else:  # the promised layers' inputs from an eager pass over the first points
        with capture_inputs(run_model) as layer_inputs, torch.no_grad():
            network.features(stack(ev.dataset, list(range(min(ev.n, PROMISE_POINTS))))[0].to(device))
        with compiled.measure():
            feats = extract_features(run_model, ev.dataset, ev.n, options.batch_size, device,
                                     ev.ds_info.name, report, network, features=compiled)
        times["compile"] = compiled.compile_s
        notes.append(f"features computed by torch.compile (mode {compiled.mode}; {compiled.compile_s:.1f} s "
                     "of compiling in the feature time); the Lipschitz bound from the stored weights")
    times["features"] = time.perf_counter() - t0
    promises = verify_promises(run_model, inputs=layer_inputs)
    times["promises"] = promises.time_s
    return feats, promises


def _certificate(
    ev: _Evaluation, reg: Registry, run_model: nn.Module, feats: Features, options: CertifyOptions, device: torch.device,
    report: Progress, times: dict[str, float], notes: list[str],
) -> tuple[CertificateRun, torch.Tensor]:
    """Step 3: the head's certificate in feature space and its predictions."""
    file_cache = ev.mf.metadata.get("cache")
    file_cache = dict(file_cache) if isinstance(file_cache, dict) else {}
    cert = certify_features(reg, run_model, file_cache, feats.features, options, device, report, times)
    if options.exact:  # the file's cache is for the float32 head: leave it as it is
        cert.cache = cert.cache_before
    predictions = cert.result.predictions.cpu().long()
    differ = int((predictions != feats.forward_predictions).sum())
    if differ:
        notes.append(
            f"{differ} inputs where the float32 forward pass and the float64 certifier predict "
            "different classes (near ties); the certifier's predictions are used"
        )
    return cert, predictions


def _attack(
    ev: _Evaluation, network: Any, predictions: torch.Tensor, correct: torch.Tensor,
    radius: torch.Tensor, rows: list[RadiusRow], options: CertifyOptions, device: torch.device,
    report: Progress, times: dict[str, float], notes: list[str],
) -> tuple[list[Violation], AttackInfo | None]:
    """The PGD check (when ``options.attack``): violations indexed in the split."""
    if not options.attack:
        return [], None
    t0 = time.perf_counter()
    attack_network = network if options.exact else lowered_network(  # lowered for its own passes
        ev.model, tuple(ev.dataset[0][0].shape), dense_max_mib=options.dense_max_mib, series=options.series,
        inputs=options.attack_inputs(ev.n))
    if attack_network.dense_layers != network.dense_layers:
        notes.append(f"PGD check: {len(attack_network.dense_layers)} layers ran as dense float32 "
                     "matrices (lowered for the attack's passes; the radii do not depend on it)")
    violations, attack_info = attack_radii(
        attack_network, ev.dataset, predictions, correct, radius, options, rows, device, report
    )
    times["attack"] = time.perf_counter() - t0
    for v in violations if ev.indices is not None else ():
        v.index = ev.indices[v.index]  # the point's index in the split
    return violations, attack_info


@in_full_float32_precision
def run_certification(
    model_path: str | os.PathLike,
    options: CertifyOptions,
    *,
    registry: Registry | None = None,
    progress: Progress | None = None,
    loaded: Any = None,
) -> CertifyOutcome:
    """Certify the model in ``model_path`` (see the package docstring; ``loaded``: the model,
    its model file and data a caller already holds, :func:`_load`). Writes the summary to
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
    notes: list[str] = []
    t_start = time.perf_counter()
    ev = _load(model_path, options, reg, device, times, notes, loaded)  # 1. model and data set
    with memory_step("eval lowering build", *_SIZED["lowering"]):  # 2. features, by the eval lowering
        run_model, network = _lower(ev, options, times, notes)
    with memory_step("feature extraction", *_SIZED["batch"]):
        feats, promises = _features(ev, run_model, network, options, device, report, times, notes)
    with memory_step("certificate", *_SIZED["batch"]):  # 3.
        cert, predictions = _certificate(ev, reg, run_model, feats, options, device, report, times, notes)
    t0 = time.perf_counter()  # 4. Lipschitz constant of g (normalisation included)
    with memory_step("Lipschitz bound", *_SIZED["lipschitz"]):
        lip = lipschitz_constant(ev.model, ev.mf.metadata.get("lipschitz"), options, notes, report, network)
    times["lipschitz"] = time.perf_counter() - t0
    radius = input_radii(cert.result.radius.cpu().double(), lip.value)  # 5. input-space radii
    correct = predictions == feats.labels
    rows = certified_rows(correct, radius, options)
    with memory_step("PGD check", *_SIZED["attack"]):
        violations, attack_info = _attack(ev, network, predictions, correct, radius, rows, options, device,
                                          report, times, notes)
    times["total"] = time.perf_counter() - t_start
    summary = CertifySummary.assemble(
        model=str(model_path), config=ev.model.lipcli_config, dataset=ev.ds_info, device=str(device),
        options=options, cert=cert, lip=lip, dense_layers=network.dense_layers, correct=correct,
        radii=rows, mean_radius=mean_certified_radius(correct, radius), attack=attack_info,
        violations=len(violations), promises=promises, times=times, notes=notes,
    )
    outcome = CertifyOutcome(
        summary=summary, labels=feats.labels, predictions=predictions, radius=radius,
        violations=violations, indices=ev.indices, model=ev.model, dataset=ev.dataset,
    )
    if options.write and not violations:
        _store_results(model_path, ev.loaded_sha256, cert, outcome)
    else:
        summary.written = []
    return outcome
