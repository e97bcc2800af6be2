"""Training configuration: :class:`TrainConfig`, settings files, run-file names and constants."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lipcli.sdk.errors import LipUsageError
from lipcli._util.devices import check_device_name
from lipcli.host.defaults import COMPONENT_SETTINGS, DEFAULT_COMPONENTS
from lipcli.train.errors import TrainUsageError, literal


#: optimisers (``--optimizer``) and the learning rate each uses when ``--lr`` is not given
OPTIMIZER_LR: dict[str, float] = {"sgd": 0.1, "adamw": 1e-3, "nadam": 1e-3}
#: learning-rate schedules (``--schedule``): the paper's step decay, cosine to 0, or SLL's
#: triangular one (0 -> lr at 40 %, lr/20 at 80 %, 0 at the end)
SCHEDULES: tuple[str, ...] = ("step", "cosine", "triangular")
#: Adam's (beta1, beta2) for adamw and nadam: torch's defaults
DEFAULT_BETAS: tuple[float, float] = (0.9, 0.999)
#: the fraction of each batch drawn from ``--extra-data`` when ``--extra-ratio`` is not given
DEFAULT_EXTRA_RATIO = 0.5
#: data loader worker processes on CUDA when ``workers`` is not given (0 on CPU)
MAX_CUDA_WORKERS = 4
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
#: processes per node of ``lip train`` (``--nproc-per-node``): 1 is one plain process; N > 1
#: launches N worker processes (:mod:`lipcli.train.launch`)
DEFAULT_NPROC_PER_NODE = 1
#: upper limits of settings whose larger values can only be typos (the paper trains 200
#: epochs; a machine has far fewer than 256 accelerators or useful CPU processes)
MAX_EPOCHS = 100_000
MAX_NPROC_PER_NODE = 256
#: the largest (global) training or evaluation batch, and power-iteration steps per refresh
MAX_BATCH_SIZE = 65_536
MAX_POWER_ITER_STEPS = 1000
#: set to ``"lipcli"`` in the environment of the workers that :mod:`lipcli.train.launch`
#: starts (unset under ``torchrun``): the messages that tell how to continue a run name the
#: launcher that started it
LAUNCHER_ENV = "LIPCLI_LAUNCHER"
#: set by :mod:`lipcli.train.launch` for its workers: the directory where a failing worker
#: leaves its one-line error (the launcher prints it, once)
LAUNCH_ERRORS_ENV = "LIPCLI_LAUNCH_ERRORS"
#: set by :mod:`lipcli.train.launch` for its workers: the launching process's id (a worker
#: whose parent is no longer that process stops: :func:`lipcli.train.launch.follow_launcher`)
LAUNCHER_PID_ENV = "LIPCLI_LAUNCHER_PID"


@dataclass
class TrainConfig:
    """Everything that determines a training run (JSON-serialisable; stored in the model file).

    ``None`` means "automatic" and is resolved by :meth:`resolved` (the resolved config is
    what gets printed and stored).
    """

    # model (component choices accept "name:key=value,...")
    arch: str = DEFAULT_COMPONENTS["arch"]
    conv: str = DEFAULT_COMPONENTS["conv"]
    activation: str = DEFAULT_COMPONENTS["activation"]
    pool: str = DEFAULT_COMPONENTS["pool"]
    head: str = DEFAULT_COMPONENTS["head"]
    width: int | None = None
    # data
    dataset: str = DEFAULT_COMPONENTS["dataset"]
    data_dir: str | None = None
    download: bool = False
    augment: bool = True
    # the training augmentation policy (an ``augmentation`` component; the default is the data
    # set's own crop and flip, which every model file without this key was trained with)
    augmentation: str = DEFAULT_COMPONENTS["augmentation"]
    val_split: float = 0.0
    keep_best: bool = False
    limit_train: int | None = None
    limit_test: int | None = None
    extra_data: str | None = None
    extra_ratio: float | None = None
    # optimisation (SPEC §6); the paper's recipe: SGD, step decay, no warm-up, no lookahead
    epochs: int = 200
    batch_size: int = 128
    optimizer: str = "sgd"
    lr: float | None = None
    momentum: float = 0.9
    betas: list[float] = field(default_factory=lambda: list(DEFAULT_BETAS))
    weight_decay: float = 5e-4
    lookahead: int = 0
    lookahead_alpha: float = 0.5
    schedule: str = "step"
    warmup_epochs: float = 0.0
    lr_milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])
    lr_gamma: float = 0.1
    grad_clip: float | None = None
    seed: int = 0
    power_iter_steps: int = 50
    lipschitz_estimate: bool = True
    # training loss (a ``loss`` component); None: the head's default (``HeadSpec.loss``)
    loss: str | None = None
    # loss parameters given by their shortcut settings (declared by the loss specs,
    # ``Param.shortcut``; a settings key or ``lip train --KEY``): shortcut -> value; folded
    # into ``loss`` (and emptied) by :func:`lipcli.train.objective.resolve_loss`
    loss_shortcuts: dict[str, Any] = field(default_factory=dict)
    # execution
    device: str = "auto"
    workers: int | None = None
    amp: bool = False
    eval_batch_size: int = 256
    #: replay each training step from a CUDA graph: "auto" (on CUDA where the configuration
    #: allows), "on" (the same, and say why where it cannot), "off"
    cuda_graphs: str = "auto"
    #: torch.compile the training forward: True, False, or None (per device:
    #: lipcli.compiling.AUTO_COMPILE); ``compile_mode``: the torch.compile mode
    compile: bool | None = None
    compile_mode: str = "default"
    # the recipe the run started from (``lip train --recipe``; ``"name@version"``) and the
    # settings given over it: key -> {"recipe": its value, "value": the one used}
    recipe: str | None = None
    recipe_overrides: dict[str, Any] = field(default_factory=dict)

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def updated(self, data: dict[str, Any], *, source: str = "config") -> "TrainConfig":
        """A copy with ``data`` applied (keys may use '-' for '_'); values are type-checked.
        A key that is no field but a loss parameter's shortcut (:func:`loss_shortcut_names`)
        goes into ``loss_shortcuts`` (``None``: not given, as older model files store them)."""
        names = set(self.field_names())
        changes: dict[str, Any] = {}
        shortcuts = dict(self.loss_shortcuts)
        for raw_key, value in data.items():
            key = str(raw_key).replace("-", "_")
            if key not in names:
                valid = loss_shortcut_names()
                if key not in valid:
                    raise LipUsageError(f"{source}: unknown setting {raw_key!r}; "
                                        f"valid: {', '.join(sorted(names - {'loss_shortcuts'} | valid))}")
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
                    raise LipUsageError(f"{source}: setting {key!r} must be a number or a string, got {value!r}")
                shortcuts.pop(key, None)
                if value is not None:
                    shortcuts[key] = value
                changes["loss_shortcuts"] = shortcuts
                continue
            changes[key] = _coerce(key, value, source)
        return dataclasses.replace(self, **changes)

    # -- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`~lipcli.train.errors.TrainUsageError` (one line, naming the setting as
        a field a front end spells its own way) for any out-of-range value."""

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise TrainUsageError(message)

        def got(name: str) -> str:  # ", got VALUE" (a value is text, never a field)
            return f", got {literal(getattr(self, name))}"

        def got_r(name: str) -> str:
            return f", got {literal(repr(getattr(self, name)))}"

        need(self.epochs >= 1, "{epochs} must be at least 1" + got("epochs"))
        need(self.epochs <= MAX_EPOCHS, f"{{epochs}} must be at most {MAX_EPOCHS}" + got("epochs"))
        need(1 <= self.batch_size <= MAX_BATCH_SIZE,
             f"{{batch_size}} must be in 1..{MAX_BATCH_SIZE}" + got("batch_size"))
        need(1 <= self.eval_batch_size <= MAX_BATCH_SIZE,
             f"eval_batch_size must be in 1..{MAX_BATCH_SIZE}" + got("eval_batch_size"))
        need(self.lr is None or (math.isfinite(self.lr) and self.lr > 0), "{lr} must be positive" + got("lr"))
        need(self.optimizer in OPTIMIZER_LR,
             f"{{optimizer}} must be one of {', '.join(OPTIMIZER_LR)}" + got_r("optimizer"))
        need(self.schedule in SCHEDULES,
             f"{{schedule}} must be one of {', '.join(SCHEDULES)}" + got_r("schedule"))
        need(math.isfinite(self.warmup_epochs) and 0 <= self.warmup_epochs <= self.epochs,
             "{warmup_epochs} must be in [0, {epochs}]" + got("warmup_epochs"))
        need(self.lookahead >= 0, "{lookahead} must be >= 0 (0 = off)" + got("lookahead"))
        need(0 < self.lookahead_alpha <= 1, "lookahead_alpha must be in (0, 1]" + got("lookahead_alpha"))
        need(self.extra_ratio is None or self.extra_data is not None, "{extra_ratio} needs {extra_data} FILE")
        need(self.extra_ratio is None or (0 < self.extra_ratio < 1),
             "{extra_ratio} must be in (0, 1)" + got("extra_ratio"))
        need(0 <= self.momentum < 1, "{momentum} must be in [0, 1)" + got("momentum"))
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             "{betas} must be two numbers in [0, 1)" + got("betas"))
        need(self.weight_decay >= 0, "{weight_decay} must be >= 0" + got("weight_decay"))
        need(self.lr_gamma > 0, "lr_gamma must be positive" + got("lr_gamma"))
        need(
            all(0 < m <= 1 for m in self.lr_milestones)
            and list(self.lr_milestones) == sorted(self.lr_milestones),
            "lr_milestones must be increasing fractions in (0, 1]" + got("lr_milestones"),
        )
        need(self.grad_clip is None or self.grad_clip >= 0, "{grad_clip} must be >= 0" + got("grad_clip"))
        need(0 <= self.val_split < 1, "{val_split} must be in [0, 1)" + got("val_split"))
        need(not self.keep_best or self.val_split > 0, "{keep_best} needs {val_split} FRACTION")
        for name in ("limit_train", "limit_test"):
            value = getattr(self, name)
            need(value is None or value >= 1, f"{{{name}}} must be at least 1" + got(name))
        need(self.width is None or self.width >= 1, "{width} must be at least 1" + got("width"))
        need(1 <= self.power_iter_steps <= MAX_POWER_ITER_STEPS,
             f"power_iter_steps must be in 1..{MAX_POWER_ITER_STEPS}" + got("power_iter_steps"))
        need(self.workers is None or self.workers >= 0, "{workers} must be >= 0" + got("workers"))
        need(self.seed >= 0, "{seed} must be >= 0" + got("seed"))
        from lipcli.train.cuda_graphs import GRAPH_MODES  # lazy: imports torch; this module is read by lip --help

        check_device_name(self.device)
        need(self.cuda_graphs in GRAPH_MODES,
             f"{{cuda_graphs}} must be one of {', '.join(GRAPH_MODES)}" + got_r("cuda_graphs"))
        from lipcli.compiling import COMPILE_MODES, GRAPHING_MODES

        need(self.compile_mode in COMPILE_MODES,
             f"{{compile_mode}} must be one of {', '.join(COMPILE_MODES)}" + got_r("compile_mode"))
        need(not (self.cuda_graphs == "on" and self.compile and self.compile_mode in GRAPHING_MODES),
             f"{{compile_mode}} {self.compile_mode} replays CUDA graphs itself; drop {{cuda_graphs}} on")

    def resolved(self) -> "TrainConfig":
        """Fill the automatic values that need no plugin: the optimiser's learning rate, the
        extra-data ratio, absolute paths.  (The loss and ``grad_clip`` are resolved by
        :func:`lipcli.train.objective.resolve_loss`.)"""
        changes: dict[str, Any] = {}
        if self.lr is None:
            changes["lr"] = OPTIMIZER_LR[self.optimizer]
        if self.extra_data is not None:
            changes["extra_data"] = str(Path(self.extra_data).expanduser().absolute())
            if self.extra_ratio is None:
                changes["extra_ratio"] = DEFAULT_EXTRA_RATIO
        if self.data_dir is not None:
            changes["data_dir"] = str(Path(self.data_dir).expanduser().absolute())
        return dataclasses.replace(self, **changes)


