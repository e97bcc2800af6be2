"""The source's own configuration, for the options a checkpoint's tensors cannot tell.

Some options of another project's training code change the network's function without
changing a single tensor shape (an activation without parameters, a normalised or plain last
layer, zero or circular padding, a quasi-residual parametrisation ...).  An importer never
guesses them: it asks :class:`SourceOptions` for each by the source's own name and gets the
value *stated* by

* the checkpoint itself (plain values saved beside the tensors, e.g. LiResNet's and BRONet's
  ``configs``: read through the weights-only loader, no code executed),
* ``lip import --config FILE`` (the source's own configuration: a JSON object such as the
  ``config.json``/``args.json`` their scripts write, or a YAML file of nested ``key: value``
  mappings such as their ``configs/*.yaml``), and
* ``lip import --option NAME=VALUE`` (repeatable),

or refuses, one line naming the option (:class:`~lipcli.sdk.importers.ImportRefused`).
Two sources that state one option differently are refused too.  Names are compared with
``-`` read as ``_`` and leading dashes dropped (``--conv-layer`` is ``conv_layer``); nested
mappings are looked up by their last key (``model.act_name`` is ``act_name``).

Each importer lists every option of its source that changes the function in a table of
:class:`SourceOption` (its ``OPTIONS``): the option's name, what it changes, and how the
importer handles it (read from the shapes, mapped from the stated value, or refused).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lipcli.sdk.errors import LipUsageError

__all__ = ["SourceOption", "SourceOptions", "parse_config_file", "parse_option", "parse_scalar"]

#: a config file larger than this is not a configuration
MAX_CONFIG_BYTES = 1 << 20
_AMBIGUOUS = object()
_NONE = object()


@dataclass(frozen=True)
class SourceOption:
    """One row of an importer's option table: the source's ``name`` for the option, what it
    ``changes`` in the network, and how the importer ``handles`` it."""

    name: str
    changes: str
    handles: str


def _norm(name: str) -> str:
    return str(name).strip().lstrip("-").replace("-", "_").lower()


def parse_scalar(text: str) -> Any:
    """``true``/``false``/``none``, an int, a float, a quoted or a bare string."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null", "~", ""):
        return None
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    for kind in (int, float):
        try:
            return kind(s)
        except ValueError:
            pass
    return s


