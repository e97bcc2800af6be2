"""The training driver's own errors (subclasses of :class:`lipcli.sdk.errors.LipError`).

Library errors name no command-line option.  Where a message must name an argument of
:func:`lipcli.train.train` or a :class:`~lipcli.train.config.TrainConfig` setting (what to
pass, what cannot change), the error keeps a :attr:`~NamedSettings.template` in which that
name is a ``{name}`` field: ``str(error)`` spells it ``name`` (the Python name), and a
front end renders the same message with its own spelling through
:meth:`~NamedSettings.render` (``lip train``: ``--batch-size``).  The field ``{command}``
stands for the command that continues a run (``lipcli.train.train`` here; the CLI spells
out its own command line, using :attr:`~NamedSettings.launch`, the processes per node of a
multi-process run, and :attr:`~NamedSettings.launcher`, what started it).  Values put into a template go through :func:`literal`.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from lipcli.sdk.errors import LipError, LipUsageError

#: the field of a template that stands for the command continuing a run
COMMAND = "command"


def literal(value: Any) -> str:
    """``value`` as text for a template (braces doubled, so they are not fields)."""
    return str(value).replace("{", "{{").replace("}", "}}")


def render_template(template: str, label: Callable[[str], str]) -> str:
    """``template`` with every ``{name}`` field replaced by ``label(name)``."""
    return "".join(
        text + ("" if name is None else label(name))
        for text, name, _spec, _conversion in string.Formatter().parse(template)
    )


def python_label(name: str) -> str:
    """The library's spelling of a field: the Python name (``overwrite``, ``batch_size``)."""
    return "lipcli.train.train" if name == COMMAND else name


class NamedSettings:
    """Mixin of the errors below: the message as a template naming settings as fields."""

    template: str = ""
    #: processes per node of a multi-process run (None: one process), for ``{command}``
    launch: int | None = None
    #: what started the processes of a multi-process run: ``"lipcli"``
    #: (:mod:`lipcli.train.launch`) or None (``torchrun``)
    launcher: str | None = None

    def _init_template(self, template: str, launch: int | None, launcher: str | None = None) -> str:
        self.template, self.launch, self.launcher = template, launch, launcher
        return self.render(python_label)

    def render(self, label: Callable[[str], str]) -> str:
        """The message with each field spelled by ``label`` (a front end's option names)."""
        return render_template(self.template, label)

    @property
    def settings(self) -> tuple[str, ...]:
        """The names the message refers to (its fields, ``command`` excluded)."""
        return tuple(dict.fromkeys(
            name for _t, name, _s, _c in string.Formatter().parse(self.template)
            if name is not None and name != COMMAND
        ))


class TrainUsageError(NamedSettings, LipUsageError):
    """Bad input to the trainer (exit code 2); the message is a template (see the module)."""

    def __init__(self, template: str, *, launch: int | None = None, launcher: str | None = None) -> None:
        super().__init__(self._init_template(template, launch, launcher))


class TrainError(NamedSettings, LipError):
    """A runtime failure of the trainer (exit code 1); the message is a template."""

    def __init__(self, template: str, *, launch: int | None = None, launcher: str | None = None) -> None:
        super().__init__(self._init_template(template, launch, launcher))


class TrainingDiverged(TrainError):
    """A gradient or the loss became NaN or infinite (:mod:`lipcli.train.guard`); the
    checkpoint of the last finite epoch is kept."""


class TrainingInterrupted(TrainError):
    """Ctrl-C: the last checkpoint is kept and the message says how to resume."""

    exit_code = 130


class WorkerLost(TrainError):
    """Another process of a multi-process run stopped (its connection was lost): the last
    checkpoint is kept and the message says how to resume."""
