"""Every setting declared once: :func:`setting` fields and the :class:`Setting` table read from them.

A command's settings are the fields of one dataclass (:class:`~lipcli.train.config.TrainConfig`,
:class:`~lipcli.certify.options.CertifyOptions`, ...), each declared with :func:`setting`: its
default, help, owner and range (or choices).  Everything else is derived from that table
(:func:`settings_of`): the Typer options and their ``--help`` (:mod:`lipcli.cli.settings_options`),
docs/cli.md (generated from the help), the keys a settings file and a recipe may set, and the
range checks (:meth:`Setting.problem`, a one-line message template naming the setting as
``{name}``, which a front end spells its own way).  The precedence of a new run's settings,
defaults < recipe < settings file < command line, is :func:`layered`, written once here.

Torch-free: ``lip --help`` reads these tables.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

#: who owns a setting (what it is about): docs/cli.md and ``lip plugins -v`` group by it
OWNERS = ("model", "data", "optim", "run", "train", "certify", "bench", "export", "import")
#: the Python types a setting may have (``list``: of numbers)
SETTING_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list}


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One declared setting: the facts every front end derives its view from."""

    name: str
    type: type
    default: Any
    help: str
    owner: str
    #: ``None`` is a value: "automatic" (resolved by the command; the help says how)
    optional: bool = False
    choices: tuple[Any, ...] | None = None
    #: inclusive range (``None``: open that side); ``*_open``: the bound itself excluded
    min: int | float | None = None
    max: int | float | None = None
    min_open: bool = False
    max_open: bool = False
    #: the option's spellings (default ``--name-with-dashes``); a flag with ``negative`` also
    #: has its ``--no-`` form
    flags: tuple[str, ...] = ()
    negative: bool = False
    #: the component kind the setting names: its help lists the installed components
    component: str | None = None
    #: offered on the command line / settable by a settings file and a recipe
    cli: bool = True
    stored: bool = True
    metavar: str | None = None

    def __post_init__(self) -> None:
        if self.owner not in OWNERS:
            raise ValueError(f"setting {self.name!r}: owner must be one of {', '.join(OWNERS)}")
        if not self.flags:
            object.__setattr__(self, "flags", ("--" + self.name.replace("_", "-"),))
        if self.default is not None and self.problem(self.default) is not None:
            raise ValueError(f"setting {self.name!r}: its default {self.default!r} is outside its own range")

    @property
    def option(self) -> str:
        """The long option (``--batch-size``)."""
        return max(self.flags, key=len)

    def range_text(self) -> str:
        """The declared range in words: ``1..65536``, ``at least 1``, ``(0, 1]``, ``positive``."""
        low, high = self.min, self.max
        if self.type is int and not (self.min_open or self.max_open):
            if high is None:
                return f"at least {low}" if low >= 1 else f">= {low}"
            return f"in {'' if low is None else low}..{high}"
        if low == 0 and self.min_open and high is None:
            return "positive"
        if high is None and not self.min_open:
            return f">= {low:g}"
        left = "(-inf" if low is None else f"{'(' if self.min_open else '['}{low:g}"
        right = "inf)" if high is None else f"{high:g}{')' if self.max_open else ']'}"
        return f"in {left}, {right}"

    def problem(self, value: Any) -> str | None:
        """A one-line template (``{name}`` for the setting) if ``value`` is outside the declared
        choices or range (or not finite), else ``None``; types are checked where values are read."""
        if value is None:
            return None if self.optional else "{%s} must be set" % self.name
        if self.choices is not None and value not in self.choices:
            return "{%s} must be one of %s, got %s" % (self.name, ", ".join(map(str, self.choices)), _shown(value))
        if self.type not in (int, float) or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if self.min is None and self.max is None:  # no declared range: the owner checks it
            return None
        if self.type is float and not math.isfinite(value):
            return "{%s} must be a finite number, got %s" % (self.name, _shown(value))
        low, high = self.min, self.max
        if (low is not None and (value <= low if self.min_open else value < low)) or (
            high is not None and (value >= high if self.max_open else value > high)
        ):
            return "{%s} must be %s, got %s" % (self.name, self.range_text(), _shown(value))
        return None


