"""``lipcli.train(...)``: the Python twin of ``lip train``.

The same settings as the command line (every :class:`~lipcli.train.config.TrainConfig` setting
as a keyword argument, a recipe and a settings file included, in the same order of precedence:
:func:`lipcli.host.recipes.new_settings`), the same run directory and model file, and the same
typed result, :class:`~lipcli.train.results.TrainSummary`, that ``lip train --json`` prints.
``lip train`` is a thin layer over :func:`run`::

    import lipcli
    summary = lipcli.train(recipe="lipconvnet", dataset="digits", epochs=2, width=8,
                           out="runs/m.safetensors", overwrite=True)
    summary.test_accuracy, summary.lipschitz_bound
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["run", "plan"]

#: what ``resume`` cannot be combined with (templates: the CLI spells the fields as options)
_RESUME_CONFLICTS = {
    "config": "{resume} uses the run's stored settings; drop {config}",
    "run_dir": "{resume} RUN_DIR already names the run directory; drop {run_dir}",
    "recipe": "{resume} keeps the run's recipe and settings; drop {recipe}",
}


def plan(*, recipe: str | None = None, config: str | os.PathLike | None = None,
         resume: str | os.PathLike | None = None, run_dir: str | os.PathLike | None = None,
         out: str | os.PathLike | None = None, overwrite: bool = False,
         **settings: Any) -> tuple[list[Any], dict[str, Any], str | None]:
    """``(positional, keywords, default_root)`` of :func:`lipcli.train.driver.train` for these
    arguments (a new run's :class:`TrainConfig`, or ``resume`` with the settings given over
    the stored ones), and the default data root the run reads its data set from (None: a
    folder given, or a data set that needs none).  Bad input: one-line :class:`LipUsageError`."""
    from lipcli.data.roots import for_training
    from lipcli.host.recipes import new_settings
    from lipcli.host.settings_file import load_config_file
    from lipcli.train.config import TrainConfig
    from lipcli.train.errors import TrainUsageError

    given = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in settings.items()}
    keywords: dict[str, Any] = {"out": None if out is None else str(out), "overwrite": overwrite}
    if resume is not None:
        for name, value in (("config", config), ("run_dir", run_dir), ("recipe", recipe)):
            if value is not None:
                raise TrainUsageError(_RESUME_CONFLICTS[name])
        return [], {"resume": str(resume), "resume_overrides": given, **keywords}, None
    file_data = None if config is None else load_config_file(config)
    cfg = new_settings(TrainConfig(), recipe, file_data, str(config), given)
    _check_slots(cfg, set(given) | set(file_data or {}))
    cfg, default_root = for_training(cfg, "download" in given)
    return [cfg], {"run_dir": None if run_dir is None else str(run_dir), **keywords}, default_root


def _check_slots(cfg: Any, explicit: set[str]) -> None:
    """A layer kind chosen (given, in the settings file or the recipe) for a network that
    fixes that kind itself is a one-line usage error naming the network's slots."""
    from lipcli.host.defaults import LAYER_KINDS
    from lipcli.host.plugins import get_registry
    from lipcli.host.recipes import resolve_recipe
    from lipcli.train.driver import network_slots
    from lipcli.train.errors import TrainUsageError, literal

    reg = get_registry()
    if cfg.recipe is not None:
        explicit = explicit | set(resolve_recipe(reg, cfg.recipe).values)
    chosen = [kind for kind in LAYER_KINDS if kind in explicit and getattr(cfg, kind) is not None]
    if not chosen:
        return
    arch, slots = network_slots(cfg, reg)
    for kind in chosen:
        if kind not in slots:
            raise TrainUsageError(
                f"{{{kind}}} {literal(getattr(cfg, kind))}: arch {literal(arch.name)} has no {kind} slot "
                f"(it fixes its own {kind}; it takes {', '.join(slots)})")


def run(*, quiet: bool = True, **arguments: Any) -> Any:
    """Train (the arguments of :func:`plan`); returns the :class:`TrainSummary` (``None`` in a
    ``torchrun`` process other than rank 0)."""
    from lipcli.train.driver import train

    positional, keywords, _root = plan(**arguments)
    return train(*positional, **keywords, quiet=quiet)
