"""Settings files (``--config FILE``): TOML, JSON or YAML read into a mapping of settings, the
third layer of :func:`lipcli.host.settings.layered` (torch-free)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lipcli.sdk.errors import LipUsageError


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML (``.toml``), JSON (``.json``) or YAML (``.yaml``/``.yml``) settings file.

    A top-level ``[train]`` table / ``train:`` mapping is used if present, else the whole file.
    """
    p = Path(path)
    if p.is_dir():
        raise LipUsageError(f"config file {p} is a directory; give a .toml, .json or .yaml file")
    if not p.is_file():
        raise LipUsageError(f"config file {p} does not exist")
    suffix = p.suffix.lower()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LipUsageError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef]
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml  # type: ignore[import-not-found]
            except ModuleNotFoundError:
                raise LipUsageError(
                    f"config file {p} is YAML but PyYAML is not installed "
                    "(pip install 'lipcli[yaml]', or use TOML / JSON)"
                ) from None
            data = yaml.safe_load(text)
        else:
            raise LipUsageError(f"config file {p}: unknown format {suffix!r}; use .toml, .json or .yaml")
    except LipUsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - parse errors of three libraries
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LipUsageError(f"config file {p} is not valid {suffix[1:].upper()}: {first}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LipUsageError(f"config file {p} must hold a table/mapping of settings")
    if isinstance(data.get("train"), dict):
        data = data["train"]
    return data
