"""The training driver's own errors (subclasses of :class:`lipcli.sdk.errors.LipError`).

Library errors name no command-line option.  Where a message must name an argument of
:func:`lipcli.train.train` or a :class:`~lipcli.train.config.TrainConfig` setting (what to
pass, what cannot change), the error is a :class:`~lipcli.sdk.errors.NamedSettings`: its
message is a template in which that name is a ``{name}`` field, spelled ``name`` by
``str(error)`` and as an option by a front end (``lip train``: ``--batch-size``).  The field
``{command}`` stands for the command that continues a run (``lipcli.train.train`` here; the
CLI spells out its own command line, using :attr:`~TrainMessage.launch`, the processes per
node of a multi-process run, and :attr:`~TrainMessage.launcher`, what started it).  Values
put into a template go through :func:`~lipcli.sdk.errors.literal`.
"""

from __future__ import annotations

from lipcli.sdk.errors import LipError, LipUsageError, NamedSettings, literal

__all__ = [
    "COMMAND", "TrainError", "TrainMessage", "TrainUsageError", "TrainingDiverged",
    "TrainingInterrupted", "TrainingOutOfMemory", "WorkerLost", "literal", "python_label",
]

#: the field of a template that stands for the command continuing a run
COMMAND = "command"


def python_label(name: str) -> str:
    """The library's spelling of a field: the Python name (``overwrite``, ``batch_size``), and
    ``lipcli.train.train`` for ``{command}``."""
    return "lipcli.train.train" if name == COMMAND else name


class TrainMessage(NamedSettings):
    """Mixin of the errors below: a :class:`~lipcli.sdk.errors.NamedSettings` template that may
    also name ``{command}``, the command that continues the run."""

    #: processes per node of a multi-process run (None: one process), for ``{command}``
    launch: int | None = None
    #: what started the processes of a multi-process run: ``"lipcli"``
    #: (:mod:`lipcli.train.launch`) or None (``torchrun``)
    launcher: str | None = None
    library_label = staticmethod(python_label)

    def _init_run(self, template: str, launch: int | None, launcher: str | None) -> str:
        self.launch, self.launcher = launch, launcher
        return self._init_template(template)

    @property
    def settings(self) -> tuple[str, ...]:
        """The names the message refers to (its fields, ``command`` excluded)."""
        return tuple(name for name in super().settings if name != COMMAND)


class TrainUsageError(TrainMessage, LipUsageError):
    """Bad input to the trainer (exit code 2); the message is a template (see the module)."""

    def __init__(self, template: str, *, launch: int | None = None, launcher: str | None = None) -> None:
        super().__init__(self._init_run(template, launch, launcher))


class TrainError(TrainMessage, LipError):
    """A runtime failure of the trainer (exit code 1); the message is a template."""

    def __init__(self, template: str, *, launch: int | None = None, launcher: str | None = None) -> None:
        super().__init__(self._init_run(template, launch, launcher))


class TrainingDiverged(TrainError):
    """A gradient or the loss became NaN or infinite (:mod:`lipcli.train.guard`); the
    checkpoint of the last finite epoch is kept."""


class TrainingInterrupted(TrainError):
    """Ctrl-C: the last checkpoint is kept and the message says how to resume."""

    exit_code = 130


class WorkerLost(TrainError):
    """Another process of a multi-process run stopped (its connection was lost): the last
    checkpoint is kept and the message says how to resume."""


class TrainingOutOfMemory(TrainError):
    """A step of the run failed to allocate memory: the last epoch's checkpoint is kept and the
    message names the step, the settings that sized it and how to go on."""
