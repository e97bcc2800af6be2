"""``lip bench profile``: share of a training step spent in convolutions versus everything
else, from :mod:`torch.profiler` (CPU operator self time; CUDA kernel time)."""

from __future__ import annotations

import collections
import re
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lipcli.sdk.specs import CONVOLUTION_PROFILE_LABEL
from lipcli.bench.reports import KernelFloor, ProfileReport, ProfileSettings
from lipcli.bench.profile_report import CATEGORY_LABELS, CONVOLUTION_RULE, TIME_BASIS, profile_breakdown
from lipcli.bench.inputs import Progress, _check_step_settings, environment, _no_progress
from lipcli.bench.models import FAST_CONV, build_model
from lipcli.bench.step import CIFAR_SHAPE, RecipeStep, _clip_for, _sync, synthetic_batch, _timed


_CONV_OP = re.compile(r"^(aten|mkldnn)::.*conv(?!ert)", re.IGNORECASE)
#: record_function label the SOC layers put around each convolution they compute (conv2d,
#: the fused convolution-plus-add of a Horner step, 1×1 convolutions done as matrix products)
_CONV_LABELS = frozenset({CONVOLUTION_PROFILE_LABEL})
#: names of cuDNN/CUTLASS convolution kernels (forward, data and weight gradients), used only
#: for kernels whose launching operator the profiler did not record
_CONV_KERNEL = re.compile(r"conv|fprop|dgrad|wgrad|implicit_?gemm|cudnn", re.IGNORECASE)
_POWER_OPS = frozenset({
    "aten::mv", "aten::mm", "aten::matmul", "aten::addmv", "aten::addmv_", "aten::dot",
    "aten::vdot", "aten::bmm", "aten::linalg_vector_norm", "aten::norm", "aten::addmm",
    "aten::frobenius_norm", "aten::linalg_norm",
})


def _module_kind(name: str, module: nn.Module) -> str:
    """Which profile bucket a body child's forward belongs to (by role, then by name)."""
    if callable(getattr(module, "refresh", None)) or any(
        p.dim() == 4 for p in module.parameters(recurse=False)
    ):
        return "conv"
    low = name.lower()
    if "normal" in low or type(module).__name__ == "Normalize":
        return "normalize"
    if "pool" in low:
        return "pool"
    if "act" in low:
        return "activation"
    if "conv" in low or "down" in low:
        return "conv"
    return "other_forward"


@contextmanager
def _label_modules(model: nn.Module) -> Iterator[None]:
    """Wrap each body child's and the head's forward in ``record_function("bench::fwd::K")``."""
    handles = []
    open_labels: dict[int, list[Any]] = {}

    def pre(kind: str):
        def hook(mod: nn.Module, _args: Any) -> None:
            rf = torch.autograd.profiler.record_function(f"bench::fwd::{kind}")
            rf.__enter__()
            open_labels.setdefault(id(mod), []).append(rf)
        return hook

    def post(mod: nn.Module, _args: Any, _out: Any) -> None:
        stack = open_labels.get(id(mod))
        if stack:
            stack.pop().__exit__(None, None, None)

    children = list(model.body.named_children()) if hasattr(model, "body") else []
    for name, child in children:
        kind = _module_kind(name, child)
        handles.append(child.register_forward_pre_hook(pre(kind)))
        handles.append(child.register_forward_hook(post))
    if hasattr(model, "head"):
        handles.append(model.head.register_forward_pre_hook(pre("head")))
        handles.append(model.head.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _ancestors(evt: Any) -> Iterator[Any]:
    node = evt
    while node is not None:
        yield node
        node = getattr(node, "cpu_parent", None)


def classify_event(evt: Any) -> str:
    """Category key (see :data:`CATEGORY_LABELS`) of one profiler event's self time."""
    chain = list(_ancestors(evt))
    # a label's own self time is Python/profiler overhead around the convolution: not counted
    if any(_CONV_OP.match(e.name) for e in chain) or any(e.name in _CONV_LABELS for e in chain[1:]):
        return "convolution"
    label = next((e.name for e in chain if e.name.startswith("bench::")), None)
    in_autograd = any(e.name.startswith("autograd::engine::evaluate_function") for e in chain)
    if label == "bench::backward" or (in_autograd and label not in ("bench::optimizer",)):
        return "backward"
    if label is None:
        return "unlabelled"
    if label == "bench::optimizer":
        return "optimizer"
    if label == "bench::loss":
        return "loss"
    if label.startswith("bench::fwd::"):
        kind = label.rsplit("::", 1)[1]
        if kind == "conv":
            below_label = []
            for e in chain:
                if e.name.startswith("bench::"):
                    break
                below_label.append(e.name)
            return "conv_power" if any(n in _POWER_OPS for n in below_label) else "conv_other"
        return kind if kind in CATEGORY_LABELS else "other_forward"
    return "other_forward"  # bench::forward glue outside any module


_NODE_PREFIX = "autograd::engine::evaluate_function: "


def _autograd_node(evt: Any) -> str:
    """The autograd node (e.g. ``MaximumBackward0``) whose backward ran ``evt``."""
    for e in _ancestors(evt):
        if e.name.startswith(_NODE_PREFIX):
            return e.name[len(_NODE_PREFIX):]
    return "(engine / outside a node)"


def _self_device_us(evt: Any) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, attr, None)
        if value is not None:
            return float(value)
    return 0.0