_OPTIONAL_INT = {"width", "limit_train", "limit_test", "workers"}
_OPTIONAL_BOOL = {"compile"}
_OPTIONAL_FLOAT = {"grad_clip", "lr", "extra_ratio"}
_OPTIONAL_STR = {"data_dir", "loss", "extra_data", "recipe"}


def _coerce(key: str, value: Any, source: str) -> Any:
    default = getattr(TrainConfig(), key)

    def bad(kind: str) -> LipUsageError:
        return LipUsageError(f"{source}: setting {key!r} must be {kind}, got {value!r}")

    if value is None:
        if key in _OPTIONAL_INT | _OPTIONAL_FLOAT | _OPTIONAL_STR | _OPTIONAL_BOOL:
            return None
        raise bad("set")
    if key == "loss_shortcuts":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad("a table of loss parameter shortcuts")
        return TrainConfig().updated(value, source=source).loss_shortcuts
    if key == "recipe_overrides":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad("a table of settings")
        return dict(value)
    if key == "betas":  # a list, or "B1,B2" as --betas gives it
        parts = value.split(",") if isinstance(value, str) else value
        try:
            if not isinstance(parts, (list, tuple)) or any(isinstance(v, bool) for v in parts):
                raise ValueError
            return [float(v) for v in parts]
        except ValueError:
            raise bad("two numbers, B1,B2") from None
    if key == "lr_milestones":
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            raise bad("a list of numbers")
        return [float(v) for v in value]
    if isinstance(default, bool) or key in _OPTIONAL_BOOL:
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
    if isinstance(value, dict) and "name" in value and key in COMPONENT_SETTINGS:
        params = value.get("params") or {}
        return value["name"] + ("" if not params else ":" + ",".join(f"{k}={v}" for k, v in params.items()))
    if not isinstance(value, str):
        raise bad("a string")
    return value


def loss_shortcut_names() -> set[str]:
    """The shortcut settings that the installed losses declare (``Param.shortcut``)."""
    from lipcli.host.plugins import get_registry  # lazy: loads the plugins (torch); lip --help reads this module

    reg = get_registry()
    return {p.shortcut for name in reg.names("loss") for p in reg.get("loss", name).params if p.shortcut}


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
