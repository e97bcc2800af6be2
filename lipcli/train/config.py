"""Training configuration: :class:`TrainConfig`, settings files, run-file names and constants."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cuda_graphs import GRAPH_MODES
from ..devices import check_device_name
from ..errors import LipUsageError


#: paper settings (ρ in input space, γ) per data set name; other data sets use "cifar10"'s
PAPER_CRC_SETTINGS: dict[str, tuple[float, float]] = {
    "cifar10": (36.0 / 255.0, 0.5),
    "cifar100": (0.2, 0.75),
}
CRC_CERTIFICATE = "crc-lip"
CHECKPOINT_NAME = "checkpoint.safetensors"
LOG_NAME = "train_log.jsonl"
CONFIG_NAME = "config.json"
BEST_NAME = "best.safetensors"
MODEL_NAME = "model.safetensors"
CHECKPOINT_FORMAT = "lipcli-checkpoint"
CHECKPOINT_VERSION = 1
#: testing hook: "EPOCH:STEP" (0-based) raises KeyboardInterrupt before that training step;
#: "end" sends the process a real SIGINT after the last epoch, before the model is written
INTERRUPT_ENV = "LIPCLI_TRAIN_INTERRUPT_AT"


@dataclass
class TrainConfig:
    """Everything that determines a training run (JSON-serialisable; stored in the model file).

    ``None`` means "automatic" and is resolved by :meth:`resolved` (the resolved config is
    what gets printed and stored).
    """

    # model (component choices accept "name:key=value,...")
    arch: str = "lipconvnet-5"
    conv: str = "soc-fast"
    activation: str = "maxmin"
    pool: str = "max"
    head: str = "lln"
    width: int | None = None
    # data
    dataset: str = "cifar10"
    data_dir: str | None = None
    download: bool = False
    augment: bool = True
    val_split: float = 0.0
    keep_best: bool = False
    limit_train: int | None = None
    limit_test: int | None = None
    # optimisation (SPEC §6)
    epochs: int = 200
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])
    lr_gamma: float = 0.1
    grad_clip: float | None = None
    seed: int = 0
    power_iter_steps: int = 50
    lipschitz_estimate: bool = True
    # CRC-Lip training (SPEC §4); None: paper value for the data set, unused for other heads
    attack_radius: float | None = None
    curvature_weight: float | None = None
    attack_steps: int = 5
    curvature_power_steps: int = 2
    curvature_classes: int = 0
    # execution
    device: str = "auto"
    workers: int | None = None
    amp: bool = False
    eval_batch_size: int = 256
    #: replay each training step from a CUDA graph: "auto" (on CUDA where the configuration
    #: allows), "on" (the same, and say why where it cannot), "off"
    cuda_graphs: str = "auto"

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def updated(self, data: dict[str, Any], *, source: str = "config") -> "TrainConfig":
        """A copy with ``data`` applied (keys may use '-' for '_'); values are type-checked."""
        names = set(self.field_names())
        changes: dict[str, Any] = {}
        for raw_key, value in data.items():
            key = str(raw_key).replace("-", "_")
            if key not in names:
                raise LipUsageError(
                    f"{source}: unknown setting {raw_key!r}; valid: {', '.join(sorted(names))}"
                )
            changes[key] = _coerce(key, value, source)
        return dataclasses.replace(self, **changes)

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`LipUsageError` (one line) for any out-of-range value."""

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise LipUsageError(message)

        need(self.epochs >= 1, f"--epochs must be at least 1, got {self.epochs}")
        need(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        need(self.eval_batch_size >= 1, f"eval_batch_size must be at least 1, got {self.eval_batch_size}")
        need(math.isfinite(self.lr) and self.lr > 0, f"--lr must be positive, got {self.lr}")
        need(0 <= self.momentum < 1, f"--momentum must be in [0, 1), got {self.momentum}")
        need(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        need(self.lr_gamma > 0, f"lr_gamma must be positive, got {self.lr_gamma}")
        need(
            all(0 < m <= 1 for m in self.lr_milestones)
            and list(self.lr_milestones) == sorted(self.lr_milestones),
            f"lr_milestones must be increasing fractions in (0, 1], got {self.lr_milestones}",
        )
        need(self.grad_clip is None or self.grad_clip >= 0, f"--grad-clip must be >= 0, got {self.grad_clip}")
        need(0 <= self.val_split < 1, f"--val-split must be in [0, 1), got {self.val_split}")
        need(not self.keep_best or self.val_split > 0, "--keep-best needs --val-split FRACTION")
        for name in ("limit_train", "limit_test"):
            value = getattr(self, name)
            need(value is None or value >= 1, f"--{name.replace('_', '-')} must be at least 1, got {value}")
        need(self.width is None or self.width >= 1, f"--width must be at least 1, got {self.width}")
        need(self.power_iter_steps >= 1, f"power_iter_steps must be at least 1, got {self.power_iter_steps}")
        need(
            self.attack_radius is None or (math.isfinite(self.attack_radius) and self.attack_radius >= 0),
            f"--attack-radius must be >= 0, got {self.attack_radius}",
        )
        need(
            self.curvature_weight is None or self.curvature_weight >= 0,
            f"--curvature-weight must be >= 0, got {self.curvature_weight}",
        )
        need(self.attack_steps >= 1, f"attack_steps must be at least 1, got {self.attack_steps}")
        need(self.curvature_power_steps >= 0, "curvature_power_steps must be >= 0")
        need(self.curvature_classes >= 0, "curvature_classes must be >= 0 (0 = all classes)")
        need(self.workers is None or self.workers >= 0, f"--workers must be >= 0, got {self.workers}")
        need(self.seed >= 0, f"--seed must be >= 0, got {self.seed}")
        check_device_name(self.device)
        need(self.cuda_graphs in GRAPH_MODES,
             f"--cuda-graphs must be one of {', '.join(GRAPH_MODES)}, got {self.cuda_graphs!r}")

    def resolved(self, *, dataset_name: str, crc: bool) -> "TrainConfig":
        """Fill the automatic values: gradient clipping and the CRC settings for the head."""
        changes: dict[str, Any] = {}
        if self.grad_clip is None:
            changes["grad_clip"] = 1.0 if crc else 0.0
        if crc:
            rho, gamma = PAPER_CRC_SETTINGS.get(dataset_name, PAPER_CRC_SETTINGS["cifar10"])
            if self.attack_radius is None:
                changes["attack_radius"] = rho
            if self.curvature_weight is None:
                changes["curvature_weight"] = gamma
        else:
            for name in ("attack_radius", "curvature_weight"):
                if getattr(self, name) is not None:
                    raise LipUsageError(
                        f"--{name.replace('_', '-')} applies only to heads certified by "
                        f"{CRC_CERTIFICATE} (e.g. --head mlp), not to head {self.head!r}"
                    )
        if self.data_dir is not None:
            changes["data_dir"] = str(Path(self.data_dir).expanduser().absolute())
        return dataclasses.replace(self, **changes)


_OPTIONAL_INT = {"width", "limit_train", "limit_test", "workers"}
_OPTIONAL_FLOAT = {"grad_clip", "attack_radius", "curvature_weight"}
_OPTIONAL_STR = {"data_dir"}


def _coerce(key: str, value: Any, source: str) -> Any:
    default = getattr(TrainConfig(), key)

    def bad(kind: str) -> LipUsageError:
        return LipUsageError(f"{source}: setting {key!r} must be {kind}, got {value!r}")

    if value is None:
        if key in _OPTIONAL_INT | _OPTIONAL_FLOAT | _OPTIONAL_STR:
            return None
        raise bad("set")
    if key == "lr_milestones":
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            raise bad("a list of numbers")
        return [float(v) for v in value]
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if isinstance(default, int) or key in _OPTIONAL_INT:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad("an integer")
        return value
    if isinstance(default, float) or key in _OPTIONAL_FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if isinstance(value, dict) and "name" in value and key in ("arch", "conv", "activation", "pool", "head", "dataset"):
        params = value.get("params") or {}
        return value["name"] + ("" if not params else ":" + ",".join(f"{k}={v}" for k, v in params.items()))
    if not isinstance(value, str):
        raise bad("a string")
    return value


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a TOML (``.toml``), JSON (``.json``) or YAML (``.yaml``/``.yml``) settings file.

    A top-level ``[train]`` table / ``train:`` mapping is used if present, else the whole file.
    """
    p = Path(path)
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
