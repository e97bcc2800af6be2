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
from lipcli._util.constants import COMPILE_MODES, GRAPHING_MODES
from lipcli.host.settings import problems, setting, settings_of
from lipcli.host.settings_file import load_config_file  # noqa: F401  (re-exported: lipcli.train)
from lipcli.train.errors import TrainUsageError, literal


#: the built-in optimisers (``--optimizer``; plugin ``lipcli.optimizers``) and the learning
#: rate each uses when ``--lr`` is not given (a plugin's: its ``OptimizerSpec.default_lr``)
OPTIMIZER_LR: dict[str, float] = {"sgd": 0.1, "adamw": 1e-3, "nadam": 1e-3}
#: learning-rate schedules (``--schedule``): the paper's step decay, cosine to 0, SLL's
#: triangular one (0 -> lr at 40 %, lr/20 at 80 %, 0 at the end), or torch's ``OneCycleLR``
#: with its defaults (max lr = ``--lr``; the comparison study's)
SCHEDULES: tuple[str, ...] = ("step", "cosine", "triangular", "onecycle")
#: Adam's (beta1, beta2) for adamw and nadam: torch's defaults
DEFAULT_BETAS: tuple[float, float] = (0.9, 0.999)
#: the fraction of each batch drawn from ``{extra_data}`` when ``--extra-ratio`` is not given
DEFAULT_EXTRA_RATIO = 0.5
#: modes of ``cuda_graphs`` (:mod:`lipcli.train.cuda_graphs`)
GRAPH_MODES: tuple[str, ...] = ("auto", "on", "off")
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
#: "end" ("end-term") sends the process a real SIGINT (SIGTERM) after the last epoch, before the model is written
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
#: the largest learning rate (a larger one is no float32 number the optimiser can step with;
#: below it a diverging run is stopped by the divergence guard, one line), weight decay and
#: step-decay factor (beyond them the weights overflow float32 within a step): typos, refused
#: before any work
MAX_LR = 1e30
MAX_WEIGHT_DECAY = 10.0
MAX_LR_GAMMA = 10.0
#: seeds are 64-bit (``torch.manual_seed``)
MAX_SEED = (1 << 64) - 1
#: data loader worker processes at most: this many per CPU core, and never above MAX_WORKERS
WORKERS_PER_CORE = 4
MAX_WORKERS = 256


def max_workers() -> int:
    """The most data loader workers on this machine (:data:`WORKERS_PER_CORE` per core)."""
    import os

    return min(MAX_WORKERS, WORKERS_PER_CORE * (os.cpu_count() or 1))
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


_M, _D, _O, _R = "model", "data", "optim", "run"
_COMPONENT = "NAME or NAME:key=value,..."
#: the learning rates per optimiser, as the help of ``lr`` states them
_LRS = ", ".join(f"{name} {lr:g}" for name, lr in OPTIMIZER_LR.items())