def _kernel_us(kernel: Any) -> float:
    return float(kernel.time_range.end - kernel.time_range.start) or _self_device_us(kernel)


def _is_annotation(evt: Any) -> bool:
    """A ``record_function`` range (mirrored on the GPU timeline), not a kernel."""
    return bool(getattr(evt, "is_user_annotation", False)) or evt.name.startswith(
        ("bench::", "lipcli::", "layer::")
    )


def attribute_kernels(
    cpu_events: Sequence[Any], device_events: Sequence[Any]
) -> list[tuple[str, str, str | None, float]]:
    """``(category, operator, autograd node or None, µs)`` for each device kernel, counted
    once.  A kernel the profiler linked to the CPU operator that launched it (the operator's
    ``kernels``) is classified through that operator; every other device event (cuDNN often
    launches through the driver API, which the profiler may not link) is classified by its
    name: cuDNN/CUTLASS convolution kernels → convolution, anything else → unattributed."""
    out: list[tuple[str, str, str | None, float]] = []
    linked: collections.Counter = collections.Counter()
    for evt in cpu_events:
        launched = getattr(evt, "kernels", None) or ()
        if not launched:
            continue
        cat = classify_event(evt)
        op = next((e.name for e in _ancestors(evt) if e.name.startswith(("aten::", "mkldnn::"))),
                  evt.name)
        node = _autograd_node(evt) if cat == "backward" else None
        for k in launched:
            out.append((cat, op, node, float(k.duration)))
            linked[(k.name, float(k.duration))] += 1
    for d in device_events:
        if _is_annotation(d):
            continue
        key = (d.name, _kernel_us(d))
        if linked[key] > 0:
            linked[key] -= 1
            continue
        cat = "convolution" if _CONV_KERNEL.search(d.name) else "unattributed_kernels"
        out.append((cat, f"[kernel] {d.name[:100]}", None, key[1]))
    return out


def _profiled_steps(model: nn.Module, step: RecipeStep, batches: Sequence[Any],
                    device: torch.device) -> tuple[list[Any], float]:
    """Run ``step`` eagerly (with phase labels) on each batch under :mod:`torch.profiler`
    (CPU, and CUDA on a GPU); returns the events and the wall time in µs."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with _label_modules(model), profile(activities=activities) as prof:
        _sync(device)
        t0 = time.perf_counter()
        for batch in batches:
            step(*batch, labels=True)
        _sync(device)
        wall_us = (time.perf_counter() - t0) * 1e6
    return list(prof.events()), wall_us


def _split_events(events: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(cpu_events, device_events)``."""
    cpu_events: list[Any] = []
    kernels: list[Any] = []
    for evt in events:
        if getattr(evt, "device_type", None) is not None and "CPU" not in str(evt.device_type):
            kernels.append(evt)
        else:
            cpu_events.append(evt)
    return cpu_events, kernels


def kernel_floor(model: nn.Module, step: RecipeStep, batches: Sequence[Any],
                 device: torch.device) -> KernelFloor | None:
    """GPU kernel time per training step and its convolution part (the floor of a step:
    its convolution kernels), from :mod:`torch.profiler` over eager steps on ``batches``
    (a CUDA graph replays the same kernels).  ``None`` on CPU."""
    if device.type != "cuda":
        return None
    events, wall_us = _profiled_steps(model, step, batches, device)
    conv = total = 0.0
    for cat, _op, _node, us in attribute_kernels(*_split_events(events)):
        total += us
        if cat == "convolution":
            conv += us
    n = max(1, len(batches))
    return KernelFloor(conv_kernel_ms_per_step=conv / 1e3 / n, gpu_kernel_ms_per_step=total / 1e3 / n,
                       profiled_step_ms=wall_us / 1e3 / n, profiled_steps=len(batches))


