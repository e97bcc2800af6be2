"""Peak memory of one training step (CUDA allocator statistics or the CPU resident-set
high-water mark) and the activation memory saved for backward."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Sequence
import torch

from lipcli.bench.step import RecipeStep, _sync
from lipcli.bench.reports import StepMemory


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
    step: RecipeStep, x: torch.Tensor, y: torch.Tensor, device: torch.device
) -> StepMemory:
    """Peak memory of ONE training step, measured in isolation (outside the timed rounds).

    * CUDA: ``torch.cuda.max_memory_allocated() - memory_allocated()`` before the step
      (peak of the caching allocator's live tensors above the resident model + optimiser
      state), after ``reset_peak_memory_stats``; the absolute peak is also given.
    * CPU: the kernel's resident-set high-water mark above the RSS before the step
      (``VmHWM - VmRSS``, Linux ``/proc/self/status``, after ``malloc_trim`` and a reset of
      the high-water mark through ``/proc/self/clear_refs``); page-granular and includes
      allocator fragmentation.
    * Both: bytes of activations saved for backward (:class:`SavedTensorMeter`).

    The step runs eagerly (a CUDA graph's replay allocates nothing).
    """
    model = step.model
    exclude = [*model.parameters(), *model.buffers()]
    meter = SavedTensorMeter(exclude)
    gc.collect()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        with meter.hooks():
            step(x, y, eager=True)
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        method = "torch.cuda.max_memory_allocated - memory_allocated before the step"
        peak_step, peak_total = (peak - before) / 2**20, peak / 2**20
    else:
        _malloc_trim()
        rss0 = _proc_kib("VmRSS")
        reset = _reset_peak_rss()
        with meter.hooks():
            step(x, y, eager=True)
        hwm = _proc_kib("VmHWM")
        if rss0 is not None and hwm is not None and reset:
            method = (
                "peak RSS delta: VmHWM - VmRSS before the step (/proc/self/status, "
                "high-water mark reset via /proc/self/clear_refs, after malloc_trim)"
            )
            peak_step, peak_total = max(0, hwm - rss0) / 1024, hwm / 1024
        else:
            method = "unavailable (needs Linux /proc/self/status and clear_refs)"
            peak_step = peak_total = None
    return StepMemory(method=method, peak_step_mib=peak_step, peak_total_mib=peak_total,
                      saved_activations_mib=meter.bytes / 2**20, saved_tensors=meter.count)
