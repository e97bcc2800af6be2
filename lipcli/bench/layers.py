"""``lip bench layers``: every installed convolution in one network (the comparison study's
protocol, Prach et al., CVPR 2024, §4 / App. E): per convolution the training step time, the
inference time with parameter transforms cached, peak training and inference memory and the
parameters.  Synthetic inputs (uniform images, random labels), random initialisation.

* training step: zero_grad + forward + cross-entropy + backward + SGD step (momentum 0.9);
  the median over ``steps`` timed steps after ``warmup``, the convolutions timed in interleaved
  rounds (one step of each per round) so that load on a shared machine spreads over all;
* inference: eval mode, ``torch.no_grad``, after one pass that builds the cached operators
  (the study: "with parameter transforms cached"); median over the same rounds;
* memory: CUDA ``max_memory_allocated`` above the memory before the step / pass; CPU the
  resident-set high-water mark above the RSS before it (:mod:`lipcli.bench.memory`).
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from lipcli.bench.inputs import environment
from lipcli.bench.memory import _malloc_trim, _proc_kib, _reset_peak_rss, measure_step_memory
from lipcli.bench.reports.common import BenchReport
from lipcli.bench.step import RecipeStep, _sync
from lipcli._util.records import JsonRecord

__all__ = ["LayerRow", "LayersReport", "bench_layers"]


@dataclass
class LayerRow(JsonRecord):
    conv: str
    distribution: str
    parameters: int
    train_step_ms: float | None
    inference_ms: float | None
    train_peak_mib: float | None
    inference_peak_mib: float | None
    lipschitz_bound: float | None
    error: str | None = None


@dataclass(kw_only=True)
class LayersReport(BenchReport):
    arch: str
    head: str
    batch_size: int
    image_shape: list[int]
    warmup: int
    steps: int
    method: str
    rows: list[LayerRow] = field(default_factory=list)


def _inference_peak(model: torch.nn.Module, x: torch.Tensor, device: torch.device) -> float | None:
    gc.collect()
    _sync(device)
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            model(x)
            _sync(device)
            return (torch.cuda.max_memory_allocated(device) - before) / 2**20
        _malloc_trim()
        rss0, reset = _proc_kib("VmRSS"), _reset_peak_rss()
        model(x)
        hwm = _proc_kib("VmHWM")
    return max(0, hwm - rss0) / 1024 if rss0 is not None and hwm is not None and reset else None


def _timed(fn: Any, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def bench_layers(*, arch: str, head: str, convs: list[str], batch_size: int, device: torch.device,
                 warmup: int = 2, steps: int = 5, seed: int = 0, num_classes: int = 10,
                 image_shape: tuple[int, int, int] = (3, 32, 32), registry: Any = None,
                 progress: Any = None, arch_params: dict[str, Any] | None = None) -> LayersReport:
    """The report of the module docstring, one row per convolution of ``convs``."""
    from lipcli.host.models import create_model
    from lipcli.host.plugins import get_registry
    from lipcli.lipschitz.bound import guaranteed_upper_bound

    reg = registry or get_registry()
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((batch_size, *image_shape), generator=gen).to(device)
    y = torch.randint(0, num_classes, (batch_size,), generator=gen).to(device)
    built: dict[str, Any] = {}
    rows: dict[str, LayerRow] = {}
    for conv in convs:
        spec_dist = reg.component("conv", conv).distribution
        try:
            torch.manual_seed(seed)
            model = create_model(arch, conv=conv, head=head, num_classes=num_classes,
                                 image_size=image_shape[1:], in_channels=image_shape[0], registry=reg,
                                 **(arch_params or {})).to(device)
            step = RecipeStep(model)
            memory = measure_step_memory(step, x, y, device)  # also the first (warm-up) step
            built[conv] = (model, step)
            rows[conv] = LayerRow(conv, spec_dist, sum(p.numel() for p in model.parameters()), None, None,
                                  memory.peak_step_mib, None, None)
        except Exception as exc:  # noqa: BLE001 - a layer that cannot run this network gets its reason
            rows[conv] = LayerRow(conv, spec_dist, 0, None, None, None, None, None,
                                  error=str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
    train_t: dict[str, list[float]] = {c: [] for c in built}
    infer_t: dict[str, list[float]] = {c: [] for c in built}
    for r in range(warmup + steps):  # interleaved rounds: training steps
        for conv, (model, step) in built.items():
            model.train()
            t = _timed(lambda: step(x, y, eager=True), device)
            if r >= warmup:
                train_t[conv].append(t)
        if progress is not None:
            progress(f"training steps: round {r + 1}/{warmup + steps}")
    for conv, (model, _step) in built.items():
        model.eval()
        with torch.no_grad():
            model(x)  # builds the cached operators
        rows[conv].inference_peak_mib = _inference_peak(model, x, device)
        bound, _ = guaranteed_upper_bound(model)
        rows[conv].lipschitz_bound = float(bound)
    for r in range(warmup + steps):  # interleaved rounds: inference
        for conv, (model, _step) in built.items():
            with torch.no_grad():
                t = _timed(lambda: model(x), device)
            if r >= warmup:
                infer_t[conv].append(t)
    for conv in built:
        rows[conv].train_step_ms = round(1e3 * statistics.median(train_t[conv]), 3)
        rows[conv].inference_ms = round(1e3 * statistics.median(infer_t[conv]), 3)
    return LayersReport(
        benchmark="layers", environment=environment(device), arch=arch, head=head, batch_size=batch_size,
        image_shape=list(image_shape), warmup=warmup, steps=steps,
        method=("median of interleaved rounds; train step = zero_grad+forward+CE+backward+SGD; inference = "
                "eval, no_grad, cached operators; memory = peak above the level before (CUDA allocator or RSS)"),
        rows=[rows[c] for c in convs])


def plot_layers(report: LayersReport, path: str, results: dict[str, float] | None = None) -> None:
    """Training step time against certified accuracy (``results``: conv -> accuracy, e.g. from
    ``lip certify --json``) when given, else against inference time; one labelled point each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for row in report.rows:
        if row.train_step_ms is None:
            continue
        yv = (results or {}).get(row.conv) if results else row.inference_ms
        if yv is None:
            continue
        ax.scatter([row.train_step_ms], [yv])
        ax.annotate(row.conv, (row.train_step_ms, yv), textcoords="offset points", xytext=(4, 2), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(f"training step (ms, batch {report.batch_size})")
    ax.set_ylabel("certified accuracy" if results else "inference (ms, cached operators)")
    ax.set_title(f"{report.arch}: every installed convolution")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
