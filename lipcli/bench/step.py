"""The training step ``lip bench`` times: the recipe's optimiser, synthetic batches, one
step (:class:`RecipeStep`, replayed from a CUDA graph where possible), its reported settings
(:func:`step_settings`) and the synchronised timer."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.bench.reports.common import GraphUse, StepSettings
from lipcli._util.constants import CIFAR_SHAPE, CIFAR_TRAIN_IMAGES
from lipcli.train.config import OPTIMIZER_LR, TrainConfig
from lipcli.host.models import DEFAULTS
from lipcli.host.plugins import get_registry, parse_component_choice
from lipcli.train import recipe_sgd, weight_decay_groups
from lipcli.train.cuda_graphs import GraphedStep, graph_unsupported_reason
from lipcli.compiling import GRAPHING_MODES, compiled_or_none, measuring

#: images in one CIFAR-10 / CIFAR-100 training epoch
EPOCH_IMAGES = CIFAR_TRAIN_IMAGES
#: recipe optimiser (SPEC §6): the defaults of :class:`lipcli.train.config.TrainConfig`
_RECIPE = TrainConfig()
RECIPE_LR = OPTIMIZER_LR[_RECIPE.optimizer]
RECIPE_MOMENTUM, RECIPE_WEIGHT_DECAY = _RECIPE.momentum, _RECIPE.weight_decay


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
                 cuda_graphs: bool = False, compile: bool | None = False,
                 compile_mode: str = "default") -> None:
        self.model = model.train()
        self.optimizer = recipe_optimizer(model)
        self.clip_grad = clip_grad
        self.graphed: Any = None
        self.graph_reason: str | None = "off"
        device = next(model.parameters()).device
        #: the forward, compiled in ``compile_mode`` where ``compile`` (None: the device's
        #: default, :data:`lipcli.compiling.AUTO_COMPILE`); its compile time is kept apart
        self.compiled = compiled_or_none(model, compile, compile_mode, device, "the benchmarked step")
        self.forward: Callable[[torch.Tensor], torch.Tensor] = self.compiled or model
        if cuda_graphs and self.compiled is not None and self.compiled.mode in GRAPHING_MODES:
            self.graph_reason = f"compile mode {self.compiled.mode} replays CUDA graphs itself"
        elif cuda_graphs:
            self.graph_reason = graph_unsupported_reason(device, self.optimizer)
            if self.graph_reason is None:
                self.graphed = GraphedStep(self._body, self.optimizer, device)

    def _body(self, x: torch.Tensor, y: torch.Tensor,
              rf: Callable[[str], Any] | None = None) -> tuple[torch.Tensor]:
        rf = rf or _null_label
        with rf("bench::forward"):
            logits = self.forward(x)
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
        with measuring(self.compiled):
            graphed = self.graphed
            if graphed is not None and not (labels or eager):
                return graphed(x, y)[0]
            rf = torch.autograd.profiler.record_function if labels else _null_label
            with rf("bench::optimizer"):
                # once a graph holds the gradients they are zeroed in place, not released
                self.optimizer.zero_grad(set_to_none=graphed is None or not graphed.captured)
            return self._body(x, y, rf)[0]

    def compile_s(self) -> float:
        """Seconds spent compiling the step (forward and backward; 0 when eager)."""
        return 0.0 if self.compiled is None else self.compiled.compile_s

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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - t0, result
