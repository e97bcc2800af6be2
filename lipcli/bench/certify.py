"""``lip bench certify``: inputs/s of feature extraction and of each certificate method, and
the time of the Lipschitz bound."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lipcli.sdk.errors import LipUsageError
from lipcli.numerics.precision import in_full_float32_precision
from lipcli.bench.reports import (
    CertificateTiming,
    CertifyBenchReport,
    CertifyBenchSettings,
    FeatureTiming,
    HeadFit,
    LipschitzTiming,
    Quantiles,
)
from lipcli.bench.inputs import Progress, environment, _no_progress
from lipcli.bench.options import CertifyBenchOptions, check_settings
from lipcli.bench.models import count_parameters
from lipcli.bench.step import _timed
from lipcli.host.plugins import Registry, get_registry
from lipcli.lowering.network import lowered_network
from lipcli.sdk.certificates import CertifyResult
from lipcli.bench.reports import FeaturePath
from lipcli.lipschitz.bound import lowered_upper_bound, model_input_shape
from lipcli.lipschitz.report import lipschitz_report


def _flop_per_input(network: nn.Module, shape: tuple[int, ...], device: torch.device) -> int:
    """Floating-point operations that one more input adds to a feature pass (torch's flop
    counter): the count on two inputs minus the count on one, after a warm-up pass, so that
    work done once per pass or cached on the first one (filters, σ) is not charged per input."""
    counts = []
    with torch.no_grad():
        network.features(torch.zeros((1, *shape), device=device))  # warm-up: caches filled
        for batch in (1, 2):
            with FlopCounterMode(display=False) as counter:
                network.features(torch.zeros((batch, *shape), device=device))
            counts.append(int(counter.get_total_flops()))
    return counts[1] - counts[0]


def feature_paths(model: nn.Module, shape: tuple[int, ...], batch_size: int, rounds: int,
                  device: torch.device, gen: torch.Generator,
                  dense_max_mib: float | None = None, compile_mode: str | None = None) -> list[FeaturePath]:
    """Series against lowered feature pass, interleaved: ``rounds`` rounds, each timing one
    batch of ``batch_size`` through both paths (the order alternating), after one warm-up
    each; FLOP per input by :class:`torch.utils.flop_counter.FlopCounterMode`.  With
    ``compile_mode`` a third path, ``"compiled"``: the lowered pass compiled by
    ``torch.compile`` (``lip certify --compile``; its ``build_s`` is the compile time, in
    the warm-up call)."""
    t0 = time.perf_counter()
    lowered = lowered_network(model, shape, dense_max_mib=dense_max_mib)
    build = time.perf_counter() - t0
    series = lowered_network(model, shape, series=True)
    nets: dict[str, Any] = {"series": series, "lowered": lowered}
    builds = {"series": 0.0, "lowered": build}
    dense = {"series": [], "lowered": lowered.dense_layers}
    flops = {name: _flop_per_input(net, shape, device) for name, net in nets.items()}
    bounded: dict[str, Any] = {"series": series, "lowered": lowered}
    compiled = None
    if compile_mode:
        from types import SimpleNamespace

        from lipcli.compiling import Compiled

        compiled = Compiled(lowered.features, compile_mode, "the certification feature pass")
        nets["compiled"] = SimpleNamespace(features=compiled)
        dense["compiled"], flops["compiled"], bounded["compiled"] = lowered.dense_layers, flops["lowered"], lowered
    times: dict[str, list[float]] = {name: [] for name in nets}
    x = torch.rand((batch_size, *shape), generator=gen).to(device)
    with torch.no_grad():
        for name, net in nets.items():
            if name == "compiled":
                with compiled.measure():  # type: ignore[union-attr]
                    net.features(x)
                builds["compiled"] = compiled.compile_s  # type: ignore[union-attr]
            else:
                net.features(x)  # warm-up
        for r in range(rounds):
            order = list(nets) if r % 2 == 0 else list(reversed(list(nets)))
            for name in order:
                dt, _ = _timed(lambda net=nets[name]: net.features(x), device)
                times[name].append(dt)
    out = []
    for name, net in nets.items():
        bound = lowered_upper_bound(model, bounded[name])[0]
        median = sorted(times[name])[len(times[name]) // 2] if times[name] else float("nan")
        out.append(FeaturePath(name, flops[name], times[name], batch_size / median if median > 0 else 0.0,
                               builds[name], dense[name], bound))
    return out


def fit_head(
    head: nn.Module,
    features: torch.Tensor,
    num_classes: int,
    steps: int,
    target_loss: float = 0.7,
    seed: int = 0,
    lr: float = 1e-5,
) -> HeadFit:
    """Give a random head trained-like margins: full-batch Adam on cross-entropy with labels
    from a random linear teacher ``argmax(y Vᵀ)``, for at most ``steps`` steps, stopping as
    soon as the loss is ``<= target_loss`` (default 0.7, the order of a trained CIFAR-10
    model's training loss; fitting further makes margins, and radii, unrealistically large).
    The learning rate starts at ``lr`` and grows by 2 % per step (capped at 1e-2), so that
    easy fits stop close to the target and hard ones still get there.  Only the head moves
    (features fixed).  For benchmarking only: the labels mean nothing.  Returns the steps
    taken, the final loss and the fraction of teacher labels fitted.
    """
    gen = torch.Generator().manual_seed(seed + 17)
    teacher = torch.randn(num_classes, features.shape[1], generator=gen).to(features)
    labels = (features @ teacher.T).argmax(dim=1)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    head.train()
    taken, last = 0, float("nan")
    with torch.enable_grad():
        for taken in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(head(features), labels)
            last = loss.item()
            if last <= target_loss:
                taken -= 1
                break
            loss.backward()
            opt.step()
            for group in opt.param_groups:
                group["lr"] = min(group["lr"] * 1.02, 1e-2)
    head.eval()
    with torch.no_grad():
        final = F.cross_entropy(head(features), labels).item()
        acc = float((head(features).argmax(1) == labels).float().mean())
    return HeadFit(max_steps=steps, steps_taken=taken, target_loss=target_loss, final_loss=final,
                   teacher_agreement=acc)


def _quantiles(values: torch.Tensor) -> Quantiles:
    v = values.double().flatten().cpu()
    finite = v[torch.isfinite(v)]
    if finite.numel() == 0:
        return Quantiles(min=float("nan"), median=float("nan"), max=float("nan"))
    return Quantiles(min=float(finite.min()), median=float(finite.median()), max=float(finite.max()))


def _timed_features(model: nn.Module, shape: tuple[int, ...], *, n: int, batch_size: int,
                    gen: torch.Generator, device: torch.device) -> tuple[float, torch.Tensor]:
    """The time to extract the features of ``n`` uniform random inputs in batches of
    ``batch_size`` (after one warm-up batch), and the features."""
    batches = [min(batch_size, n - i) for i in range(0, n, batch_size)]
    with torch.no_grad():
        model.features(torch.rand((batches[0], *shape), generator=gen).to(device))  # warm-up
        feats: list[torch.Tensor] = []
        t_feat = 0.0
        for b in batches:
            x = torch.rand((b, *shape), generator=gen).to(device)
            dt, y = _timed(lambda x=x: model.features(x), device)
            t_feat += dt
            feats.append(y)
    return t_feat, torch.cat(feats)


def _timed_certificate(certifier: Any, cert_name: str, k: int | None, head: nn.Module,
                       features: torch.Tensor, *, batch_size: int, lip_bound: float,
                       device: torch.device) -> CertificateTiming:
    """Time ``certifier``'s ``prepare`` and its certificates of ``features`` (top-``k``
    classes where given) in batches; the input radii divide by ``lip_bound``."""
    n = features.shape[0]
    t_prep, _ = _timed(lambda c=certifier: c.prepare(head, None), device)
    parts = []
    t_cert = 0.0
    for i in range(0, n, batch_size):
        chunk = features[i:i + batch_size]
        dt, res = _timed(lambda c=certifier, y=chunk: c.certify(head, y, top_k=k), device)
        t_cert += dt
        parts.append(res)

    res = CertifyResult.concatenate(parts)
    radius_input = res.radius / lip_bound
    return CertificateTiming(
        method=cert_name,
        top_k=k,
        exact_classes=bool(res.exact_classes),
        prepare_s=t_prep,
        certify_s=t_cert,
        inputs_per_s=n / t_cert if t_cert > 0 else None,
        feature_radius=_quantiles(res.radius),
        input_radius=_quantiles(radius_input),
        nonzero_fraction=float((res.radius > 0).double().mean()),
        notes=list(res.notes),
        stats=res.stats,
    )


def _head_entry(model: nn.Module, registry: Registry) -> tuple[dict[str, Any], str, Any]:
    """The model's config, its head's name and the head's spec."""
    config = getattr(model, "lipcli_config", None) or {}
    head_name = (config.get("head") or {}).get("name")
    if head_name is None:
        raise LipUsageError("model has no lipcli_config head entry; build it with lipcli")
    return config, head_name, registry.get("head", head_name)


