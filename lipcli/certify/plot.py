"""Certified-accuracy curve: ``acc(eps) = mean_i [correct_i and r_i >= eps]`` against ``eps``.

The curve is exact (not sampled): it is a non-increasing step function that equals the clean
accuracy at ``eps = 0`` and drops by ``1/N`` at each certified radius ``r_i`` of a correctly
classified point (SPEC §4 definition of certified accuracy). The requested radii are marked.
matplotlib is optional (``pip install 'lipcli[plot]'``).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from lipcli.sdk.errors import LipError, SettingError

INSTALL_HINT = "pip install 'lipcli[plot]'"


def require_matplotlib() -> None:
    """Raise a one-line :class:`LipError` naming the extra if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise LipError(f"plotting needs matplotlib, which is not installed: {INSTALL_HINT}") from None


def supported_formats() -> dict[str, str]:
    """File formats matplotlib can write (suffix without the dot -> description)."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    return dict(FigureCanvasBase.get_supported_filetypes())


def plot_format(path: str | os.PathLike) -> str:
    """The format a plot at ``path`` is written in: its suffix (``.png``, ``.pdf``, ``.svg``,
    ...), PNG when it has none.  An unsupported suffix is a usage error (:class:`SettingError`
    ``plot``, exit 2), raised before any work starts."""
    suffix = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if not suffix:
        return "png"
    formats = supported_formats()
    if suffix not in formats:
        raise SettingError(
            "plot", f"plot {os.fspath(path)}: format {suffix!r} is not supported; use one of "
            + ", ".join(f".{f}" for f in sorted(formats))
        )
    return suffix


def certified_accuracy_curve(
    radius: torch.Tensor, correct: torch.Tensor
) -> tuple[list[float], list[float]]:
    """Breakpoints ``(xs, ys)`` of the step function ``acc(eps)`` (right-continuous from the
    left: ``acc(eps)`` counts ``r_i >= eps``). ``xs`` starts at 0 with the clean accuracy."""
    n = int(radius.numel())
    if n == 0:
        return [0.0], [0.0]
    r = radius.double()[correct.bool()].sort(descending=True).values
    finite = r[torch.isfinite(r)]
    xs, ys = [0.0], [int(correct.sum()) / n]
    # after eps passes r (descending order), the count of r_i >= eps drops
    values = finite.flip(0).tolist()  # ascending
    remaining = int(correct.sum())
    i = 0
    while i < len(values):
        v = values[i]
        same = 1
        while i + same < len(values) and values[i + same] == v:
            same += 1
        if v > 0:
            xs.append(v)
            ys.append(remaining / n)
        remaining -= same
        xs.append(v)
        ys.append(remaining / n)
        i += same
    return xs, ys


def plot_certified_accuracy(
    path: str | os.PathLike,
    radius: torch.Tensor,
    correct: torch.Tensor,
    marks: Sequence[float],
    *,
    unit: float = 255.0,
    title: str | None = None,
    label: str | None = None,
) -> None:
    """Write the curve to ``path`` (format from the suffix, e.g. ``.png``, ``.pdf``; PNG when
    there is none: see :func:`plot_format`).

    ``radius``: per-input certified input-space radii; ``correct``: bool per input;
    ``marks``: requested radii (absolute), drawn as points; the x axis is in units of
    ``1/unit`` (``unit`` 255: pixel levels).
    """
    require_matplotlib()
    fmt = plot_format(path)
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    xs, ys = certified_accuracy_curve(radius, correct)
    n = max(1, int(radius.numel()))
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        scaled = [x * unit for x in xs]
        top = max(scaled[-1] if scaled else 0.0, max((m * unit for m in marks), default=0.0))
        scaled.append(top * 1.05 if top > 0 else 1.0)
        ys_ext = ys + [ys[-1]]
        ax.plot(scaled, [100 * y for y in ys_ext], drawstyle="default", label=label or "certified")
        for m in marks:
            acc = float((correct.bool() & (radius.double() >= m)).sum()) / n
            ax.plot([m * unit], [100 * acc], "o", color="C3")
            ax.annotate(f"{100 * acc:.1f}%", (m * unit, 100 * acc), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.set_xlabel("l2 radius" + (f" (x 1/{unit:g})" if unit != 1 else ""))
        ax.set_ylabel("certified accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        if title:
            ax.set_title(title, fontsize=9)
        try:
            fig.savefig(os.fspath(path), format=fmt, bbox_inches="tight", dpi=120)
        except (OSError, ValueError) as exc:
            raise LipError(f"cannot write plot {path}: {exc}") from None
    finally:
        plt.close(fig)
