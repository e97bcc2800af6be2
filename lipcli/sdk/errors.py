"""Exceptions that the CLI turns into one clear line and an exit code.

``LipError`` (exit 1) is a runtime failure; ``LipUsageError`` (exit 2) is bad user input:
an unknown component name, a malformed option value, a data set that does not match.
"""

from __future__ import annotations


class LipError(Exception):
    """A runtime error reported to the user as one line (exit code 1)."""

    exit_code = 1


class LipUsageError(LipError):
    """Bad input from the user (exit code 2)."""

    exit_code = 2


class SettingError(LipUsageError):
    """Bad value of one named setting (a field of a driver's options, e.g. ``top_k``).

    The message is the library's (it names no command-line flag); ``setting`` lets a front
    end point at its own spelling of it (``lip`` prefixes the option, e.g. ``--top-k: ...``).
    """

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        super().__init__(message)


class UnknownComponentError(LipUsageError):
    """A component name that no installed plugin provides."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        self.kind, self.name, self.valid = kind, name, valid
        listed = ", ".join(valid) if valid else "none installed"
        super().__init__(f"unknown {kind} {name!r}; valid names: {listed}")


class PluginError(LipError):
    """A plugin is broken (raises while loading, misspelt hook, bad return value)."""


class DuplicateComponentError(PluginError):
    """Two plugins provide the same component name for the same kind."""


class ModelFileError(LipError):
    """A model file is missing, truncated, corrupt, foreign or inconsistent."""


class MissingPluginError(ModelFileError):
    """A model file needs a component whose plugin is not installed."""