def _feature_stages(
    model: nn.Module, shape: tuple[int, ...], *, n: int, batch_size: int, gen: torch.Generator,
    device: torch.device, path_rounds: int, dense_max_mib: float | None, progress: Progress,
    compile_mode: str | None = None,
) -> tuple[float, torch.Tensor, list[FeaturePath]]:
    """The timed feature extraction (seconds, features) and the series-against-lowered paths."""
    progress(f"features: {n} inputs in batches of {batch_size}")
    t_feat, features = _timed_features(model, shape, n=n, batch_size=batch_size, gen=gen, device=device)
    paths: list[FeaturePath] = []
    if path_rounds > 0:
        progress(f"feature paths: series vs lowered, {path_rounds} interleaved rounds")
        paths = feature_paths(model, shape, min(batch_size, n), path_rounds, device, gen, dense_max_mib,
                              compile_mode)
    return t_feat, features, paths


def _fitted_head(head: nn.Module, features: torch.Tensor, num_classes: int, steps: int, loss: float,
                 seed: int, notes: list[str], progress: Progress) -> HeadFit | None:
    """The head fitted to a random teacher's labels (``steps`` > 0), with a note; else None."""
    if steps <= 0:
        return None
    progress(f"fitting the head (<= {steps} steps, to loss {loss})")
    fit = fit_head(head, features, num_classes, steps, loss, seed)
    notes.append(
        f"head fitted {fit.steps_taken} Adam steps (to cross-entropy "
        f"{fit.final_loss:.3f}) to a random linear teacher's labels on the synthetic "
        "features, to give it trained-like margins (benchmark only)"
    )
    return fit


