"""``lip bench train``: the paper's Table 1, fast (``soc-fast``) versus exact (``soc``) SOC
training steps, interleaved from identical weights."""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from lipcli.bench.inputs import (
    Progress,
    _check_step_settings,
    arch_settings,
    environment,
    _no_progress,
    record_load_after,
    soc_layers,
)
from lipcli.bench.models import EXACT_CONV, FAST_CONV, build_twins, count_parameters
from lipcli.bench.step import (
    EPOCH_IMAGES,
    RecipeStep,
    _clip_for,
    step_settings,
    synthetic_batch,
    _timed,
)
from lipcli.bench.memory import measure_step_memory
from lipcli.bench.profile import kernel_floor
from lipcli.bench.reports import FastExact, ModelTiming, StepTimes, Table1Row, TrainBenchReport, TrainBenchSettings

#: eager steps profiled per model for the convolution-kernel floor (CUDA)
FLOOR_STEPS = 3


def _summary(times: Sequence[float], batch: int) -> StepTimes:
    med = statistics.median(times)
    steps_per_epoch = math.ceil(EPOCH_IMAGES / batch)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return StepTimes(step_times_s=list(times), median_step_s=med, min_step_s=min(times),
                     max_step_s=max(times), iqr_step_s=q[2] - q[0], images_per_s=batch / med,
                     epoch_s=med * steps_per_epoch)