def parse_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` (``--option``) as ``(name, value)``; ``LipUsageError`` otherwise."""
    name, eq, value = text.partition("=")
    if not eq or not _norm(name):
        raise LipUsageError(f"--option {text!r}: expected NAME=VALUE (the source's option name)")
    return _norm(name), parse_scalar(value)


def _yaml_subset(text: str, path: str) -> dict[str, Any]:
    """Nested block mappings of scalars (``key: value``, indentation, ``#`` comments): the
    configuration files of the sources; anything else (lists, anchors, flow style) refused."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"\s+#.*$", "", raw.rstrip()) if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        indent = len(line) - len(line.lstrip(" "))
        m = re.fullmatch(r"\s*([A-Za-z_][\w.\-]*)\s*:(?:\s+(.*))?", line)
        if m is None or "\t" in line[:indent + 1]:
            raise LipUsageError(f"--config {path}: line {number} is not a 'key: value' line of a plain YAML mapping")
        while indent <= stack[-1][0]:
            stack.pop()
        key, value = m.group(1), m.group(2)
        parent = stack[-1][1]
        if value is None or not value.strip():
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
        elif value.strip()[0] in "[{&*!|>":
            raise LipUsageError(f"--config {path}: line {number}: only plain scalars are read, not {value.strip()!r}")
        else:
            parent[key] = parse_scalar(value)
    return root


def parse_config_file(path: str | Path) -> dict[str, Any]:
    """The source's configuration file (JSON object, or plain YAML mappings) as a dict."""
    p = Path(path)
    if not p.is_file():
        raise LipUsageError(f"--config {p}: no such file")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise LipUsageError(f"--config {p}: larger than {MAX_CONFIG_BYTES} bytes: not a configuration file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LipUsageError(f"--config {p}: cannot read it as UTF-8 text ({exc})") from None
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LipUsageError(f"--config {p}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise LipUsageError(f"--config {p}: not a JSON object")
        return obj
    return _yaml_subset(text, str(p))


def _leaves(obj: Any, prefix: str = "", depth: int = 0) -> Iterable[tuple[str, str, Any]]:
    """``(leaf name, dotted path, value)`` of every scalar (lists kept as tuples)."""
    if isinstance(obj, Mapping) and depth < 8:
        for key, value in obj.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key), depth + 1)
    elif isinstance(obj, (list, tuple)):
        yield _norm(prefix.rsplit(".", 1)[-1]), prefix, tuple(obj)
    else:
        yield _norm(prefix.rsplit(".", 1)[-1]), prefix, obj


@dataclass
class SourceOptions:
    """The options stated for one import, by origin (see the module)."""

    stated: dict[str, dict[str, Any]] = field(default_factory=dict)  # origin -> name -> value

    def add(self, origin: str, values: Any) -> None:
        """State the scalars of ``values`` (a nested mapping) as coming from ``origin``."""
        table = self.stated.setdefault(origin, {})
        for name, _path, value in _leaves(values):
            if not name:
                continue
            if name in table and table[name] != value:
                table[name] = _AMBIGUOUS
            else:
                table[name] = value

    @classmethod
    def from_checkpoint(cls, values: Mapping[str, Any], roots: Iterable[str] = ("configs", "config", "args")) -> "SourceOptions":
        """The checkpoint's own plain values under one of ``roots`` (e.g. ``configs.model.*``)."""
        out = cls()
        kept = {k: v for k, v in values.items() if k.split(".", 1)[0] in roots}
        nested: dict[str, Any] = {}
        for key, value in kept.items():
            node = nested
            parts = key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
            node[parts[-1]] = value
        if nested:
            out.add("the checkpoint's configs", nested)
        return out

    def lookup(self, *names: str) -> tuple[bool, Any, str]:
        """``(stated, value, origin)`` for the first of ``names`` stated; ``ImportRefused`` when
        two origins (or one origin's sections) state it differently."""
        from lipcli.sdk.importers import ImportRefused

        keys = [_norm(n) for n in names]
        found: list[tuple[str, Any]] = []
        for origin, table in self.stated.items():
            for key in keys:
                if key in table:
                    found.append((origin, table[key]))
                    break
        if not found:
            return False, None, ""
        for origin, value in found:
            if value is _AMBIGUOUS:
                raise ImportRefused(f"option {names[0]!r} is stated twice with different values in {origin}")
        first_origin, first = found[0]
        for origin, value in found[1:]:
            if value != first:
                raise ImportRefused(f"option {names[0]!r}: {first_origin} states {first!r}, {origin} states {value!r}")
        return True, first, first_origin

    def configured(self) -> bool:
        """Whether a whole configuration of the source is at hand (the checkpoint's own or
        ``--config``), not only single ``--option`` values."""
        return any(origin != "--option" and table for origin, table in self.stated.items())

    def require(self, name: str, *aliases: str, told: Any = None, hint: str = "", default: Any = _NONE) -> Any:
        """The stated value of ``name`` (or ``told``, what the tensors themselves tell, when
        not ``None``); refuses naming the option when neither is known.  ``default``: the
        source code's own default for a key its configuration may leave out
        (``kwargs.get(name, default)``), taken only when a whole configuration is at hand."""
        from lipcli.sdk.importers import ImportRefused

        stated, value, _origin = self.lookup(name, *aliases)
        if not stated and told is None and default is not _NONE and self.configured():
            return default
        if stated:
            if told is not None and value != told:
                raise ImportRefused(f"option {name}={value!r} is stated, but the checkpoint's tensors are "
                                    f"those of {name}={told!r}")
            return value
        if told is not None:
            return told
        raise ImportRefused(f"option {name!r} of the source's configuration is not stated and the checkpoint's "
                            f"tensors cannot tell it: pass --config FILE (the source's own configuration) or "
                            f"--option {name}=VALUE{hint}")

    def choose(self, name: str, mapping: Mapping[Any, Any], *aliases: str, told: Any = None,
               hint: str = "", key=None, default: Any = _NONE) -> Any:
        """``mapping[value]`` for the option's required value; refuses, naming the option and
        what lipcli maps, for a value outside ``mapping`` (``key`` normalises the value first)."""
        from lipcli.sdk.importers import ImportRefused

        value = self.require(name, *aliases, told=told, hint=hint, default=default)
        k = key(value) if key is not None else value
        if k not in mapping:
            known = ", ".join(repr(v) for v in mapping)
            raise ImportRefused(f"cannot import option {name}={value!r}: lipcli maps {name} {known} only")
        return mapping[k]