def _lipschitz_timing(model: nn.Module, iters: int, progress: Progress) -> LipschitzTiming:
    """The guaranteed bound and the ``iters``-step power estimate, timed."""
    progress(f"Lipschitz: guaranteed bound and {iters}-step power estimate")
    t0 = time.perf_counter()
    lip = lipschitz_report(model, estimate=True, iters=iters)
    t_lip = time.perf_counter() - t0
    return LipschitzTiming(
        upper_bound=float(lip.upper_bound),
        upper_bound_s=lip.time_s["upper_bound"],
        estimate=lip.estimate,
        estimate_s=lip.time_s["estimate"],
        estimate_iters=iters,
        report_total_s=t_lip,
    )


def _certificate_timings(
    registry: Registry, certificate: str, top_k: int | None, head: nn.Module, features: torch.Tensor,
    *, batch_size: int, lip_bound: float, device: torch.device, progress: Progress,
) -> list[CertificateTiming]:
    """The head's ``certificate`` timed on all classes, and on the ``top_k`` when given."""
    n = features.shape[0]
    variants: list[tuple[str, int | None]] = [(certificate, None)]
    if top_k is not None:
        variants.append((certificate, top_k))
    certs = []
    for cert_name, k in variants:
        label = cert_name if k is None else f"{cert_name} (top-{k})"
        progress(f"certificate {label}: prepare + {n} inputs")
        certifier = registry.component("certificate", cert_name).build()
        certs.append(_timed_certificate(certifier, cert_name, k, head, features,
                                        batch_size=batch_size, lip_bound=lip_bound, device=device))
    return certs


