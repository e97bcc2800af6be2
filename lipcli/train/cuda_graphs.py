"""CUDA-graph replay of a whole training step (``lip train --cuda-graphs``, ``lip bench train``).

A training step of a LipConvnet launches several hundred small kernels; at batch 128 on a
fast GPU the host launching them, not the GPU, sets the pace.  :class:`GraphedStep` records
the step once — zero_grad, forward, loss, backward, gradient clipping and the optimiser
step — as a CUDA graph over static input/label buffers and then replays it each step: one
launch instead of hundreds, the same kernels in the same order, so the same values.

How (see the PyTorch CUDA-graphs notes for the general recipe):

* the first ``warmup`` steps of the batch shape run eagerly on a side stream (real steps:
  they train, they are not thrown away) so that lazy initialisation (cuBLAS/cuDNN handles,
  the optimiser's momentum buffers) happens outside the capture;
* the next step of that shape is captured with the gradients set to ``None`` (so backward
  allocates them from the graph's private memory and, on replay, overwrites rather than
  accumulates) and replayed at once; every later step of that shape copies its batch into
  the static buffers and replays;
* the learning rate is a device tensor per parameter group while capturing (the fused
  optimiser reads it on the GPU); before a replay it is refilled only when the schedule
  changed the group's (float) ``lr`` — the optimiser's state dict and checkpoints keep
  floats;
* another batch shape (the last, partial batch of an epoch) runs eagerly, with the
  gradients zeroed in place so the graph's gradient buffers stay the parameters'
  gradients: no data is dropped;
* a capture that fails (an operation that waits for the GPU, such as ``torch.unique``, or
  any other capture error) is not retried: the step runs eagerly from then on and
  :attr:`GraphedStep.reason` says why in one line.

Where a graph is not possible at all, :func:`graph_unsupported_reason` says why before
anything is built (CPU, several processes, float16 AMP with its gradient scaler, an
optimiser that cannot take a device learning rate).  The step function must not
synchronise with the host and must return tensors (or tuples/lists/dicts of them): after a
replay they are the graph's static outputs, overwritten by the next replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lipcli.train.config import GRAPH_MODES  # the values of ``cuda_graphs``, declared with the setting

#: eager steps of the captured shape before the capture (lazy initialisation)
DEFAULT_WARMUP = 2


def check_graph_mode(mode: str) -> str:
    """``mode`` lower-cased if it is one of :data:`GRAPH_MODES`; else ``ValueError``."""
    value = str(mode).strip().lower()
    if value not in GRAPH_MODES:
        raise ValueError(f"cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    return value


def _optimizer_reason(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer`` cannot be replayed from a graph (None when it can)."""
    defaults = optimizer.defaults
    if isinstance(optimizer, torch.optim.SGD):
        if not defaults.get("fused"):
            return "the SGD optimiser is not the fused one (its learning rate would be read on the host)"
        return None
    if defaults.get("capturable"):
        return None
    return f"optimiser {type(optimizer).__name__} is not capturable"


