"""Steps 2-5 of :func:`lipcli.certify.run_certification` (see the package docstring):
features, the head's certificate, ``Lip(g)``, input-space radii and their statistics."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from lipcli.certify.data import batches, stack
from lipcli.certify.options import CertifyOptions
from lipcli.certify.results import CertificateRun, LipschitzConstant, MeanCertifiedRadius, RadiusRow
from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.sdk.certificates import CertifyResult
from lipcli.host.registry import Registry
from lipcli.lipschitz.bound import guaranteed_upper_bound, lowered_upper_bound, weights_fingerprint
from lipcli.lipschitz.report import lipschitz_report
from lipcli.lipschitz.promises import locate_nonfinite

#: ``progress(stage, done, total)``; stages: "features", "certificate", "attack eps=..." (counted
#: in PGD steps of single points),
#: and with ``lipschitz="estimate"`` the power-method estimate's layers
Progress = Callable[[str, int, int], None]


@dataclass
class Features:
    """Step 2: features ``y = g(x)`` (float32, float64 with ``--exact``; CPU), labels and the forward pass's predictions."""

    features: torch.Tensor
    labels: torch.Tensor
    forward_predictions: torch.Tensor


def extract_features(
    model: nn.Module, dataset: Any, n: int, batch_size: int, device: torch.device,
    dataset_name: str, report: Progress, network: nn.Module | None = None,
    features: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Features:
    """Features and forward predictions, computed by ``network`` (the eval lowering,
    :mod:`lipcli.lowering`; default the model itself); ``features``: its feature pass
    compiled (``--compile``), else ``network.features``."""
    run = model if network is None else network
    feature_pass = features or run.features
    num_classes = int(model.lipcli_config["num_classes"])
    feats, labels_list, fwd_preds = [], [], []
    with torch.no_grad():
        for start, stop in batches(n, batch_size):
            images, labels = stack(dataset, list(range(start, stop)))
            if bool(((labels < 0) | (labels >= num_classes)).any()):
                raise LipUsageError(
                    f"data set {dataset_name!r} has labels outside 0..{num_classes - 1}"
                )
            y = feature_pass(images.to(device))
            if not bool(torch.isfinite(y).all()):
                raise _nonfinite_features(model, images.to(device))
            feats.append((y if y.dtype == torch.float64 else y.float()).cpu())  # float64: --exact
            fwd_preds.append(run.head(y).argmax(1).cpu())
            labels_list.append(labels)
            report("features", stop, n)
    return Features(torch.cat(feats), torch.cat(labels_list), torch.cat(fwd_preds))


def _nonfinite_features(model: nn.Module, images: torch.Tensor) -> LipError:
    """The error for non-finite features, naming the layer whose output first became non-finite."""

    culprit = locate_nonfinite(model, images)
    return LipError("the model produced non-finite features" + (f": {culprit}" if culprit else "")
                    + "; cannot certify")


def certify_features(
    reg: Registry, model: nn.Module, file_cache: dict[str, Any], features: torch.Tensor,
    options: CertifyOptions, device: torch.device, report: Progress, times: dict[str, float],
) -> CertificateRun:
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
    for start, stop in batches(n, options.batch_size):
        results.append(certifier.certify(head, features[start:stop].to(device), top_k=options.top_k))
        report("certificate", stop, n)
    result = CertifyResult.concatenate(results)
    cache = getattr(certifier, "cache", None) or cache
    times["certificate"] = time.perf_counter() - t0
    return CertificateRun(name, component, certifier, result, cache, snapshot)


def lipschitz_constant(
    model: nn.Module, stored: Any, options: CertifyOptions, notes: list[str], report: Progress,
    network: Any = None,
) -> LipschitzConstant:
    """The fresh guaranteed bound of the operator that runs (``network``: the eval lowering,
    :func:`lipcli.lipschitz.bound.lowered_upper_bound`; else the model's own); with ``lipschitz="estimate"`` the power estimate (read from
    the file's ``lipschitz`` slot when it was made for the same weights and iterations)."""

    fingerprint = weights_fingerprint(model)
    computed = guaranteed_upper_bound(model)
    model_bound = computed[0]
    bound = lowered_upper_bound(model, network, computed)[0] if network is not None else model_bound
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
            ).estimate
    if (
        same_weights and isinstance(stored.get("upper_bound"), (int, float))
        and not math.isclose(float(stored["upper_bound"]), model_bound, rel_tol=1e-6)
    ):
        notes.append(
            f"the Lipschitz bound stored in the model file ({stored['upper_bound']:.9g}) "
            f"differs from the fresh one ({model_bound:.9g}); the fresh one is used"
        )
    value = float(estimate) if estimate is not None else bound
    return LipschitzConstant(value, bound, estimate, fingerprint)


def input_radii(feature_radius: torch.Tensor, lipschitz: float) -> torch.Tensor:
    """Step 5: ``r_y / Lip`` rounded down by one ulp (an infinite certificate stays infinite,
    not the largest double)."""
    quotient = feature_radius / lipschitz
    return torch.where(
        torch.isinf(quotient), quotient, torch.nextafter(quotient, torch.zeros_like(quotient))
    )


def certified_rows(
    correct: torch.Tensor, radius: torch.Tensor, options: CertifyOptions,
) -> list[RadiusRow]:
    """Certified accuracy at each requested radius (see the package docstring)."""
    n = correct.shape[0]
    rows = []
    for eps in options.radii:
        cert = correct & (radius >= eps)
        rows.append(RadiusRow(
            radius=eps, radius_units=eps * options.radius_unit,
            certified_accuracy=int(cert.sum()) / n, certified=int(cert.sum()),
        ))
    return rows


def mean_certified_radius(correct: torch.Tensor, radius: torch.Tensor) -> MeanCertifiedRadius:
    masked = torch.where(correct, radius, torch.zeros_like(radius))
    return MeanCertifiedRadius(
        all=float(masked.mean()),
        correct=float(radius[correct].mean()) if bool(correct.any()) else 0.0,
    )