@in_full_float32_precision
def bench_certify(
    model: nn.Module,
    *,
    batch_size: int = 256,
    n: int = 1024,
    device: torch.device | str = "cpu",
    top_k: int | None = None,
    fit_head_steps: int = 0,
    fit_loss: float = 0.7,
    lipschitz_iters: int = 50,
    refresh_steps: int = 50,
    source: str = "random weights (untrained)",
    seed: int = 0,
    progress: Progress = _no_progress,
    path_rounds: int = 3,
    dense_max_mib: float | None = None,
    compile_mode: str | None = None,
) -> CertifyBenchReport:
    """Throughput of feature extraction, the head's certificate(s) and the Lipschitz numbers.

    ``model`` follows the lipcli module protocol (``features``, ``head``, ``lipcli_config``,
    ``refresh_power_iteration``).  ``n`` synthetic inputs in batches of ``batch_size``.
    Timed stages in order: power-iteration refresh, features (and the feature paths), head
    fit, Lipschitz numbers, certificates.  ``compile_mode``: the feature paths include the
    lowered pass compiled by ``torch.compile`` in that mode.
    """

    check_settings(CertifyBenchOptions, batch_size=batch_size, n=n, refresh_steps=refresh_steps,
                   lipschitz_iters=lipschitz_iters, top_k=top_k)
    device = torch.device(device)
    registry = get_registry()
    config, head_name, head_spec = _head_entry(model, registry)
    num_classes = int(config.get("num_classes", 10))
    shape = model_input_shape(model)
    model = model.to(device)
    env = environment(device)
    gen = torch.Generator().manual_seed(seed)
    notes: list[str] = []

    # power-iteration refresh: required before evaluating a freshly built model (SPEC §1.2)
    t_refresh, _ = _timed(lambda: model.refresh_power_iteration(refresh_steps), device)
    model.eval()
    t_feat, features, paths = _feature_stages(
        model, shape, n=n, batch_size=batch_size, gen=gen, device=device, path_rounds=path_rounds,
        dense_max_mib=dense_max_mib, progress=progress, compile_mode=compile_mode)
    head = model.head
    fit = _fitted_head(head, features, num_classes, fit_head_steps, fit_loss, seed, notes, progress)

    lipschitz = _lipschitz_timing(model, lipschitz_iters, progress)
    certs = _certificate_timings(registry, head_spec.certificate, top_k, head, features,
                                 batch_size=batch_size, lip_bound=lipschitz.upper_bound, device=device,
                                 progress=progress)
    return CertifyBenchReport(
        environment=env,
        settings=CertifyBenchSettings(
            **{kind: (config.get(kind) or {}).get("name") for kind in ("arch", "conv", "pool")},
            head=head_name, num_classes=num_classes, input_shape=list(shape), n=n,
            batch_size=batch_size, top_k=top_k, weights=source,
            inputs="synthetic: uniform [0,1] images", fit_head=fit,
        ),
        parameters=count_parameters(model),
        power_refresh_s=t_refresh,
        power_refresh_steps=refresh_steps,
        features=FeatureTiming(
            seconds=t_feat,
            inputs_per_s=n / t_feat,
            feature_dim=int(features.shape[1]),
            mode="eval (evaluation terms), no_grad",
        ),
        lipschitz=lipschitz,
        certificates=certs,
        notes=notes,
        feature_paths=paths,
    )