def graph_unsupported_reason(
    device: torch.device | str,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    distributed: bool = False,
    grad_scaler: bool = False,
) -> str | None:
    """One line saying why a training step on ``device`` cannot be a CUDA graph, or None."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (training on {device.type})"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if distributed:
        return "not with several processes (DDP synchronises gradients outside a graph)"
    if grad_scaler:
        return "not with float16 mixed precision (the gradient scaler checks for overflow on the host)"
    if optimizer is not None:
        return _optimizer_reason(optimizer)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class _CudaCapture:
    """The real backend: a ``torch.cuda.CUDAGraph`` and its side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.graph: Any = None

    def run_warmup(self, fn: Callable[[], Any]) -> Any:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return out

    def capture(self, fn: Callable[[], Any]) -> Any:
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (the data loader's pin-memory thread)
        # must not invalidate the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn()
        self.graph = graph
        return out

    def replay(self) -> None:
        self.graph.replay()

    def release(self) -> None:
        self.graph = None


class GraphedStep:
    """A training step replayed from a CUDA graph (see the module docstring).

    ``step(images, labels)`` runs forward, loss, backward and the optimiser step (NOT
    zero_grad: this class does it) and returns tensors.  ``GraphedStep(step, optimizer,
    device)(images, labels)`` returns ``step``'s outputs (the static ones after a replay).
    ``capture_backend`` replaces the CUDA backend (tests run the bookkeeping on CPU with a
    backend whose "replay" re-runs the recorded function).
    """

    def __init__(self, step: Callable[..., Any], optimizer: torch.optim.Optimizer,
                 device: torch.device | str, *, warmup: int = DEFAULT_WARMUP,
                 capture_backend: Any = None) -> None:
        self.step = step
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.warmup = max(0, int(warmup))
        self.backend = capture_backend if capture_backend is not None else _CudaCapture(self.device)
        self.reason: str | None = None  # why the step is (now) eager; None while graphs are used
        self.shape: tuple | None = None  # the captured input shapes
        self.captured = False
        self.replays = 0
        self.eager_steps = 0
        self._seen = 0
        self._static_in: list[torch.Tensor] = []
        self._static_out: Any = None
        self._lr: list[tuple[dict[str, Any], torch.Tensor, float]] = []

    # -- the step -------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether steps of the captured shape are (or will be) replayed from the graph."""
        return self.reason is None

    def __call__(self, *inputs: torch.Tensor) -> Any:
        shape = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if self.reason is not None:
            return self._eager(inputs)
        if self.shape is None:
            self.shape = shape
        if shape != self.shape:  # e.g. the last, partial batch of an epoch
            return self._eager(inputs)
        if self.captured:
            return self._replay(inputs)
        if self._seen < self.warmup:
            self._seen += 1
            self.eager_steps += 1
            return self.backend.run_warmup(lambda: self._eager_body(inputs))
        return self._capture_and_replay(inputs)

    def _eager_body(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        # after a capture the gradients must stay the graph's buffers: zero them in place
        self.optimizer.zero_grad(set_to_none=not self.captured)
        return self.step(*inputs)

    def _eager(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        self.eager_steps += 1
        return self._eager_body(inputs)

    def _capture_and_replay(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        self._static_in = [t.detach().clone() for t in inputs]
        self._lr = [(g, torch.tensor(float(g["lr"]), dtype=torch.float32, device=self.device),
                     float(g["lr"])) for g in self.optimizer.param_groups]
        floats = [g["lr"] for g in self.optimizer.param_groups]
        self.optimizer.zero_grad(set_to_none=True)
        failure: str | None = None
        try:
            for group, tensor, _ in self._lr:
                group["lr"] = tensor
            self._static_out = self.backend.capture(lambda: self.step(*self._static_in))
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            failure = "capture failed: " + _first_line(exc)
        finally:
            for group, value in zip(self.optimizer.param_groups, floats):
                group["lr"] = value
        if failure is not None:
            self.reason = failure
            self._release()
            return self._eager(inputs)
        self.captured = True
        return self._replay(inputs, copy=False)

    def _replay(self, inputs: tuple[torch.Tensor, ...], copy: bool = True) -> Any:
        if copy:
            for static, t in zip(self._static_in, inputs):
                static.copy_(t, non_blocking=True)
        for i, (group, tensor, last) in enumerate(self._lr):
            lr = float(group["lr"])
            if lr != last:
                tensor.fill_(lr)
                self._lr[i] = (group, tensor, lr)
        self.backend.replay()
        self.replays += 1
        return self._static_out

    def _release(self) -> None:
        self.backend.release()
        self._static_in, self._static_out, self._lr = [], None, []
        self.captured = False

    def summary(self) -> dict[str, Any]:
        """What happened: whether a graph was used, replays, eager steps, the reason if not."""
        return {"captured": self.captured, "replays": self.replays,
                "eager_steps": self.eager_steps, "reason": self.reason}
