"""The training driver's own errors (subclasses of :class:`lipcli.sdk.errors.LipError`)."""

from __future__ import annotations

from lipcli.sdk.errors import LipError


class TrainingDiverged(LipError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class TrainingInterrupted(LipError):
    """Ctrl-C: the last checkpoint is kept and the message says how to resume."""

    exit_code = 130