@dataclass
class TrainConfig:
    """Everything that determines a training run (JSON-serialisable; stored in the model file).

    Each field is a declared setting (:func:`lipcli.host.settings.setting`: default, help,
    owner, range): ``lip train``'s options, their help, the settings-file and recipe keys and
    the range checks of :meth:`validate` are derived from these declarations.  ``None`` means
    "automatic" and is resolved by :meth:`resolved` (the resolved config is what gets printed
    and stored).
    """

    # model (component choices accept "name:key=value,..."); a layer kind the architecture
    # fixes itself (not one of its slots, ArchSpec.slots) is None in a resolved run
    arch: str = setting(DEFAULT_COMPONENTS["arch"], f"Architecture ({_COMPONENT}; `lip plugins` lists them); "
                        f"{DEFAULT_COMPONENTS['arch']} is the CPU-friendly baseline, the paper's best CIFAR "
                        "models are lipconvnet-10..40.", owner=_M)
    conv: str | None = setting(DEFAULT_COMPONENTS["conv"], f"Convolution ({_COMPONENT}): {{names}}.", owner=_M,
                        component="conv")
    activation: str | None = setting(DEFAULT_COMPONENTS["activation"], f"Activation ({_COMPONENT}): {{names}}.",
                              owner=_M, component="activation")
    pool: str | None = setting(DEFAULT_COMPONENTS["pool"], f"Pooling ({_COMPONENT}): {{names}}.", owner=_M,
                        component="pool")
    head: str = setting(DEFAULT_COMPONENTS["head"], "Head: {names}.", owner=_M, component="head")
    width: int | None = setting(None, "Architecture width (channels after the stem; paper 32); default: "
                                "the architecture's.", owner=_M, min=1)
    # data
    dataset: str = setting(DEFAULT_COMPONENTS["dataset"], f"Data set ({_COMPONENT}): {{names}}.", owner=_D,
                           component="dataset")
    data_dir: str | None = setting(None, "Data set root directory (cifar10: DIR/cifar-10-batches-py/...; "
                                   "imagefolder: DIR/train, DIR/test).", owner=_D, cli=False)
    download: bool = setting(False, "Download a missing CIFAR-10/100.", owner=_D, cli=False)
    augment: bool = setting(True, "Random crop (+ flip) augmentation.", owner=_D, negative=True)
    # the training augmentation policy (an ``augmentation`` component; the default is the data
    # set's own crop and flip, which every model file without this key was trained with)
    augmentation: str = setting(DEFAULT_COMPONENTS["augmentation"], "Training augmentation policy "
                                f"({_COMPONENT}): {{names}}; default: {DEFAULT_COMPONENTS['augmentation']} "
                                "(the data set's own). `lip plugins -v` lists parameters.", owner=_D,
                                component="augmentation")
    val_split: float = setting(0.0, "Hold out this fraction of the training set for validation (never the "
                               "test set).", owner=_D, min=0.0, max=1.0, max_open=True)
    keep_best: bool = setting(False, "Keep the weights of the best validation epoch (needs {val_split}).",
                              owner=_D)
    limit_train: int | None = setting(None, "Train on a seeded random subset of N images.", owner=_D, min=1)
    limit_test: int | None = setting(None, "Test on N images: a seeded subset stratified by class, the same "
                                     "for every {seed} and the one `lip certify` evaluates with {limit} N.",
                                     owner=_D, min=1)
    extra_data: str | None = setting(None, "Extra training images: an uncompressed .npz (or a directory) "
                                     "with 'image' uint8 NxHxWxC and 'label'; memory-mapped, augmented like "
                                     "the data set.", owner=_D)
    extra_ratio: float | None = setting(None, "Fraction of each batch drawn from {extra_data} (default "
                                        f"{DEFAULT_EXTRA_RATIO:g}).", owner=_D, min=0.0, min_open=True,
                                        max=1.0, max_open=True)
    # optimisation (SPEC §6); the paper's recipe: SGD, step decay, no warm-up, no lookahead
    epochs: int = setting(200, "Epochs.", owner=_O, min=1, max=MAX_EPOCHS)
    batch_size: int = setting(128, "Global batch size, split over processes.", owner=_O, min=1,
                              max=MAX_BATCH_SIZE)
    optimizer: str = setting("sgd", f"Optimiser ({_COMPONENT}): {{names}} (sgd: the paper's).", owner=_O,
                             component="optimizer")
    lr: float | None = setting(None, f"Learning rate (default per optimiser: {_LRS}).", owner=_O, min=0.0,
                               min_open=True, max=MAX_LR)
    momentum: float = setting(0.9, "SGD momentum.", owner=_O, min=0.0, max=1.0, max_open=True)
    betas: list[float] = setting(list(DEFAULT_BETAS), "Adam's B1,B2 for adamw and nadam.", owner=_O)
    weight_decay: float = setting(5e-4, "Weight decay on conv filters and the LLN weight.", owner=_O,
                                  min=0.0, max=MAX_WEIGHT_DECAY)
    lookahead: int = setting(0, "Wrap the optimiser in Lookahead, syncing every K steps (alpha "
                             "lookahead_alpha); 0: off.", owner=_O, min=0)
    lookahead_alpha: float = setting(0.5, "Lookahead's interpolation factor.", owner=_O, min=0.0,
                                     min_open=True, max=1.0, cli=False)
    schedule: str = setting("step", f"LR schedule per step: {', '.join(SCHEDULES)} (step: x lr_gamma at "
                            "lr_milestones of training, by default x0.1 at 50% and 75%; triangular: SLL's, "
                            "0 -> lr at 40%, lr/20 at 80%, 0 at the end).", owner=_O, choices=SCHEDULES)
    warmup_epochs: float = setting(0.0, "Linear LR warm-up over this many epochs.", owner=_O, min=0.0)
    lr_milestones: list[float] = setting([0.5, 0.75], "Fractions of training where the step schedule "
                                         "multiplies the rate by lr_gamma.", owner=_O, cli=False)
    lr_gamma: float = setting(0.1, "Factor of the step schedule.", owner=_O, min=0.0, min_open=True,
                              max=MAX_LR_GAMMA, cli=False)
    grad_clip: float | None = setting(None, "Gradient-norm clipping (default: the loss's; 0 = off).",
                                      owner=_O, min=0.0)
    seed: int = setting(0, "Random seed.", owner=_O, min=0, max=MAX_SEED)
    power_iter_steps: int = setting(50, "Power-iteration steps of each refresh (SOC).", owner=_O, min=1,
                                    max=MAX_POWER_ITER_STEPS, cli=False)
    lipschitz_estimate: bool = setting(True, "Also store the power-method estimate of Lip(g) (the "
                                       "guaranteed bound is always stored).", owner=_R,
                                       negative=True)
    # training loss (a ``loss`` component); None: the head's default (``HeadSpec.loss``)
    loss: str | None = setting(None, f"Training loss ({_COMPONENT}): {{names}} or a plugin's; default: the "
                               "head's. `lip plugins -v` lists parameters.", owner=_O, component="loss")
    # loss parameters given by their shortcut settings (declared by the loss specs,
    # ``Param.shortcut``; a settings key or ``lip train --KEY``): shortcut -> value; folded
    # into ``loss`` (and emptied) by :func:`lipcli.train.objective.resolve_loss`
    loss_shortcuts: dict[str, Any] = field(default_factory=dict)
    # execution
    device: str = setting("auto", "Device: auto (CUDA if available), cpu, cuda or cuda:N.", owner=_R,
                          cli=False)
    workers: int | None = setting(None, "Data loader worker processes (default: 0 on CPU, up to "
                                  f"{MAX_CUDA_WORKERS} on CUDA).", owner=_R, min=0)
    amp: bool = setting(False, "Mixed precision for training steps (bf16; evaluation stays fp32).", owner=_R)
    eval_batch_size: int = setting(256, "Batch size of validation and the test evaluation (may change on "
                                   "{resume}).", owner=_R, min=1, max=MAX_BATCH_SIZE)
    #: replay each training step from a CUDA graph: "auto" (on CUDA where the configuration
    #: allows), "on" (the same, and say why where it cannot), "off"
    cuda_graphs: str = setting("auto", "auto (on CUDA where the configuration allows), on or off: replay "
                               "each training step from a CUDA graph (same values; fewer kernel launches).",
                               owner=_R, choices=GRAPH_MODES)
    #: torch.compile the training forward (lipcli.compiling); None: per device (AUTO_COMPILE)
    compile: bool | None = setting(None, "torch.compile the training forward (the bound and the model file "
                                   "come from the stored weights as always; compile time is reported apart). "
                                   "Default: per device (eager on CPU and CUDA).", owner=_R, negative=True)
    compile_mode: str = setting("default", "torch.compile mode with {compile}.", owner=_R,
                                choices=COMPILE_MODES)
    # the recipe the run started from (``lip train --recipe``; ``"name@version"``) and the
    # settings given over it: key -> {"recipe": its value, "value": the one used}
    recipe: str | None = None
    recipe_overrides: dict[str, Any] = field(default_factory=dict)
    # a wall-clock training budget ("2h", "10m", "90s"; lipcli.train.budget): the epochs are
    # fixed from a measured step time; ``budget`` records that plan (set by the trainer)
    time_budget: str | None = setting(None, "Train for this wall-clock time (90s, 10m, 2h, 1h30m): the step "
                                      "time is measured first and fixes the epochs (replacing {epochs}) and "
                                      "the schedule; the run stops once its training time reaches it.",
                                      owner=_O)
    budget: dict[str, Any] = field(default_factory=dict)

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
        a field a front end spells its own way) for any out-of-range value: the declared
        ranges and choices (:func:`lipcli.host.settings.problems`), then what ties settings."""

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise TrainUsageError(message)

        for problem in problems(self):
            raise TrainUsageError(problem)
        need(self.warmup_epochs <= self.epochs,
             "{warmup_epochs} must be in [0, {epochs}], got " + literal(self.warmup_epochs))
        if self.time_budget is not None:
            from lipcli.train.budget import parse_duration

            try:
                parse_duration(self.time_budget)
            except ValueError as exc:
                need(False, "{time_budget}: " + literal(str(exc)))
        need(str(self.optimizer).partition(":")[0].strip() in optimizer_names(),
             f"{{optimizer}} must be one of {', '.join(optimizer_names())}, got " + literal(repr(self.optimizer)))
        need(self.extra_ratio is None or self.extra_data is not None, "{extra_ratio} needs {extra_data} FILE")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             "{betas} must be two numbers in [0, 1), got " + literal(self.betas))
        need(
            all(0 < m <= 1 for m in self.lr_milestones)
            and list(self.lr_milestones) == sorted(self.lr_milestones),
            "{lr_milestones} must be increasing fractions in (0, 1], got " + literal(self.lr_milestones),
        )
        need(not self.keep_best or self.val_split > 0, "{keep_best} needs {val_split} FRACTION")
        need(self.workers is None or self.workers <= max_workers(),
             f"{{workers}} must be at most {max_workers()} ({WORKERS_PER_CORE} per CPU core here), got "
             + literal(self.workers))
        check_device_name(self.device)
        need(not (self.cuda_graphs == "on" and self.compile and self.compile_mode in GRAPHING_MODES),
             f"{{compile_mode}} {literal(self.compile_mode)} replays CUDA graphs itself; drop {{cuda_graphs}} on")

    def resolved(self) -> "TrainConfig":
        """Fill the automatic values that need no plugin: the optimiser's learning rate, the
        extra-data ratio, absolute paths.  (The loss and ``grad_clip`` are resolved by
        :func:`lipcli.train.objective.resolve_loss`.)"""
        changes: dict[str, Any] = {}
        if self.lr is None:
            changes["lr"] = optimizer_default_lr(self.optimizer)
        if self.extra_data is not None:
            changes["extra_data"] = str(Path(self.extra_data).expanduser().absolute())
            if self.extra_ratio is None:
                changes["extra_ratio"] = DEFAULT_EXTRA_RATIO
        if self.data_dir is not None:
            changes["data_dir"] = str(Path(self.data_dir).expanduser().absolute())
        return dataclasses.replace(self, **changes)


def _coerce(key: str, value: Any, source: str) -> Any:
    """``value`` read for setting ``key`` as its declared type (a :class:`LipUsageError` naming
    ``source`` if it cannot be); ranges are :meth:`TrainConfig.validate`'s."""
    declared = {s.name: s for s in settings_of(TrainConfig)}.get(key)

    def bad(kind: str) -> LipUsageError:
        return LipUsageError(f"{source}: setting {key!r} must be {kind}, got {value!r}")

    if value is None:
        if key == "recipe" or (declared is not None and declared.optional):
            return None
        raise bad("set")
    if key == "loss_shortcuts":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad("a table of loss parameter shortcuts")
        return TrainConfig().updated(value, source=source).loss_shortcuts
    if key == "budget":  # the trainer's record of a --time-budget plan (lipcli.train.budget)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise LipUsageError(f"{source}: setting 'budget' must be a table, got {value!r}")
        return dict(value)
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
    kind = str if declared is None else declared.type
    if kind is list:
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            raise bad("a list of numbers")
        return [float(v) for v in value]
    if kind is bool:
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad("an integer")
        return value
    if kind is float:
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


def optimizer_names() -> list[str]:
    """The installed optimisers (kind ``optimizer``): the built-ins of :data:`OPTIMIZER_LR`,
    then the plugins'."""
    from lipcli.host.plugins import get_registry  # lazy: loads the plugins (torch)

    names = get_registry().names("optimizer")
    return [n for n in OPTIMIZER_LR if n in names] + [n for n in names if n not in OPTIMIZER_LR]


def optimizer_default_lr(choice: str) -> float:
    """The learning rate of the optimiser ``choice`` (``NAME[:params]``) when ``--lr`` is not given."""
    name = choice.partition(":")[0].strip()
    if name in OPTIMIZER_LR:
        return OPTIMIZER_LR[name]
    from lipcli.host.plugins import get_registry

    return float(get_registry().get("optimizer", name).default_lr)
