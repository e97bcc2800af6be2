"""Measurement logic behind ``lip bench`` (paper Table 1, certification throughput, profile).

Everything here *measures*; nothing is cached, guessed or hard-coded.  Every number a
function returns was timed in the call that returns it, on synthetic inputs of the data
set's shape (CIFAR: ``3 x 32 x 32`` images in ``[0, 1]``, uniform random labels), so no data
set is needed.  Weights are random (freshly initialised) unless a model file is given.

Three measurements:

``train`` (paper Table 1, SPEC §1.5-§1.6 and §6)
    For each architecture one model with the fast-gradient SOC (``soc-fast``, paper §4,
    eq. 4) and one with plain autograd through the Horner series (``soc``) are built from the
    SAME weights (the exact model loads the fast model's ``state_dict``; equality of every
    tensor is checked and reported).  One *training step* is ``zero_grad`` + forward +
    cross-entropy + backward + the recipe's SGD step (lr 0.1, momentum 0.9, weight decay
    5e-4 on SOC filters and the LLN weight only: SPEC §6).  The two models run
    **interleaved**: in round ``i`` both take a step on the same batch, the order alternating
    between rounds, so that machine noise (other processes, thermal state) hits both alike.
    Reported: median step time, the implied time per CIFAR-10 epoch
    ``median * ceil(50000 / batch)`` (data loading excluded), images/s ``= batch / median``,
    the reduction ``1 - fast/exact`` in %, both from the medians and as the median of the
    per-round ratios, and the peak memory of one step (see :func:`measure_step_memory`).

``certify`` (SPEC §4-§5)
    Inputs/s of feature extraction (eval mode, evaluation terms), of every certificate
    method applicable to the head (its spec's ``certificate``; optionally also with
    ``top_k``), and the time of the GUARANTEED Lipschitz bound and of the power estimate
    (:func:`lipcli.lipschitz.lipschitz_report`).

``profile``
    :mod:`torch.profiler` over a few training steps; every operator's *self* time is put in
    one category, convolution first: an operator is "convolution" when it, or any operator
    it was called from, is an ``aten::`` convolution op (``aten::conv2d``,
    ``aten::convolution``, ``aten::convolution_backward``, ``aten::mkldnn_convolution``,
    ``aten::cudnn_convolution``, ``aten::_slow_conv2d_*``...).  On CUDA, kernel time is
    attributed to the CPU operator that launched it.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import __version__
from .errors import LipUsageError
from .precision import in_full_float32_precision, tf32_state

#: LipConvnet depths of paper Table 1 (SOC layers = depth + 1)
DEFAULT_DEPTHS: tuple[int, ...] = (5, 10, 15, 20, 25, 30, 35, 40)
#: images in one CIFAR-10 / CIFAR-100 training epoch
EPOCH_IMAGES = 50_000
#: the two convolutions compared in Table 1
FAST_CONV, EXACT_CONV = "soc-fast", "soc"
#: input shape of the CIFAR data sets
CIFAR_SHAPE: tuple[int, int, int] = (3, 32, 32)
#: recipe optimiser (SPEC §6)
RECIPE_LR, RECIPE_MOMENTUM, RECIPE_WEIGHT_DECAY = 0.1, 0.9, 5e-4

Progress = Callable[[str], None]


def _no_progress(_msg: str) -> None:
    return None


# ------------------------------------------------------------------------------------------
# inputs: architectures, devices, environment
# ------------------------------------------------------------------------------------------
def parse_archs(text: str | Sequence[str], available: Sequence[str]) -> list[str]:
    """``"5,10"`` / ``"lipconvnet-5,lipconvnet-10"`` (mixed is fine) -> full names.

    A bare integer ``n`` means ``lipconvnet-n``.  Every name must be in ``available`` (the
    registered architectures); otherwise :class:`LipUsageError` names the valid ones.
    Duplicates are dropped, order kept.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    names: list[str] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        name = f"lipconvnet-{int(item)}" if item.isdigit() else item
        if name not in available:
            valid = sorted(available, key=_natural_key)
            raise LipUsageError(
                f"unknown architecture {item!r}; valid: {', '.join(valid) or 'none installed'}"
                " (a bare number n means lipconvnet-n)"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise LipUsageError("no architecture given")
    return names


def _natural_key(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def soc_layers(arch: str) -> int | None:
    """SOC layers of ``lipconvnet-n`` (``n + 1``, the paper's Table 1 row label)."""
    m = re.fullmatch(r"lipconvnet-(\d+)", arch)
    return int(m.group(1)) + 1 if m else None


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` (or ``cuda:N``) or ``auto`` (CUDA when available)."""
    key = name.strip().lower()
    if key == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if key == "cpu":
        return torch.device("cpu")
    if key.startswith("cuda"):
        if not torch.cuda.is_available():
            raise LipUsageError(f"device {name!r} requested but CUDA is not available here")
        dev = torch.device(key)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise LipUsageError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return dev
    raise LipUsageError(f"unknown device {name!r}; use cpu, cuda, cuda:N or auto")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    """Where the numbers were measured: device, threads, versions, current load."""
    env: dict[str, Any] = {
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()
        ),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "lipcli": __version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        env["load_average_1m_5m_15m"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        env["load_average_1m_5m_15m"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            # (convolution, matmul) float32 precision: "tf32"/"ieee"/"none" (torch >= 2.9) or
            # the legacy allow_tf32 flags
            fp32_precision=list(tf32_state()),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    return env


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise LipUsageError(f"{key.replace('_', '-')} must be at least 1, got {value}")


# ------------------------------------------------------------------------------------------
# models, optimiser, batches, one training step
# ------------------------------------------------------------------------------------------
def build_model(
    arch: str,
    *,
    conv: str,
    head: str = "lln",
    pool: str = "max",
    width: int = 32,
    num_classes: int = 10,
    seed: int = 0,
) -> nn.Module:
    """A freshly initialised model (global RNG seeded with ``seed``; CPU)."""
    from .models import create_model

    torch.manual_seed(seed)
    return create_model(
        arch, conv=conv, head=head, pool=pool, num_classes=num_classes, width=width
    )


def state_dicts_identical(a: nn.Module, b: nn.Module) -> bool:
    """True iff ``a`` and ``b`` have the same state-dict keys and bit-identical tensors."""
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return False
    for key, ta in sa.items():
        tb = sb[key]
        if ta.shape != tb.shape or ta.dtype != tb.dtype:
            return False
        if not torch.equal(ta.detach().cpu(), tb.detach().cpu()):
            return False
    return True


def build_twins(
    arch: str,
    *,
    fast_conv: str = FAST_CONV,
    exact_conv: str = EXACT_CONV,
    head: str = "lln",
    pool: str = "max",
    width: int = 32,
    num_classes: int = 10,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[nn.Module, nn.Module, bool]:
    """``(fast_model, exact_model, identical)``: the exact model carries the fast one's weights.

    Both are built (the exact one with a different seed, so a failed copy could not go
    unnoticed), then ``exact.load_state_dict(fast.state_dict(), strict=True)``; ``identical``
    is :func:`state_dicts_identical` after the copy (checked before moving to ``device``).
    """
    fast = build_model(arch, conv=fast_conv, head=head, pool=pool, width=width,
                       num_classes=num_classes, seed=seed)
    exact = build_model(arch, conv=exact_conv, head=head, pool=pool, width=width,
                        num_classes=num_classes, seed=seed + 1)
    try:
        exact.load_state_dict(fast.state_dict(), strict=True)
    except RuntimeError as exc:
        raise LipUsageError(
            f"convolutions {fast_conv!r} and {exact_conv!r} do not share a state dict: {exc}"
        ) from None
    identical = state_dicts_identical(fast, exact)
    return fast.to(device), exact.to(device), identical


def recipe_optimizer(
    model: nn.Module,
    *,
    lr: float = RECIPE_LR,
    momentum: float = RECIPE_MOMENTUM,
    weight_decay: float = RECIPE_WEIGHT_DECAY,
) -> torch.optim.SGD:
    """SGD of the reference recipe (SPEC §6), built exactly as ``lip train`` builds it.

    Weight decay applies to every parameter that is at least 2-D and that the model does not
    exclude (``no_weight_decay_parameters()``: SOC filters and the LLN weight get it; biases,
    projection-pool angles and the MLP head get none).
    """
    from .train import recipe_sgd, weight_decay_groups

    groups = [g for g in weight_decay_groups(model, weight_decay) if g["params"]]
    return recipe_sgd(groups, lr=lr, momentum=momentum)


def synthetic_batch(
    batch: int,
    num_classes: int,
    generator: torch.Generator,
    device: torch.device,
    shape: tuple[int, int, int] = CIFAR_SHAPE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uniform in ``[0, 1]`` of ``shape`` and uniform random labels."""
    x = torch.rand((batch, *shape), generator=generator)
    y = torch.randint(0, num_classes, (batch,), generator=generator)
    return x.to(device), y.to(device)


class TrainStep:
    """One recipe training step of ``model``: zero_grad, forward, CE, backward, SGD step.

    Gradient clipping (norm 1.0) is applied for MLP heads, as in the reference's CRC-Lip
    runs (SPEC §6); the CRC-Lip feature attack and curvature penalty (SPEC §4) are not
    part of this step (Table 1 times plain LLN training).
    """

    def __init__(self, model: nn.Module, clip_grad: float | None = None) -> None:
        self.model = model.train()
        self.optimizer = recipe_optimizer(model)
        self.clip_grad = clip_grad

    def __call__(self, x: torch.Tensor, y: torch.Tensor, labels: bool = False) -> torch.Tensor:
        rf = torch.autograd.profiler.record_function if labels else _null_label
        with rf("bench::optimizer"):
            self.optimizer.zero_grad(set_to_none=True)
        with rf("bench::forward"):
            logits = self.model(x)
        with rf("bench::loss"):
            loss = F.cross_entropy(logits, y)
        with rf("bench::backward"):
            loss.backward()
        with rf("bench::optimizer"):
            if self.clip_grad is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
            self.optimizer.step()
        return loss.detach()


@contextmanager
def _null_label(_name: str) -> Iterator[None]:
    yield


def _clip_for(head: str) -> float | None:
    return 1.0 if head.split(":", 1)[0] == "mlp" else None


# ------------------------------------------------------------------------------------------
# memory of one step
# ------------------------------------------------------------------------------------------
_PROC_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _proc_kib(field_name: str) -> int | None:
    try:
        with open(_PROC_STATUS, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux ``clear_refs`` value 5)."""
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    """Return freed heap memory to the OS (glibc), so the RSS baseline holds no cache."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class SavedTensorMeter:
    """Bytes of distinct storages saved for backward during a forward pass (activations).

    Uses :func:`torch.autograd.graph.saved_tensors_hooks`, which sees every tensor saved
    through ``ctx.save_for_backward`` and by built-in autograd nodes; storages of the given
    ``exclude`` tensors (parameters, buffers) are not counted.  Tensors a custom autograd
    function keeps as plain ``ctx`` attributes are invisible to these hooks.
    """

    def __init__(self, exclude: Sequence[torch.Tensor] = ()) -> None:
        self._exclude = {self._key(t) for t in exclude}
        self._seen: set[tuple[str, int]] = set()
        self.bytes = 0
        self.count = 0

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[str, int]:
        return (str(t.device), t.untyped_storage().data_ptr())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            key = self._key(t)
            if key not in self._seen and key not in self._exclude:
                self._seen.add(key)
                self.bytes += t.untyped_storage().nbytes()
                self.count += 1
        except RuntimeError:  # tensors without storage (e.g. some subclasses)
            pass
        return t

    def hooks(self):  # noqa: ANN201 - context manager
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)


def measure_step_memory(
    step: TrainStep, x: torch.Tensor, y: torch.Tensor, device: torch.device
) -> dict[str, Any]:
    """Peak memory of ONE training step, measured in isolation (outside the timed rounds).

    * CUDA: ``torch.cuda.max_memory_allocated() - memory_allocated()`` before the step
      (peak of the caching allocator's live tensors above the resident model + optimiser
      state), after ``reset_peak_memory_stats``; the absolute peak is also given.
    * CPU: the kernel's resident-set high-water mark above the RSS before the step
      (``VmHWM - VmRSS``, Linux ``/proc/self/status``, after ``malloc_trim`` and a reset of
      the high-water mark through ``/proc/self/clear_refs``); page-granular and includes
      allocator fragmentation.
    * Both: bytes of activations saved for backward (:class:`SavedTensorMeter`).
    """
    model = step.model
    exclude = [*model.parameters(), *model.buffers()]
    meter = SavedTensorMeter(exclude)
    out: dict[str, Any] = {}
    gc.collect()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with meter.hooks():
            step(x, y)
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        out["method"] = "torch.cuda.max_memory_allocated - memory_allocated before the step"
        out["peak_step_mib"] = (peak - before) / 2**20
        out["peak_total_mib"] = peak / 2**20
    else:
        _malloc_trim()
        rss0 = _proc_kib("VmRSS")
        reset = _reset_peak_rss()
        with meter.hooks():
            step(x, y)
        hwm = _proc_kib("VmHWM")
        if rss0 is not None and hwm is not None and reset:
            out["method"] = (
                "peak RSS delta: VmHWM - VmRSS before the step (/proc/self/status, "
                "high-water mark reset via /proc/self/clear_refs, after malloc_trim)"
            )
            out["peak_step_mib"] = max(0, hwm - rss0) / 1024
            out["peak_total_mib"] = hwm / 1024
        else:
            out["method"] = "unavailable (needs Linux /proc/self/status and clear_refs)"
            out["peak_step_mib"] = None
            out["peak_total_mib"] = None
    out["saved_activations_mib"] = meter.bytes / 2**20
    out["saved_tensors"] = meter.count
    return out


# ------------------------------------------------------------------------------------------
# lip bench train
# ------------------------------------------------------------------------------------------
def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - t0, result


def _summary(times: Sequence[float], batch: int) -> dict[str, Any]:
    med = statistics.median(times)
    steps_per_epoch = math.ceil(EPOCH_IMAGES / batch)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {
        "step_times_s": list(times),
        "median_step_s": med,
        "min_step_s": min(times),
        "max_step_s": max(times),
        "iqr_step_s": q[2] - q[0],
        "images_per_s": batch / med,
        "epoch_s": med * steps_per_epoch,
    }


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """Fast vs exact SOC training step on one architecture (see the module docstring)."""
    _check_positive(batch_size=batch_size, steps=steps, width=width)
    if warmup < 0:
        raise LipUsageError(f"warmup must be >= 0, got {warmup}")
    device = torch.device(device)
    fast, exact, identical = build_twins(
        arch, fast_conv=fast_conv, exact_conv=exact_conv, head=head, pool=pool, width=width,
        num_classes=num_classes, seed=seed, device=device,
    )
    clip = _clip_for(head)
    runners = {"fast": TrainStep(fast, clip), "exact": TrainStep(exact, clip)}
    gen = torch.Generator().manual_seed(seed)
    times: dict[str, list[float]] = {"fast": [], "exact": []}
    losses: dict[str, list[float]] = {"fast": [], "exact": []}
    rounds = warmup + steps
    gc.collect()
    for r in range(rounds):
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        order = ("fast", "exact") if r % 2 == 0 else ("exact", "fast")
        for key in order:
            dt, loss = _timed(lambda key=key: runners[key](x, y), device)
            losses[key].append(float(loss))
            if r >= warmup:
                times[key].append(dt)
        phase = "warm-up" if r < warmup else "timed"
        last = {k: (f"{times[k][-1] * 1e3:.0f} ms" if r >= warmup else "-") for k in times}
        progress(
            f"{arch}: round {r + 1}/{rounds} ({phase}) fast {last['fast']}, exact {last['exact']}"
        )
    result: dict[str, Any] = {
        "arch": arch,
        "soc_layers": soc_layers(arch),
        "parameters": count_parameters(fast),
        "initial_state_identical": identical,
        "first_step_loss": {"fast": losses["fast"][0], "exact": losses["exact"][0]},
        "first_step_loss_abs_diff": abs(losses["fast"][0] - losses["exact"][0]),
        "final_loss": {"fast": losses["fast"][-1], "exact": losses["exact"][-1]},
    }
    for key, conv in (("fast", fast_conv), ("exact", exact_conv)):
        result[key] = {"conv": conv, **_summary(times[key], batch_size)}
    ratios = [f / e for f, e in zip(times["fast"], times["exact"])]
    result["reduction_pct"] = 100.0 * (
        1.0 - result["fast"]["median_step_s"] / result["exact"]["median_step_s"]
    )
    result["reduction_pct_paired"] = 100.0 * (1.0 - statistics.median(ratios))
    if measure_memory:
        progress(f"{arch}: measuring peak memory of one step per model")
        x, y = synthetic_batch(batch_size, num_classes, gen, device)
        for key in ("fast", "exact"):
            result[key]["memory"] = measure_step_memory(runners[key], x, y, device)
    del runners, fast, exact
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_train(
    archs: Sequence[str],
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
    measure_memory: bool = True,
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """:func:`bench_train_arch` for every architecture, with environment and settings."""
    _check_positive(batch_size=batch_size, steps=steps, width=width)
    if warmup < 0:
        raise LipUsageError(f"warmup must be >= 0, got {warmup}")
    device = torch.device(device)
    env = environment(device)
    results = []
    for arch in archs:
        progress(f"{arch}: building fast ({FAST_CONV}) and exact ({EXACT_CONV}) models")
        results.append(
            bench_train_arch(
                arch, batch_size=batch_size, steps=steps, warmup=warmup, device=device,
                width=width, head=head, pool=pool, num_classes=num_classes, seed=seed,
                measure_memory=measure_memory, progress=progress,
            )
        )
    try:
        env["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    return {
        "benchmark": "train",
        "environment": env,
        "settings": {
            "batch_size": batch_size, "steps": steps, "warmup": warmup, "width": width,
            "head": head, "pool": pool, "num_classes": num_classes, "seed": seed,
            "input_shape": list(CIFAR_SHAPE),
            "epoch_images": EPOCH_IMAGES,
            "steps_per_epoch": math.ceil(EPOCH_IMAGES / batch_size),
            "fast_conv": FAST_CONV, "exact_conv": EXACT_CONV,
            "optimizer": (
                f"SGD lr {RECIPE_LR}, momentum {RECIPE_MOMENTUM}, weight decay "
                f"{RECIPE_WEIGHT_DECAY} on >=2-D non-head-excluded parameters (SPEC §6)"
            ),
            "schedule": (
                "interleaved: each round both models take one step on the same synthetic "
                "batch, order alternating between rounds; warm-up rounds not timed"
            ),
            "step": "zero_grad + forward + cross-entropy + backward + optimizer step",
            "epoch_time": "median step time x ceil(50000 / batch); data loading excluded",
            "inputs": "synthetic: uniform [0,1] images, uniform random labels; random init",
        },
        "results": results,
    }


# ------------------------------------------------------------------------------------------
# lip bench certify
# ------------------------------------------------------------------------------------------
def fit_head(
    head: nn.Module,
    features: torch.Tensor,
    num_classes: int,
    steps: int,
    target_loss: float = 0.7,
    seed: int = 0,
    lr: float = 1e-5,
) -> dict[str, Any]:
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
    return {"max_steps": steps, "steps_taken": taken, "target_loss": target_loss,
            "final_loss": final, "teacher_agreement": acc}


def _quantiles(values: torch.Tensor) -> dict[str, float]:
    v = values.double().flatten().cpu()
    finite = v[torch.isfinite(v)]
    if finite.numel() == 0:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    return {
        "min": float(finite.min()),
        "median": float(finite.median()),
        "max": float(finite.max()),
    }


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
) -> dict[str, Any]:
    """Throughput of feature extraction, the head's certificate(s) and the Lipschitz numbers.

    ``model`` follows the lipcli module protocol (``features``, ``head``, ``lipcli_config``,
    ``refresh_power_iteration``).  ``n`` synthetic inputs in batches of ``batch_size``.
    """
    from .lipschitz import lipschitz_report, model_input_shape
    from .plugins import get_registry

    _check_positive(batch_size=batch_size, n=n)
    if top_k is not None and top_k < 1:
        raise LipUsageError(f"top-k must be at least 1, got {top_k}")
    device = torch.device(device)
    registry = get_registry()
    config = getattr(model, "lipcli_config", None) or {}
    head_name = (config.get("head") or {}).get("name")
    if head_name is None:
        raise LipUsageError("model has no lipcli_config head entry; build it with lipcli")
    head_spec = registry.get("head", head_name)
    num_classes = int(config.get("num_classes", 10))
    shape = model_input_shape(model)
    model = model.to(device)
    env = environment(device)
    gen = torch.Generator().manual_seed(seed)
    notes: list[str] = []

    # power-iteration refresh: required before evaluating a freshly built model (SPEC §1.2)
    if refresh_steps < 0:
        raise LipUsageError(f"refresh-steps must be >= 0, got {refresh_steps}")
    t_refresh, _ = _timed(lambda: model.refresh_power_iteration(refresh_steps), device)
    model.eval()

    # -- feature extraction ------------------------------------------------------------
    progress(f"features: {n} inputs in batches of {batch_size}")
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
    features = torch.cat(feats)
    head = model.head
    fit = None
    if fit_head_steps > 0:
        progress(f"fitting the head (<= {fit_head_steps} steps, to loss {fit_loss})")
        fit = fit_head(head, features, num_classes, fit_head_steps, fit_loss, seed)
        notes.append(
            f"head fitted {fit['steps_taken']} Adam steps (to cross-entropy "
            f"{fit['final_loss']:.3f}) to a random linear teacher's labels on the synthetic "
            "features, to give it trained-like margins (benchmark only)"
        )

    # -- Lipschitz numbers -------------------------------------------------------------
    progress(f"Lipschitz: guaranteed bound and {lipschitz_iters}-step power estimate")
    t0 = time.perf_counter()
    lip = lipschitz_report(model, estimate=True, iters=lipschitz_iters)
    t_lip = time.perf_counter() - t0
    lip_bound = float(lip["upper_bound"])

    # -- certificates ------------------------------------------------------------------
    variants: list[tuple[str, int | None]] = [(head_spec.certificate, None)]
    if top_k is not None:
        variants.append((head_spec.certificate, top_k))
    certs = []
    for cert_name, k in variants:
        label = cert_name if k is None else f"{cert_name} (top-{k})"
        progress(f"certificate {label}: prepare + {n} inputs")
        certifier = registry.component("certificate", cert_name).build()
        t_prep, _ = _timed(lambda c=certifier: c.prepare(head, None), device)
        parts = []
        t_cert = 0.0
        for i in range(0, n, batch_size):
            chunk = features[i:i + batch_size]
            dt, res = _timed(lambda c=certifier, y=chunk: c.certify(head, y, top_k=k), device)
            t_cert += dt
            parts.append(res)
        from .certificates import CertifyResult

        res = CertifyResult.concatenate(parts)
        radius_input = res.radius / lip_bound
        certs.append({
            "method": cert_name,
            "top_k": k,
            "exact_classes": bool(res.exact_classes),
            "prepare_s": t_prep,
            "certify_s": t_cert,
            "inputs_per_s": n / t_cert if t_cert > 0 else None,
            "feature_radius": _quantiles(res.radius),
            "input_radius": _quantiles(radius_input),
            "nonzero_fraction": float((res.radius > 0).double().mean()),
            "notes": list(res.notes),
            "stats": res.stats,
        })
    return {
        "benchmark": "certify",
        "environment": env,
        "settings": {
            "arch": (config.get("arch") or {}).get("name"),
            "conv": (config.get("conv") or {}).get("name"),
            "pool": (config.get("pool") or {}).get("name"),
            "head": head_name,
            "num_classes": num_classes,
            "input_shape": list(shape),
            "n": n, "batch_size": batch_size, "top_k": top_k,
            "weights": source,
            "inputs": "synthetic: uniform [0,1] images",
            "fit_head": fit,
        },
        "parameters": count_parameters(model),
        "power_refresh_s": t_refresh,
        "power_refresh_steps": refresh_steps,
        "features": {
            "seconds": t_feat,
            "inputs_per_s": n / t_feat,
            "feature_dim": int(features.shape[1]),
            "mode": "eval (evaluation terms), no_grad",
        },
        "lipschitz": {
            "upper_bound": lip_bound,
            "upper_bound_s": lip["time_s"]["upper_bound"],
            "estimate": lip["estimate"],
            "estimate_s": lip["time_s"]["estimate"],
            "estimate_iters": lipschitz_iters,
            "report_total_s": t_lip,
        },
        "certificates": certs,
        "notes": notes,
    }


# ------------------------------------------------------------------------------------------
# lip bench profile
# ------------------------------------------------------------------------------------------
_CONV_OP = re.compile(r"^(aten|mkldnn)::.*conv(?!ert)", re.IGNORECASE)
#: record_function label the SOC layers put around each convolution they compute (conv2d,
#: the fused convolution-plus-add of a Horner step, 1×1 convolutions done as matrix products)
_CONV_LABELS = frozenset({"lipcli::soc_convolution"})
#: names of cuDNN/CUTLASS convolution kernels (forward, data and weight gradients), used only
#: for kernels whose launching operator the profiler did not record
_CONV_KERNEL = re.compile(r"conv|fprop|dgrad|wgrad|implicit_?gemm|cudnn", re.IGNORECASE)
_POWER_OPS = frozenset({
    "aten::mv", "aten::mm", "aten::matmul", "aten::addmv", "aten::addmv_", "aten::dot",
    "aten::vdot", "aten::bmm", "aten::linalg_vector_norm", "aten::norm", "aten::addmm",
    "aten::frobenius_norm", "aten::linalg_norm",
})

CATEGORY_LABELS: dict[str, str] = {
    "convolution": "convolution (forward, input and weight gradients)",
    "conv_power": "conv layers: power iteration / σ (mm, mv, norm)",
    "conv_other": "conv layers: other forward (skew, series adds, unshuffle, pad, copies)",
    "activation": "activations (MaxMin) forward",
    "pool": "pooling forward",
    "head": "head forward",
    "normalize": "input normalisation forward",
    "other_forward": "other forward (flatten, glue)",
    "loss": "loss (cross-entropy) forward",
    "backward": "backward, non-convolution",
    "optimizer": "optimizer (zero_grad, clipping, SGD step)",
    "unlabelled": "operators outside the labelled phases",
    "untracked": "time outside profiled operators (Python, launch gaps)",
    "unattributed_kernels": "device kernels without a recorded launch, not named as convolutions",
}


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


def bench_profile(
    arch: str = "lipconvnet-20",
    *,
    conv: str = FAST_CONV,
    batch_size: int = 128,
    steps: int = 3,
    warmup: int = 1,
    device: torch.device | str = "cpu",
    width: int = 32,
    head: str = "lln",
    pool: str = "max",
    num_classes: int = 10,
    seed: int = 0,
    top_ops: int = 15,
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """Share of training-step time per category, convolution versus everything else.

    CPU: each operator's self CPU time, plus "untracked" = profiled wall time minus the sum
    of operator self times.  CUDA: each kernel's device time, attributed through the CPU
    operator that launched it; shares are of total kernel time (GPU busy time), and the
    wall time and GPU idle time are reported beside them.
    """
    from torch.profiler import ProfilerActivity, profile

    _check_positive(batch_size=batch_size, steps=steps, width=width)
    if warmup < 0:
        raise LipUsageError(f"warmup must be >= 0, got {warmup}")
    device = torch.device(device)
    env = environment(device)
    model = build_model(arch, conv=conv, head=head, pool=pool, width=width,
                        num_classes=num_classes, seed=seed).to(device)
    step = TrainStep(model, _clip_for(head))
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
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    progress(f"profile {arch} ({conv}): {steps} profiled steps")
    with _label_modules(model), profile(activities=activities) as prof:
        _sync(device)
        t0 = time.perf_counter()
        for i in range(steps):
            step(*batches[warmup + i], labels=True)
        _sync(device)
        wall_us = (time.perf_counter() - t0) * 1e6
    cpu_us: dict[str, float] = {k: 0.0 for k in CATEGORY_LABELS}
    dev_us: dict[str, float] = {k: 0.0 for k in CATEGORY_LABELS}
    per_op: dict[tuple[str, str], list[float]] = {}
    per_node: dict[str, list[float]] = {}
    device_events_us = 0.0  # all device-side kernel/memcpy events
    events = list(prof.events())
    cpu_events: list[Any] = []
    kernels: list[Any] = []
    for evt in events:
        if getattr(evt, "device_type", None) is not None and "CPU" not in str(evt.device_type):
            kernels.append(evt)
            continue
        cpu_events.append(evt)
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
    use_device = device.type == "cuda"
    times_us = dev_us if use_device else cpu_us
    tracked = sum(times_us.values())
    if not use_device:
        times_us["untracked"] = max(0.0, wall_us - tracked)
    denom = wall_us if not use_device else tracked
    if denom <= 0:
        raise RuntimeError("the profiler recorded no time")
    rows = [
        {"category": k, "label": CATEGORY_LABELS[k], "ms_per_step": v / 1e3 / steps,
         "share_pct": 100.0 * v / denom}
        for k, v in times_us.items() if v > 0
    ]
    rows.sort(key=lambda r: -r["ms_per_step"])
    conv_share = 100.0 * times_us["convolution"] / denom
    ops = sorted(per_op.items(), key=lambda kv: -(kv[1][1] if use_device else kv[1][0]))
    top = [
        {"op": name, "category": cat,
         "ms_per_step": (d if use_device else c) / 1e3 / steps,
         "share_pct": 100.0 * (d if use_device else c) / denom}
        for (name, cat), (c, d) in ops[:top_ops]
    ]
    nodes = sorted(per_node.items(), key=lambda kv: -(kv[1][1] if use_device else kv[1][0]))
    backward_nodes = [
        {"node": name, "ms_per_step": (d if use_device else c) / 1e3 / steps,
         "share_pct": 100.0 * (d if use_device else c) / denom}
        for name, (c, d) in nodes[:top_ops]
    ]
    result: dict[str, Any] = {
        "benchmark": "profile",
        "environment": env,
        "settings": {
            "arch": arch, "conv": conv, "head": head, "pool": pool, "width": width,
            "batch_size": batch_size, "steps": steps, "warmup": warmup,
            "num_classes": num_classes, "input_shape": list(CIFAR_SHAPE),
            "time_basis": (
                "CUDA kernel time (self device time of launching operators)" if use_device
                else "operator self CPU time; shares are of profiled wall time"
            ),
            "convolution_rule": (
                "an operator counts as convolution when it or an operator it was called "
                "from is a convolution op (aten:: conv2d, convolution, "
                "convolution_backward, mkldnn/cudnn/slow conv; mkldnn:: fused "
                "convolution-plus-add) or lies inside a SOC layer's "
                "'lipcli::soc_convolution' range (its convolutions, including the Horner "
                "add fused into them and 1x1 convolutions on 1x1 images computed as "
                "matrix products)"
            ),
        },
        "step_ms_unprofiled_median": statistics.median(plain) * 1e3,
        "step_ms_profiled": wall_us / 1e3 / steps,
        "categories": rows,
        "convolution_share_pct": conv_share,
        "convolution_share_of_operators_pct": 100.0 * times_us["convolution"] / tracked
        if tracked > 0 else None,
        "top_operators": top,
        "backward_non_convolution_by_node": backward_nodes,
    }
    if use_device:
        result["gpu_busy_ms_per_step"] = tracked / 1e3 / steps
        result["gpu_idle_ms_per_step"] = max(0.0, wall_us - tracked) / 1e3 / steps
        result["cpu_operator_ms_per_step"] = sum(cpu_us.values()) / 1e3 / steps
        result["device_events_ms_per_step"] = device_events_us / 1e3 / steps
        result["kernels_without_launch_record"] = [
            {"kernel": name, "ms_per_step": us / 1e3 / steps, "category": cat}
            for (name, cat), (us,) in sorted(unlinked.items(), key=lambda kv: -kv[1][0])[:top_ops]
        ]
    return result
