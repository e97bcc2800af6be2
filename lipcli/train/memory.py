"""The memory estimate that refuses a training run before it starts (:func:`check_fits`).

The estimate is a lower figure of what one training step needs, computed as

* parameters, their gradients and the optimiser's state: ``(2 + slots) × parameter bytes``
  (``slots``: 1 for SGD with momentum, 0 without, 2 for AdamW and NAdam);
* the activations saved for backward, measured on a copy of the model by one forward pass on 1
  and one on 2 zero images (the storages that autograd saves, parameters left out): the
  difference is the per-image share, which is multiplied by this process's batch; the rest is
  the part that does not grow with the batch (e.g. weights a layer derives by many iterations).

The copy runs with the random number generators forked, so the run itself is untouched.  The
measurement stops as soon as its count exceeds the available memory
(:func:`lipcli._util.memory.available_memory`), so a run that cannot fit is refused quickly.
The figure leaves out temporaries, the data and the allocator's overhead: a run it passes may
still run out, and then the failing step says so (:meth:`lipcli.train.loop.TrainingLoop.out_of_memory`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli._util.memory import available_memory
from lipcli.sdk.errors import is_allocation_failure
from lipcli.train.errors import TrainError

#: what sizes a model and how to go on when building it runs out of memory (nothing is written
#: then): templates of :func:`lipcli.sdk.errors.memory_step`
MODEL_SIZED = ("{width} and the parameters of {conv} and the other components",
               "lower {width} or the components' parameters and run again")
#: optimiser state tensors per parameter (the ones the optimisers of ``--optimizer`` keep)
_SLOTS = {"adamw": 2, "nadam": 2}
_MIB = 2**20


class _Full(Exception):
    """The saved activations passed the available memory (the measurement stops)."""


@dataclass
class MemoryEstimate:
    """Bytes of one training step: parameters with gradients and optimiser state, activations
    that do not grow with the batch, activations per image, and the batch (per process)."""

    weights: int
    fixed: int
    per_image: int
    batch: int
    #: the measurement stopped: the activations passed the memory left beside the weights
    exceeded: bool = False
    #: the activations were measured (not when the weights alone pass the memory available)
    measured: bool = True

    @property
    def total(self) -> int:
        return self.weights + self.fixed + self.per_image * self.batch


def _saved_bytes(model: nn.Module, images: torch.Tensor, limit: int | None) -> int:
    """Bytes of the distinct storages autograd saves in ``model(images)`` (parameters and
    buffers left out); raises :class:`_Full` once they pass ``limit``."""
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        try:
            storage = t.untyped_storage()
        except RuntimeError:  # a tensor without storage
            return t
        key = storage.data_ptr()
        if key not in seen and key not in skip:
            seen.add(key)
            total += storage.nbytes()
            if limit is not None and total > limit:
                raise _Full
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(images)
    return total


def build_budget() -> int | None:
    """Bytes the model's construction may take on the CPU (where it is built): a third of the
    memory available now (:func:`lipcli._util.memory.cpu_available`; a step needs at least
    parameters, gradients and one optimiser slot, and construction its temporaries), ``None``
    when unknown."""
    from lipcli._util.memory import cpu_available

    free, _source = cpu_available()
    return None if free is None else free // 3


def estimate_step(model: nn.Module, image_shape: tuple[int, ...], batch: int, optimizer: str,
                  momentum: float, device: torch.device, limit: int | None) -> MemoryEstimate | None:
    """The estimate (see the module) for ``batch`` images per step; ``None`` when the model
    cannot be copied or measured (no refusal then)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    slots = _SLOTS.get(optimizer, 1 if momentum else 0)
    weights *= 2 + slots
    if limit is not None and weights >= limit:  # no measurement needed (nor a copy made)
        return MemoryEstimate(weights, 0, 0, batch, measured=False)
    room = None if limit is None else limit - weights
    try:
        probe = copy.deepcopy(model).train()
    except Exception:  # noqa: BLE001 - a module that cannot be copied: no estimate
        return None
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            one = _saved_bytes(probe, torch.zeros((1, *image_shape), device=device), room)
            two = _saved_bytes(probe, torch.zeros((2, *image_shape), device=device), room)
    except (_Full, MemoryError, RuntimeError) as exc:
        if not (isinstance(exc, _Full) or is_allocation_failure(exc)):
            return None  # a model this probe cannot run: the run reports its own errors
        return MemoryEstimate(weights, room or 0, 0, batch, exceeded=True)
    finally:
        del probe
    per_image = max(0, two - one)
    return MemoryEstimate(weights, max(0, one - per_image), per_image, batch)


def check_fits(model: nn.Module, cfg: Any, image_shape: tuple[int, ...], ctx: Any, device: torch.device) -> None:
    """Refuse (:class:`TrainError`, one line) a run whose estimate exceeds the memory
    available on ``device``; processes of a run on one host's CPU share its memory.  Every
    process of a multi-process run measures; any refusal stops all of them."""
    available, source = available_memory(device)
    share = ctx.local_world_size if device.type == "cpu" else 1
    limit = None if available is None else available // max(1, share)
    estimate = None
    if limit is not None:
        estimate = estimate_step(model, image_shape, max(1, cfg.batch_size // ctx.world_size),
                                 cfg.optimizer, cfg.momentum, device, limit)
    refuse = estimate is not None and limit is not None and (estimate.exceeded or estimate.total > limit)
    refusing = int(refuse)
    if ctx.distributed:  # every process stops when one does; one of them says why
        refusing = int(float(ctx.all_reduce_sum(torch.tensor([float(refuse)], device=device))[0]))
    if not refusing:
        return
    if estimate is None or limit is None or not refuse:
        error = TrainError("another process of the run does not fit in memory")
        error.silent = True
    else:
        error = TrainError(_refusal(estimate, limit, source, share))
        error.silent = refusing == ctx.world_size and not ctx.is_main
    raise error


def _refusal(estimate: MemoryEstimate, limit: int, source: str, share: int) -> str:
    """The one-line refusal: estimate, its parts, the memory available and how it was found."""
    mib = lambda n: f"{n / _MIB:,.0f} MiB" if n >= 10 * _MIB else f"{n / _MIB:.2g} MiB"  # noqa: E731
    weights = f"parameters, gradients and optimiser state {mib(estimate.weights)}"
    if not estimate.measured:
        needs = f"at least {mib(estimate.weights)} ({weights} alone)"
    elif estimate.exceeded:
        needs = (f"more than {mib(limit)} ({weights}; the activations saved for backward by one "
                 "forward pass on a single image pass the rest)")
    else:
        needs = (f"about {mib(estimate.total)} at least ({weights}, activations saved for backward "
                 f"{mib(estimate.fixed)} + {mib(estimate.per_image)} per image x {estimate.batch} images, "
                 "measured by forward passes on 1 and 2 images)")
    where = f"{mib(limit)} available ({source}" + (f", shared by {share} processes)" if share > 1 else ")")
    return (f"the run does not fit in memory: one training step needs {needs} but {where}; "
            "lower {batch_size} or {width} or the components' parameters (e.g. {conv} iterations)")
