"""Conformance check of a spec's declared parameter ranges (re-exported by
:mod:`lipcli.testing`): :func:`check_param_ranges`, and :func:`range_edges`, the values it
tries.

A :class:`~lipcli.sdk.specs.Param` with a range (``min``, ``max``, ``min_open``,
``max_open``, ``odd``, ``auto``) must accept each edge of it and refuse the value one step
beyond (an integer: one more or one less; a float: the next representable float), with a
one-line ``ValueError`` naming the parameter and its range -- from a Python value
(:meth:`~lipcli.sdk.specs.Param.check`, as a model file's config is read) and from its text
(:meth:`~lipcli.sdk.specs.Param.parse`, as ``--conv NAME:key=value`` is read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lipcli.sdk.specs import ComponentSpec, Param
from lipcli.testing.base import fail

__all__ = ["RangeEdge", "check_param_ranges", "range_edges"]


@dataclass(frozen=True)
class RangeEdge:
    """One value tried at a declared range's edge: ``accepted`` says what must happen."""

    param: Param
    value: int | float
    accepted: bool

    @property
    def text(self) -> str:
        """The value as written on the command line (``key=value``)."""
        return repr(self.value) if isinstance(self.value, float) else str(self.value)


def _int_edges(p: Param) -> list[tuple[int, bool]]:
    edges: list[tuple[int, bool]] = []
    step = 1
    if p.min is not None:
        low = int(p.min) + (1 if p.odd and int(p.min) % 2 == 0 else 0)
        below = int(p.min) - step
        while p.auto is not None and below == p.auto:
            below -= step
        edges += [(low, True), (below, False)]
    if p.max is not None:
        high = int(p.max) - (1 if p.odd and int(p.max) % 2 == 0 else 0)
        edges += [(high, True), (int(p.max) + step, False)]
    if p.odd:
        inside = (int(p.min) if p.min is not None else 1) + 1
        if inside % 2 == 0 and (p.max is None or inside <= p.max) and inside != p.auto:
            edges.append((inside, False))
    return edges


def _float_edges(p: Param) -> list[tuple[float, bool]]:
    edges: list[tuple[float, bool]] = []
    if p.min is not None:
        low = float(p.min)
        edges += ([(math.nextafter(low, math.inf), True), (low, False)] if p.min_open
                  else [(low, True), (math.nextafter(low, -math.inf), False)])
    if p.max is not None:
        high = float(p.max)
        edges += ([(math.nextafter(high, -math.inf), True), (high, False)] if p.max_open
                  else [(high, True), (math.nextafter(high, math.inf), False)])
    edges.append((math.nan, False))
    return edges


def range_edges(param: Param) -> list[RangeEdge]:
    """The values at and one step beyond ``param``'s declared range (none without a range)."""
    if not param.has_range:
        return []
    pairs: list[tuple[Any, bool]] = _int_edges(param) if param.type is int else _float_edges(param)
    return [RangeEdge(param, value, accepted) for value, accepted in pairs]


def check_refusal(label: str, edge: RangeEdge, exc: Exception) -> None:
    """``exc`` is the one-line refusal of ``edge``: it names the parameter and its range."""
    message = str(exc)
    if "\n" in message.strip():
        fail(f"{label}: {edge.param.name}={edge.text} is refused with more than one line: {message!r}")
    if edge.param.name not in message or edge.param.range_text() not in message:
        fail(f"{label}: {edge.param.name}={edge.text} is refused without naming the parameter "
             f"and its range {edge.param.range_text()!r}: {message!r}")


def check_param_ranges(spec: ComponentSpec, *, require: bool = False) -> list[RangeEdge]:
    """Every declared range of ``spec``'s parameters: each edge accepted, one step beyond
    refused in one line naming the parameter and its range, from a value and from its text.
    With ``require``, every ``int``/``float`` parameter without ``choices`` must declare a
    range.  Returns the edges tried; raises AssertionError if one misbehaves."""
    label = f"{spec.kind} {spec.name!r}"
    tried: list[RangeEdge] = []
    for param in spec.params:
        if require and param.type in (int, float) and param.choices is None and not param.has_range:
            fail(f"{label}: numeric parameter {param.name!r} declares no range (min/max)")
        for edge in range_edges(param):
            for how, run in (("value", lambda e=edge: param.check(e.value)),
                             ("text", lambda e=edge: param.parse(e.text))):
                try:
                    got = run()
                except ValueError as exc:
                    if edge.accepted:
                        fail(f"{label}: {param.name}={edge.text} (a {how}) is at the edge of "
                             f"{param.range_text()} but refused: {exc}")
                    check_refusal(label, edge, exc)
                else:
                    if not edge.accepted:
                        fail(f"{label}: {param.name}={edge.text} (a {how}) is beyond "
                             f"{param.range_text()} but accepted")
                    if got != edge.value:
                        fail(f"{label}: {param.name}={edge.text} (a {how}) came back as {got!r}")
            tried.append(edge)
    return tried