def _shown(value: Any) -> str:
    """A value inside a message template (braces doubled: it is text, never a field)."""
    text = repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)
    return text.replace("{", "{{").replace("}", "}}")


def setting(default: Any, help: str, *, owner: str, **facts: Any) -> Any:
    """A dataclass field declared as a setting (``facts``: the other :class:`Setting` fields;
    a list default is copied per instance)."""
    meta = {"setting": {"help": help, "owner": owner, **facts}}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_of(annotation: str) -> tuple[type, bool]:
    text = str(annotation).replace(" ", "")
    optional = text.endswith("|None")
    base = text.removesuffix("|None").split("[", 1)[0]
    if base not in SETTING_TYPES:
        raise TypeError(f"a setting's type must be one of {', '.join(SETTING_TYPES)} (or | None), got {annotation!r}")
    return SETTING_TYPES[base], optional


_TABLES: dict[type, tuple[Setting, ...]] = {}


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The table of a settings dataclass: one :class:`Setting` per field declared with
    :func:`setting`, in declaration order (cached)."""
    table = _TABLES.get(cls)
    if table is None:
        out = []
        for f in dataclasses.fields(cls):
            facts = f.metadata.get("setting")
            if facts is None:
                continue
            kind, optional = _type_of(f.type)
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            out.append(Setting(name=f.name, type=kind, default=default,
                               optional=facts.get("optional", optional), **{k: v for k, v in facts.items()
                                                                             if k != "optional"}))
        table = _TABLES[cls] = tuple(out)
    return table


def problems(obj: Any) -> list[str]:
    """The range/choice problems of a settings object's values (templates, declaration order)."""
    return [p for s in settings_of(type(obj)) if (p := s.problem(getattr(obj, s.name))) is not None]


def stored_names(cls: type) -> set[str]:
    """The keys a settings file and a recipe may set."""
    return {s.name for s in settings_of(cls) if s.stored}


# -- precedence --------------------------------------------------------------------------------
def layered(defaults: Any, *, recipe: Any = None, file_data: Mapping[str, Any] | None = None,
            file_name: str = "settings file", given: Mapping[str, Any] | None = None,
            before_layer: Callable[[Any, dict[str, Any]], Any] | None = None) -> Any:
    """A new run's settings: ``defaults`` (a settings object with ``updated(data, source=)``),
    then the recipe's values (a :class:`~lipcli.sdk.recipes.RecipeSpec`, ``recipe.values``),
    then the settings file, then the command line (``given``) — each later layer wins.
    ``before_layer(obj, later)``: called on the object before a layer is applied over it, with
    every key the later layers set (``width`` vs an inline ``arch:width=``: :func:`without_width`)."""
    data = {str(k).replace("-", "_"): v for k, v in (file_data or {}).items()}
    given = dict(given or {})
    cfg = defaults
    hook = before_layer or (lambda obj, _later: obj)
    if recipe is not None:
        cfg = hook(cfg.updated(dict(recipe.values), source=f"recipe {recipe.label}"), {**data, **given})
    if file_data is not None:
        cfg = hook(cfg.updated(data, source=file_name), given)
    return cfg.updated(given, source="command line")


def without_width(cfg: Any, later: Mapping[str, Any]) -> Any:
    """A later layer wins over an earlier one for the width too: a width set later (``width``
    or an inline ``arch NAME:width=W``) drops the earlier layer's width in either form."""
    from lipcli.host.plugins import parse_component_choice

    arch_later = later.get("arch")
    if "width" not in later and not (isinstance(arch_later, str) and "width" in parse_component_choice(arch_later)[1]):
        return cfg
    name, params = parse_component_choice(cfg.arch)
    if "width" in params:
        del params["width"]
        arch = name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
        cfg = dataclasses.replace(cfg, arch=arch)
    return dataclasses.replace(cfg, width=None)