def _sum_events(events: Any) -> tuple[dict[str, float], dict[str, float], dict[tuple[str, str], list[float]],
                                      dict[str, list[float]], dict[tuple[str, str], list[float]], float]:
    """Profiled microseconds by category (CPU self time, device time), by operator and by
    autograd node ([CPU, device] each), of kernels without a launch record, and of all
    device-side events."""
    cpu_us: dict[str, float] = {k: 0.0 for k in CATEGORY_LABELS}
    dev_us: dict[str, float] = {k: 0.0 for k in CATEGORY_LABELS}
    per_op: dict[tuple[str, str], list[float]] = {}
    per_node: dict[str, list[float]] = {}
    device_events_us = 0.0  # all device-side kernel/memcpy events
    cpu_events, kernels = _split_events(events)
    for evt in cpu_events:
        cat = classify_event(evt)
        c_us = float(evt.self_cpu_time_total)
        cpu_us[cat] += c_us
        per_op.setdefault((evt.name, cat), [0.0, 0.0])[0] += c_us
        if cat == "backward":
            per_node.setdefault(_autograd_node(evt), [0.0, 0.0])[0] += c_us
    unlinked: dict[tuple[str, str], list[float]] = {}
    for cat, op, node, d_us in attribute_kernels(cpu_events, kernels):
        device_events_us += d_us
        dev_us[cat] += d_us
        per_op.setdefault((op, cat), [0.0, 0.0])[1] += d_us
        if node is not None:
            per_node.setdefault(node, [0.0, 0.0])[1] += d_us
        if op.startswith("[kernel] "):
            unlinked.setdefault((op[9:], cat), [0.0])[0] += d_us
    return cpu_us, dev_us, per_op, per_node, unlinked, device_events_us


def bench_profile(
    arch: str = "lipconvnet-20",
    *,
    # the model
    conv: str = FAST_CONV, head: str = "lln", pool: str = "max", width: int = 32,
    num_classes: int = 10, seed: int = 0,
    # the measurement
    batch_size: int = 128, steps: int = 3, warmup: int = 1, top_ops: int = 15,
    device: torch.device | str = "cpu", progress: Progress = _no_progress,
) -> ProfileReport:
    """Share of training-step time per category, convolution versus everything else.

    CPU: each operator's self CPU time, plus "untracked" = profiled wall time minus the sum
    of operator self times.  CUDA: each kernel's device time, attributed through the CPU
    operator that launched it; shares are of total kernel time (GPU busy time), and the
    wall time and GPU idle time are reported beside them.
    """
    _check_step_settings(batch_size=batch_size, steps=steps, warmup=warmup, width=width,
                         num_classes=num_classes)
    device = torch.device(device)
    env = environment(device)
    model = build_model(arch, conv=conv, head=head, pool=pool, width=width,
                        num_classes=num_classes, seed=seed).to(device)
    step = RecipeStep(model, _clip_for(head))
    gen = torch.Generator().manual_seed(seed)
    batches = [synthetic_batch(batch_size, num_classes, gen, device) for _ in range(warmup + steps)]
    for i in range(warmup):
        progress(f"profile {arch} ({conv}): warm-up step {i + 1}/{warmup}")
        step(*batches[i])
    _sync(device)
    # the same steps unprofiled, for the profiler's overhead
    plain = []
    for i in range(steps):
        dt, _ = _timed(lambda b=batches[warmup + i]: step(*b), device)
        plain.append(dt)
    progress(f"profile {arch} ({conv}): {steps} profiled steps")
    events, wall_us = _profiled_steps(model, step, batches[warmup:], device)
    use_device = device.type == "cuda"
    return ProfileReport(
        environment=env,
        settings=ProfileSettings(
            arch=arch, conv=conv, head=head, pool=pool, width=width,
            batch_size=batch_size, steps=steps, warmup=warmup,
            num_classes=num_classes, input_shape=list(CIFAR_SHAPE),
            time_basis=TIME_BASIS[use_device], convolution_rule=CONVOLUTION_RULE,
        ),
        step_ms_unprofiled_median=statistics.median(plain) * 1e3,
        **profile_breakdown(_sum_events(events), wall_us, steps, top_ops, use_device),
    )
