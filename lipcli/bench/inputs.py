"""What a ``lip bench`` run reads before it measures: the architectures asked for
(:func:`parse_archs`), the settings of the training-step benchmarks (:func:`arch_settings`)
and the environment the numbers are measured in (:func:`environment`)."""

from __future__ import annotations

import inspect
import os
import platform
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import torch

from lipcli.version import __version__
from lipcli.bench.reports.common import Environment, GpuEnvironment
from lipcli.builtins.lipconvnet import DEPTHS
from lipcli.numerics.precision import tf32_state
from lipcli.sdk.errors import LipUsageError
from lipcli.host.plugins import natural_key

#: LipConvnet depths of paper Table 1 (SOC layers = depth + 1): every registered depth
DEFAULT_DEPTHS: tuple[int, ...] = DEPTHS

Progress = Callable[[str], None]


def _no_progress(_msg: str) -> None:
    return None


def parse_archs(text: str | Sequence[str], available: Sequence[str]) -> list[str]:
    """``"5,10"`` / ``"lipconvnet-5,lipconvnet-10"`` (mixed is fine) -> full names.

    A name may carry inline parameters, ``liresnet:depth=4,width=16``: a ``key=value`` item
    continues the parameters of the name before it.

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
        if "=" in item and ":" not in item and names and ":" in names[-1]:
            names[-1] += f",{item}"  # key=value continuing the inline parameters before it
            continue
        name = f"lipconvnet-{int(item)}" if item.isdigit() else item
        if name.split(":", 1)[0] not in available:
            valid = sorted(available, key=natural_key)
            raise LipUsageError(
                f"unknown architecture {item!r}; valid: {', '.join(valid) or 'none installed'}"
                " (a bare number n means lipconvnet-n)"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise LipUsageError("no architecture given")
    return names


def soc_layers(arch: str) -> int | None:
    """SOC layers of ``lipconvnet-n`` (``n + 1``, the paper's Table 1 row label)."""
    m = re.fullmatch(r"lipconvnet-(\d+)", arch)
    return int(m.group(1)) + 1 if m else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def environment(device: torch.device) -> Environment:
    """Where the numbers were measured: device, threads, versions, current load."""
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = GpuEnvironment(
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            # (convolution, matmul) float32 precision: "tf32"/"ieee"/"none" (torch >= 2.9) or
            # the legacy allow_tf32 flags
            fp32_precision=list(tf32_state()),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    return Environment(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model(),
        torch=torch.__version__,
        python=platform.python_version(),
        lipcli=__version__,
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        load_average_1m_5m_15m=_load_average(),
        gpu=gpu,
    )


def record_load_after(env: Environment) -> None:
    """Add the 1/5/15-minute load averages after a run to an :func:`environment` report
    (where the system gives them)."""
    env.load_average_after = _load_average()


def _check_step_settings(*, batch_size: int, steps: int, warmup: int, width: int, num_classes: int = 10) -> None:
    """The usage checks shared by ``lip bench train`` and ``lip bench profile`` (their declared
    ranges: :class:`lipcli.bench.options.StepBenchOptions`; the classes within a model file's
    limit)."""
    from lipcli.bench.options import StepBenchOptions, check_settings

    check_settings(StepBenchOptions, batch_size=batch_size, steps=steps, warmup=warmup, width=width,
                   classes=num_classes)


def arch_settings(per_arch: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments a multi-architecture benchmark passes to its per-architecture
    function ``per_arch``: ``options`` over ``per_arch``'s defaults (written once, there), the
    step settings checked first (an unknown name is a ``TypeError``)."""
    bound = inspect.signature(per_arch).bind_partial(**options)
    bound.apply_defaults()
    s = dict(bound.arguments)
    _check_step_settings(batch_size=s["batch_size"], steps=s["steps"], warmup=s["warmup"],
                         width=s["width"], num_classes=s.get("num_classes", 10))
    return s
