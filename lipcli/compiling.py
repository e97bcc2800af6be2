"""``torch.compile`` for the training step, the certification feature pass and ``lip bench``
(``--compile``, ``--compile-mode MODE``): the modes, the automatic choice per device, and :class:`Compiled`, a
callable that compiles on first use and keeps the compile time apart from the step time.

What is compiled, and what never is:

* ``lip train``: the training forward (model and loss; AOTAutograd compiles its backward).
  The optimiser step, gradient clipping, the divergence guard, the power-iteration refreshes,
  validation, the test pass and everything written into the model file run eagerly, from the
  stored weights: the guaranteed Lipschitz bound is computed exactly as without compilation.
* ``lip certify``: the feature pass that the certificate's margins are computed from.  The
  Lipschitz bound the radii are divided by comes from the stored weights, never through the
  compiled graph; the certificate itself runs eagerly.
* Compiled results equal eager ones to float rounding (the compiler fuses and reorders sums);
  the model file records the mode and the torch version that trained it (``training.compile``).

``--compile`` not given resolves per device through :data:`AUTO_COMPILE`: a device gets compilation by
default only where a measurement showed a compiled step faster (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from lipcli.sdk.errors import LipError

#: ``torch.compile`` modes (``--compile-mode``), and those whose compiled code replays CUDA
#: graphs itself (``lip train --cuda-graphs`` is then not used), declared with the settings;
#: ``--compile`` switches compilation on (True), off (False) or leaves it to AUTO_COMPILE (None)
from lipcli._util.constants import COMPILE_MODES, GRAPHING_MODES  # noqa: E402

DEFAULT_COMPILE_MODE = "default"
#: whether ``--compile`` not given compiles, per device type: CPU measured slower compiled
#: (docs/benchmarks.md, "torch.compile on CPU"); CUDA not yet measured by lipcli, so eager
#: (the safe side)
AUTO_COMPILE: dict[str, bool] = {"cpu": False, "cuda": False}
#: testing hook: a ``torch.compile`` backend other than inductor (``eager``, ``aot_eager``:
#: the same tracing, no code generation; seconds instead of minutes on a CPU)
BACKEND_ENV = "LIPCLI_COMPILE_BACKEND"


def check_compile_mode(mode: str) -> str:
    """``mode`` lower-cased if it is one of :data:`COMPILE_MODES`; else ``ValueError``."""
    value = str(mode).strip().lower()
    if value not in COMPILE_MODES:
        raise ValueError(f"compile-mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    return value


def resolve_compile(enabled: bool | None, mode: str, device: torch.device | str) -> str:
    """What runs on ``device``: ``"off"`` (eager) or the ``torch.compile`` mode; ``enabled``
    None: :data:`AUTO_COMPILE` decides."""
    if enabled is None:
        enabled = AUTO_COMPILE.get(torch.device(device).type, False)
    return check_compile_mode(mode) if enabled else "off"


def cli_compile_mode(enabled: bool | None, mode: str, device: torch.device | str) -> str | None:
    """The mode ``--compile``/``--compile-mode`` ask for on ``device`` (None: eager); a bad
    mode is a usage error naming ``--compile-mode``."""
    from lipcli.sdk.errors import LipUsageError

    try:
        resolved = resolve_compile(enabled, mode.strip().lower(), device)
    except ValueError as exc:
        raise LipUsageError(f"--{exc}") from None
    return None if resolved == "off" else resolved


def compile_backend() -> str:
    """The ``torch.compile`` backend: inductor, or the one :data:`BACKEND_ENV` names."""
    return os.environ.get(BACKEND_ENV, "").strip() or "inductor"


#: recompilations allowed per function (torch's default, 8, is reached by the layer
#: functions that every layer of a deep network calls with its own shapes; past it dynamo
#: silently runs them eagerly)
RECOMPILE_LIMIT = 64


def _allow_recompiles() -> None:
    config = torch._dynamo.config
    config.recompile_limit = max(int(config.recompile_limit), RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(int(config.accumulated_recompile_limit), 16 * RECOMPILE_LIMIT)


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far: dynamo's frame compilations (the
    forward graphs) and AOTAutograd's lazy backward compilations (torch's own timers)."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    return float(sum(metrics.get("_compile.compile_inner", ())) + sum(metrics.get("backward._backward_impl", ())))


@dataclass
class Compiled:
    """``fn`` compiled by ``torch.compile`` in ``mode`` on first use.  The compile time (the
    first call, a new batch shape, and the backward, which AOTAutograd compiles at its first
    run) is counted by :meth:`measure` around a whole step: :attr:`compile_s`, kept apart from
    the step time.  A compilation error is a one-line :class:`~lipcli.sdk.errors.LipError`
    (``what``: what was compiled) that says how to run without it."""

    fn: Callable[..., Any]
    mode: str
    what: str = "the training step"
    compile_s: float = 0.0
    compiling_steps: int = 0
    steps: int = 0
    _compiled: Callable[..., Any] | None = field(default=None, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._failures():
            if self._compiled is None:
                options: dict[str, Any] = {"backend": compile_backend()}
                if options["backend"] == "inductor":
                    options["mode"] = self.mode
                _allow_recompiles()
                self._compiled = torch.compile(self.fn, **options)
            return self._compiled(*args, **kwargs)

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Around one step (forward and backward): its compile seconds go to :attr:`compile_s`;
        a compiler error in the backward becomes the one-line error too."""
        before = compile_seconds()
        with self._failures():
            yield
        spent = compile_seconds() - before
        self.steps += 1
        if spent > 0:
            self.compiling_steps += 1
            self.compile_s += spent

    @contextmanager
    def _failures(self) -> Iterator[None]:
        try:
            yield
        except LipError:
            raise
        except Exception as exc:  # noqa: BLE001 - a missing C++ compiler, an unsupported operation...
            if not _is_compile_failure(exc):
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:240]
            raise LipError(f"torch.compile ({self.mode}) failed on {self.what}: "
                           f"{type(exc).__name__}: {first}; run without it (--no-compile)") from None

    def record(self) -> dict[str, Any]:
        """The model file's / report's record of compilation."""
        return {"mode": self.mode, "backend": compile_backend(), "torch_version": torch.__version__,
                "compile_s": round(self.compile_s, 3), "compiling_steps": self.compiling_steps,
                "steps": self.steps}