def _alternating_rounds(arch: str, runners: dict[str, RecipeStep], *, batch_size: int, steps: int,
                        warmup: int, num_classes: int, gen: torch.Generator, device: torch.device,
                        progress: Progress) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``warmup + steps`` rounds, each one step of both models on the same new batch (the
    order alternating); returns the timed rounds' step times and every round's loss, by model."""
    times: dict[str, list[float]] = {"fast": [], "exact": []}
    losses: dict[str, list[float]] = {"fast": [], "exact": []}
    rounds = warmup + steps
    for r in range(rounds):
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        order = ("fast", "exact") if r % 2 == 0 else ("exact", "fast")
        for key in order:
            step = runners[key]
            dt, loss = _timed(lambda: step(x, y), device)
            losses[key].append(float(loss))
            if r >= warmup:
                times[key].append(dt)
        phase = "warm-up" if r < warmup else "timed"
        last = {k: (f"{times[k][-1] * 1e3:.0f} ms" if r >= warmup else "-") for k in times}
        progress(
            f"{arch}: round {r + 1}/{rounds} ({phase}) fast {last['fast']}, exact {last['exact']}"
        )
    return times, losses


def bench_train_arch(
    arch: str,
    *,
    batch_size: int = 128,
    steps: int = 10,
    warmup: int = 2,
    device: torch.device | str = "cpu",
    width: int = 32,
    head: str = "lln",
    pool: str = "max",
    num_classes: int = 10,
    seed: int = 0,
    fast_conv: str = FAST_CONV,
    exact_conv: str = EXACT_CONV,
    measure_memory: bool = True,
    cuda_graphs: bool = False,
    floor: bool = True,
    progress: Progress = _no_progress,
    compile: str = "off",
) -> Table1Row:
    """Fast vs exact SOC training step on one architecture (see the module docstring).

    ``cuda_graphs``: both models' steps are replayed from CUDA graphs where possible.
    ``compile``: "off" or the torch.compile mode of both models' forward (compiled in the
    warm-up steps; the compile seconds are reported apart).
    ``floor`` (CUDA): each model's GPU kernel time per step and its convolution part are
    profiled over :data:`FLOOR_STEPS` extra eager steps after the timed ones, and the median
    step time is given as a multiple of that convolution time (the floor of a step)."""
    _check_step_settings(batch_size=batch_size, steps=steps, warmup=warmup, width=width,
                         num_classes=num_classes)
    device = torch.device(device)
    fast, exact, identical = build_twins(
        arch, fast_conv=fast_conv, exact_conv=exact_conv, head=head, pool=pool, width=width,
        num_classes=num_classes, seed=seed, device=device,
    )
    clip = _clip_for(head)
    on, mode = compile != "off", compile if compile != "off" else "default"
    runners = {key: RecipeStep(model, clip, cuda_graphs, compile=on, compile_mode=mode)
               for key, model in (("fast", fast), ("exact", exact))}
    gen = torch.Generator().manual_seed(seed)
    gc.collect()
    times, losses = _alternating_rounds(arch, runners, batch_size=batch_size, steps=steps, warmup=warmup,
                                        num_classes=num_classes, gen=gen, device=device, progress=progress)
    timing = {key: ModelTiming(conv=conv, times=_summary(times[key], batch_size),
                               cuda_graphs=runners[key].graph_summary(),
                               compile_s=round(runners[key].compile_s(), 3) if on else None)
              for key, conv in (("fast", fast_conv), ("exact", exact_conv))}
    if floor and device.type == "cuda":
        progress(f"{arch}: profiling {FLOOR_STEPS} eager steps per model for the convolution kernel time")
        batches = [synthetic_batch(batch_size, num_classes, gen, device) for _ in range(FLOOR_STEPS)]
        for key, model in (("fast", fast), ("exact", exact)):
            fl = kernel_floor(model, runners[key], batches, device)
            if fl is not None and fl.conv_kernel_ms_per_step > 0:
                fl.step_over_conv_kernel = timing[key].times.median_step_s * 1e3 / fl.conv_kernel_ms_per_step
            timing[key].kernel_floor = fl
    ratios = [f / e for f, e in zip(times["fast"], times["exact"])]
    result = Table1Row(
        arch=arch,
        soc_layers=soc_layers(arch),
        parameters=count_parameters(fast),
        initial_state_identical=identical,
        first_step_loss=FastExact(fast=losses["fast"][0], exact=losses["exact"][0]),
        first_step_loss_abs_diff=abs(losses["fast"][0] - losses["exact"][0]),
        final_loss=FastExact(fast=losses["fast"][-1], exact=losses["exact"][-1]),
        fast=timing["fast"],
        exact=timing["exact"],
        reduction_pct=100.0 * (
            1.0 - timing["fast"].times.median_step_s / timing["exact"].times.median_step_s),
        reduction_pct_paired=100.0 * (1.0 - statistics.median(ratios)),
    )
    if measure_memory:
        progress(f"{arch}: measuring peak memory of one step per model")
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        for key in ("fast", "exact"):
            timing[key].memory = measure_step_memory(runners[key], x, y, device)
    del runners, fast, exact
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_train(
    archs: Sequence[str],
    *,
    device: torch.device | str = "cpu",
    progress: Progress = _no_progress,
    **options: Any,
) -> TrainBenchReport:
    """:func:`bench_train_arch` for every architecture, with environment and settings.

    ``options``: the other keyword arguments of :func:`bench_train_arch` (``batch_size``,
    ``steps``, ``warmup``, ``width``, ``head``, ``pool``, ``num_classes``, ``seed``,
    ``fast_conv``, ``exact_conv``, ``measure_memory``, ``cuda_graphs``, ``floor``, ``compile``), with its
    defaults (written there once) where not given.
    """
    s = arch_settings(bench_train_arch, options)
    device = torch.device(device)
    env = environment(device)
    results = []
    for arch in archs:
        progress(f"{arch}: building fast ({s['fast_conv']}) and exact ({s['exact_conv']}) models")
        results.append(bench_train_arch(arch, device=device, progress=progress, **options))
    record_load_after(env)
    settings = TrainBenchSettings(
        batch_size=s["batch_size"], steps=s["steps"], warmup=s["warmup"], width=s["width"],
        head=s["head"], pool=s["pool"], num_classes=s["num_classes"], seed=s["seed"],
        fast_conv=s["fast_conv"], exact_conv=s["exact_conv"],
        schedule=(
            "interleaved: each round both models take one step on the same synthetic "
            "batch, order alternating between rounds; warm-up rounds not timed"
        ),
        cuda_graphs=s["cuda_graphs"],
        kernel_floor=(
            f"CUDA: GPU kernel time per step and its convolution kernels, profiled over "
            f"{FLOOR_STEPS} eager steps after the timed ones"
            if s["floor"] and device.type == "cuda" else None),
        step=step_settings(s["batch_size"]),
        compile=s["compile"],
    )
    return TrainBenchReport(environment=env, settings=settings, results=results)
