"""Shared pieces of ``lip bench``: constants, architecture parsing, device and environment
report, model twins, the recipe training step and synthetic batches."""

from __future__ import annotations

import inspect
import math
import os
import platform
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.version import __version__
from lipcli.bench.results import Environment, GpuEnvironment, GraphUse, StepSettings
from lipcli.builtins.lipconvnet import DEPTHS
from lipcli._util.constants import CIFAR_SHAPE, CIFAR_TRAIN_IMAGES
from lipcli.host.plugins import natural_key
from lipcli.numerics.precision import tf32_state
from lipcli.sdk.errors import LipUsageError, SettingError
from lipcli.train.config import OPTIMIZER_LR, TrainConfig
from lipcli.host.models import DEFAULTS, create_model
from lipcli.host.plugins import get_registry, parse_component_choice
from lipcli.train import recipe_sgd, weight_decay_groups
from lipcli.train.cuda_graphs import GraphedStep, graph_unsupported_reason

#: LipConvnet depths of paper Table 1 (SOC layers = depth + 1): every registered depth
DEFAULT_DEPTHS: tuple[int, ...] = DEPTHS
#: images in one CIFAR-10 / CIFAR-100 training epoch
EPOCH_IMAGES = CIFAR_TRAIN_IMAGES
#: the two convolutions compared in Table 1
FAST_CONV, EXACT_CONV = "soc-fast", "soc"
#: recipe optimiser (SPEC §6): the defaults of :class:`lipcli.train.config.TrainConfig`
_RECIPE = TrainConfig()
RECIPE_LR = OPTIMIZER_LR[_RECIPE.optimizer]
RECIPE_MOMENTUM, RECIPE_WEIGHT_DECAY = _RECIPE.momentum, _RECIPE.weight_decay

Progress = Callable[[str], None]


def _no_progress(_msg: str) -> None:
    return None


# ------------------------------------------------------------------------------------------
# inputs: architectures, devices, environment
# ------------------------------------------------------------------------------------------
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


def step_settings(batch_size: int) -> StepSettings:
    """Report fields shared by the training-step benchmarks: inputs, epoch size, recipe."""
    return StepSettings(
        input_shape=list(CIFAR_SHAPE),
        epoch_images=EPOCH_IMAGES,
        steps_per_epoch=math.ceil(EPOCH_IMAGES / batch_size),
        optimizer=(
            f"SGD lr {RECIPE_LR}, momentum {RECIPE_MOMENTUM}, weight decay "
            f"{RECIPE_WEIGHT_DECAY} on >=2-D non-head-excluded parameters (the paper's recipe)"
        ),
        step="zero_grad + forward + cross-entropy + backward + optimizer step",
        epoch_time=f"median step time x ceil({EPOCH_IMAGES} / batch); data loading excluded",
        inputs="synthetic: uniform [0,1] images, uniform random labels; random init",
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_positive(**values: int) -> None:
    """A :class:`SettingError` (naming the argument) for the first value below 1."""
    for key, value in values.items():
        if value < 1:
            raise SettingError(key, f"{key} must be at least 1, got {value}")


def _check_step_settings(*, batch_size: int, steps: int, warmup: int, width: int) -> None:
    """The usage checks shared by ``lip bench train`` and ``lip bench profile``."""
    _check_positive(batch_size=batch_size, steps=steps, width=width)
    if warmup < 0:
        raise SettingError("warmup", f"warmup must be >= 0, got {warmup}")


def arch_settings(per_arch: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments a multi-architecture benchmark passes to its per-architecture
    function ``per_arch``: ``options`` over ``per_arch``'s defaults (written once, there), the
    step settings checked first (an unknown name is a ``TypeError``)."""
    bound = inspect.signature(per_arch).bind_partial(**options)
    bound.apply_defaults()
    s = dict(bound.arguments)
    _check_step_settings(batch_size=s["batch_size"], steps=s["steps"], warmup=s["warmup"],
                         width=s["width"])
    return s


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


class RecipeStep:
    """One recipe training step of ``model``: zero_grad, forward, CE, backward, SGD step.

    Gradient clipping (norm 1.0) is applied for MLP heads, as in the reference's CRC-Lip
    runs (SPEC §6); the CRC-Lip feature attack and curvature penalty (SPEC §4) are not
    part of this step (Table 1 times plain LLN training).  With ``cuda_graphs`` the step is
    replayed from a CUDA graph where possible (:class:`lipcli.train.cuda_graphs.GraphedStep`;
    :attr:`graph_reason` says why not); a call with ``labels`` (the profiler's) or ``eager``
    always runs eagerly.
    """

    def __init__(self, model: nn.Module, clip_grad: float | None = None,
                 cuda_graphs: bool = False) -> None:
        self.model = model.train()
        self.optimizer = recipe_optimizer(model)
        self.clip_grad = clip_grad
        self.graphed: Any = None
        self.graph_reason: str | None = "off"
        if cuda_graphs:
            device = next(model.parameters()).device
            self.graph_reason = graph_unsupported_reason(device, self.optimizer)
            if self.graph_reason is None:
                self.graphed = GraphedStep(self._body, self.optimizer, device)

    def _body(self, x: torch.Tensor, y: torch.Tensor,
              rf: Callable[[str], Any] | None = None) -> tuple[torch.Tensor]:
        rf = rf or _null_label
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
        return (loss.detach(),)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, labels: bool = False,
                 eager: bool = False) -> torch.Tensor:
        graphed = self.graphed
        if graphed is not None and not (labels or eager):
            return graphed(x, y)[0]
        rf = torch.autograd.profiler.record_function if labels else _null_label
        with rf("bench::optimizer"):
            # once a graph holds the gradients they are zeroed in place, not released
            self.optimizer.zero_grad(set_to_none=graphed is None or not graphed.captured)
        return self._body(x, y, rf)[0]

    def graph_summary(self) -> GraphUse:
        """Whether the step was replayed from a CUDA graph (and why not)."""
        if self.graphed is not None:
            return GraphUse.of(self.graphed.summary())
        return GraphUse(captured=False, reason=self.graph_reason)


@contextmanager
def _null_label(_name: str) -> Iterator[None]:
    yield


def _clip_for(head: str) -> float | None:
    """The gradient-norm clipping that ``lip train`` uses with ``head`` by default: the
    ``grad_clip`` of the head's default loss (``HeadSpec.loss``), ``None`` for none (0)."""
    reg = get_registry()
    spec = reg.get("head", parse_component_choice(head or DEFAULTS["head"])[0])
    return float(reg.get("loss", spec.loss).grad_clip) or None


# ------------------------------------------------------------------------------------------
# timing and counting
# ------------------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - t0, result


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