def _is_compile_failure(exc: BaseException) -> bool:
    """Whether ``exc`` came from the compiler (dynamo, inductor, a backend) rather than from
    the computation itself (an out-of-memory error, a shape error in the model)."""
    from torch._dynamo.exc import BackendCompilerFailed, TorchDynamoException

    if isinstance(exc, (BackendCompilerFailed, TorchDynamoException)):
        return True
    return type(exc).__module__.startswith(("torch._dynamo", "torch._inductor"))


def compiled_or_none(fn: Callable[..., Any], enabled: bool | None, mode: str, device: torch.device | str,
                     what: str = "the training step") -> Compiled | None:
    """:class:`Compiled` for ``fn`` when compilation is on for ``device``
    (:func:`resolve_compile`), else None."""
    resolved = resolve_compile(enabled, mode, device)
    return None if resolved == "off" else Compiled(fn, resolved, what)


def compile_record(enabled: bool | None, mode: str, device: torch.device | str,
                   compiled: Compiled | None) -> dict[str, Any]:
    """``{"setting", "mode", ...}``: what a run asked for (``setting``: true, false or
    "auto"), what ran on ``device`` (``mode``: "off" or the torch.compile mode) and, when
    compiled, :meth:`Compiled.record`."""
    record: dict[str, Any] = {"setting": "auto" if enabled is None else bool(enabled),
                              "mode": resolve_compile(enabled, mode, device)}
    if compiled is not None:
        record.update(compiled.record())
    return record


def measuring(compiled: Compiled | None) -> Any:
    """``compiled.measure()``, or a null context when nothing is compiled."""
    return nullcontext() if compiled is None else compiled.measure()
