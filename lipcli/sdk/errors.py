"""Exceptions that the CLI turns into one clear line and an exit code.

``LipError`` (exit 1) is a runtime failure; ``LipUsageError`` (exit 2) is bad user input:
an unknown component name, a malformed option value, a data set that does not match.

Library messages name no command-line option.  An error whose message names settings (the
arguments of a library function, a driver's options) is a :class:`NamedSettings`: its
message is a template in which each setting is a ``{name}`` field; ``str(error)`` spells it
``name`` (the Python name) and a front end renders the same message with its own spelling
through :meth:`NamedSettings.render` (``lip``: ``--batch-size``).  Values put into a template
go through :func:`literal`.  :class:`SettingError` is the usage error about one setting.
"""

from __future__ import annotations

import contextlib
import string
from collections.abc import Callable, Iterator
from typing import Any


def literal(value: Any) -> str:
    """``value`` as text for a template (braces doubled, so they are not fields)."""
    return str(value).replace("{", "{{").replace("}", "}}")


def render_template(template: str, label: Callable[[str], str]) -> str:
    """``template`` with every ``{name}`` field replaced by ``label(name)``."""
    return "".join(
        text + ("" if name is None else label(name))
        for text, name, _spec, _conversion in string.Formatter().parse(template)
    )


def template_fields(template: str) -> tuple[str, ...]:
    """The field names of ``template`` in order of first appearance."""
    return tuple(dict.fromkeys(
        name for _t, name, _s, _c in string.Formatter().parse(template) if name is not None
    ))


class LipError(Exception):
    """A runtime error reported to the user as one line (exit code 1)."""

    exit_code = 1


class LipUsageError(LipError):
    """Bad input from the user (exit code 2)."""

    exit_code = 2


class NamedSettings:
    """Mixin of the errors whose message names settings as ``{name}`` fields of a template
    (see the module); a subclass calls ``super().__init__(self._init_template(template))``."""

    template: str = ""

    def _init_template(self, template: str) -> str:
        self.template = template
        return render_template(template, self.library_label)

    @staticmethod
    def library_label(name: str) -> str:
        """The library's spelling of a field: the Python name (``overwrite``, ``batch_size``)."""
        return name

    def render(self, label: Callable[[str], str]) -> str:
        """The message with each field spelled by ``label`` (a front end's option names)."""
        return render_template(self.template, label)

    @property
    def settings(self) -> tuple[str, ...]:
        """The names the message refers to (its fields)."""
        return template_fields(self.template)


class SettingError(NamedSettings, LipUsageError):
    """Bad value of one named setting (a field of a driver's options, e.g. ``top_k``).

    ``message`` is the library's: it names the setting by its Python name at its start
    (``top_k must be at least 1``), in parentheses (``cannot write x (output): ...``) or not at
    all (it is about that setting).  That mention becomes the template's field, so that
    :meth:`render` spells it as a front end does (``--top-k must be at least 1``); a message
    that does not name it gets ``label(setting): `` in front (``--data-dir: ...``).
    """

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        if message.startswith(setting + " "):
            template = "{%s}%s" % (setting, literal(message[len(setting):]))
        elif f"({setting})" in message:
            before, _, after = message.partition(f"({setting})")
            template = "%s({%s})%s" % (literal(before), setting, literal(after))
        else:
            template = literal(message)
        super().__init__(self._init_template(template))

    def render(self, label: Callable[[str], str]) -> str:
        text = super().render(label)
        return text if self.setting in template_fields(self.template) else f"{label(self.setting)}: {text}"

    @property
    def settings(self) -> tuple[str, ...]:
        return (self.setting,)


class ComponentValueError(LipUsageError, ValueError):
    """A component parameter value its ``Param`` refuses (wrong type, not a choice, outside
    its declared range): ``KIND 'NAME' rejected KEY=VALUE: REASON`` (exit 2; a ``ValueError``
    for Python callers)."""


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


#: what allocators say when an allocation fails (torch's CPU allocator, CUDA, the C library)
_ALLOCATION_WORDS = ("can't allocate memory", "out of memory", "defaultcpuallocator",
                     "cannot allocate memory")


def is_allocation_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed memory allocation: :class:`MemoryError`, torch's
    ``OutOfMemoryError`` (CUDA) or a ``RuntimeError`` whose message says so (the CPU allocator)."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(words in text for words in _ALLOCATION_WORDS)
    return False


class OutOfMemory(NamedSettings, LipError):
    """A step ran out of memory (exit code 1).  The message is a template naming the step and
    the settings that sized it as ``{name}`` fields, and what to do (lower them)."""

    def __init__(self, template: str) -> None:
        super().__init__(self._init_template(template))


def out_of_memory_template(step: str, sized_by: str, advice: str = "") -> str:
    """The message of :class:`OutOfMemory`: ``step`` (plain text), ``sized_by`` and ``advice``
    (templates: settings as ``{name}`` fields)."""
    return (f"out of memory in the {literal(step)} (its memory grows with {sized_by}); "
            + (advice or f"lower {sized_by}, or free memory, and run again"))


@contextlib.contextmanager
def memory_step(step: str, sized_by: str, advice: str = "") -> Iterator[None]:
    """Turn an allocation failure (:func:`is_allocation_failure`) inside the block into an
    :class:`OutOfMemory` naming ``step`` and the settings in ``sized_by`` (a template, e.g.
    ``"{batch_size}"``); other exceptions pass unchanged."""
    try:
        yield
    except LipError:
        raise
    except BaseException as exc:
        if not is_allocation_failure(exc):
            raise
        raise OutOfMemory(out_of_memory_template(step, sized_by, advice)) from None
