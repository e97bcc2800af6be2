"""The training driver behind ``lip train``: the paper's recipe, resumable, one or many processes.

Recipe (SPEC §6, reference defaults; every value is a :class:`TrainConfig` field):

* SGD, lr 0.1, momentum 0.9, weight decay 5e-4 on the SOC filters and the LLN weight only.
  Concretely: a parameter gets weight decay iff it has >= 2 dimensions (filters, weight
  matrices) and no module lists it in its ``no_weight_decay`` attribute (the MLP head lists
  all of its parameters, projection pooling its ``theta``); biases and angles are 1-D.
* ``MultiStepLR`` x0.1 at 50 % and 75 % of all iterations, stepped once per iteration.
* 200 epochs, batch 128 (the global batch: with N processes each takes 128/N), seed 0,
  random crop + flip (see :mod:`lipcli.builtins.datasets`), gradient-norm clipping at 1.0 for
  heads certified by CRC-Lip (none otherwise).
* Power iteration of SOC layers: ``model.refresh_power_iteration(50)`` at the middle and at
  the end of every epoch (i.e. twice per epoch, and before every evaluation).

Heads (SPEC §4). LLN (``certificate == "lln"``): plain cross-entropy.  CRC-Lip MLP
(``certificate == "crc-lip"``, paper eq. 5)::

    loss = CE(h(y + δ*), l) + γ · mean_{j ≠ l} max(m_lj, M_lj)

* ``y = g(x)`` the features; ``δ*`` from :class:`FeatureAttack`: a 5-step l2 attack on the
  features only, radius ``ρ_f = ρ / min(std)`` (``ρ`` in input space; ``1/min(std)`` is the
  Lipschitz factor of the input normalisation, SPEC's ``ρ / 0.2507`` for CIFAR), step
  ``1.5 ρ_f / 5``, random start of one step length, target = the class of smallest margin
  ``h_l − h_j`` at the current point, each step ``δ ← Π_ball(δ − step · ∇/‖∇‖)`` where ``∇`` is
  the gradient of that margin; no gradient flows through ``δ*`` (``y`` itself carries the
  gradient, "the identity map carries gradients to g").
* ``M_lj = ¼ λ_max(W₁ᵀ diag(d⁺) W₁)``, ``m_lj = ¼ λ_max(W₁ᵀ diag(d⁻) W₁)``, ``d = W₂[l] − W₂[j]``
  (``¼ ≥ softplus''``).  Computed cheaply and differentiably by :class:`CurvaturePenalty`:
  a persistent unit vector ``u`` tracks the top right singular vector of ``W₁`` (one power
  step per training step, 50 at the end of every epoch); per pair, ``curvature_power_steps``
  (2) power steps on ``W₁ᵀ diag(d±) W₁`` start from ``u`` without gradient, and the Rayleigh
  quotient ``¼ Σ_h d±_h (W₁ v)_h²`` at the resulting unit ``v`` is the differentiable value
  (``v`` held constant), as the reference does.  These are LOWER estimates of ``λ_max``: fine
  for a regulariser, never used for certificates.  Pairs: all classes ``j ≠ l`` for the labels
  in the batch (``curvature_classes = 0``), or the ``k`` highest other logits per example
  (``curvature_classes = k``; the reference uses 9).  ``γ`` = ``curvature_weight``.
* Paper settings: CIFAR-10 ``ρ = 36/255``, ``γ = 0.5``; CIFAR-100 ``ρ = 0.2``, ``γ = 0.75``;
  other data sets get CIFAR-10's.

Nothing is lost: a run directory holds ``config.json`` (resolved config), ``train_log.jsonl``
(one JSON object per epoch), ``checkpoint.safetensors`` (model, optimizer, scheduler, AMP
scaler, RNG states and CRC state, all as tensors, plus JSON metadata; no pickle) written
atomically at the start and after every epoch, and ``best.safetensors`` (``keep_best``).
``resume`` continues a killed or interrupted run from its last checkpoint; on one CPU
process it ends bit-identical to an uninterrupted run, because every epoch re-derives its
random state from ``(seed, epoch, rank)`` (:func:`lipcli.data.epoch_seed`).

Several processes (``torchrun --nproc-per-node N -m lipcli train ...``): DDP with NCCL on
CUDA and gloo on CPU, a DistributedSampler, SOC buffers broadcast from rank 0 after every
refresh (and by DDP at every forward); only rank 0 writes files and shows progress.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from . import __version__
from .errors import LipError, LipUsageError

# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
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
#: testing hook: "EPOCH:STEP" (0-based) raises KeyboardInterrupt before that training step
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

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, source: str = "config") -> "TrainConfig":
        return cls().updated(data, source=source)

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
        dev = self.device
        need(
            dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()),
            f"--device must be auto, cpu, cuda or cuda:N, got {dev!r}",
        )

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


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
class TrainingDiverged(LipError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class TrainingInterrupted(LipError):
    """Ctrl-C: the last checkpoint is kept and the message says how to resume."""

    exit_code = 130


# ---------------------------------------------------------------------------------------------
# processes and devices
# ---------------------------------------------------------------------------------------------
@dataclass
class DistContext:
    """This process's place in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    #: launched by torchrun (or with RANK/WORLD_SIZE > 1): use a process group and DDP
    distributed: bool = False
    backend: str | None = None
    initialized: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "DistContext":
        """Read torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``.

        Distributed (process group + DDP) when ``WORLD_SIZE > 1`` or when torchrun launched
        the process (``TORCHELASTIC_RUN_ID`` set), even with one process; else one plain process.
        """
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        launched = "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ
        if world <= 1 and not launched:
            return cls()
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
            distributed=True,
        )

    def resolve_device(self, name: str) -> torch.device:
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        if name.startswith("cuda"):
            if not torch.cuda.is_available():
                raise LipUsageError(f"--device {name}: CUDA is not available on this machine")
            if name == "cuda":
                index = self.local_rank if self.distributed else torch.cuda.current_device()
            else:
                index = int(name[5:])
            if index >= torch.cuda.device_count():
                raise LipUsageError(
                    f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible"
                )
            return torch.device("cuda", index)
        return torch.device("cpu")

    def init(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not self.distributed:
            return
        import torch.distributed as dist

        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {}
            if device.type == "cuda":
                kwargs["device_id"] = device
            dist.init_process_group(backend=self.backend, **kwargs)
        self.initialized = True

    def destroy(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.initialized = False

    def barrier(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            if self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.initialized:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_(self, tensor: torch.Tensor) -> None:
        if self.initialized:
            import torch.distributed as dist

            dist.broadcast(tensor, src=0)

    def broadcast_json(self, obj: Any) -> Any:
        """Rank 0's JSON-serialisable ``obj`` on every rank (tensors, no pickle)."""
        if not self.initialized:
            return obj
        data = json.dumps(obj).encode() if self.is_main else b""
        length = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        self.broadcast_(length)
        buf = torch.zeros(int(length.item()), dtype=torch.uint8, device=self.device)
        if self.is_main:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device))
        self.broadcast_(buf)
        return json.loads(bytes(buf.cpu().tolist()).decode())

    def check_consistent(self, module: nn.Module) -> None:
        """Raise :class:`LipError` unless every rank holds bit-identical parameters and buffers.

        Compares per-tensor fingerprints (sums of the raw bit patterns) with MAX and MIN
        all-reduces: the weights rank 0 saves must be the weights every rank trained.
        """
        if not self.initialized:
            return
        import torch.distributed as dist

        prints = []
        for t in list(module.parameters()) + list(module.buffers()):
            raw = t.detach().contiguous().view(-1)
            if raw.is_floating_point():
                bits = raw.view(torch.int32) if raw.element_size() == 4 else raw.double().view(torch.int64)
            else:
                bits = raw
            b = bits.to(torch.int64)
            prints.extend([b.sum(), (b % 65521).sum()])
        local = torch.stack(prints)
        high, low = local.clone(), local.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if not torch.equal(high, low):
            raise LipError("processes ended with different weights or buffers (DDP out of sync)")

    def sync_module_state(self, module: nn.Module) -> None:
        """Copy rank 0's buffers (SOC power-iteration vectors, ...) to every rank."""
        if not self.initialized:
            return
        for buf in module.buffers():
            self.broadcast_(buf.data)


# ---------------------------------------------------------------------------------------------
# the losses
# ---------------------------------------------------------------------------------------------
def recipe_sgd(param_groups: list[dict[str, Any]], *, lr: float, momentum: float) -> torch.optim.SGD:
    """SGD with momentum (SPEC §6) over ``param_groups`` (``params``, ``weight_decay``).

    The fused implementation (one pass over each parameter, its gradient and its momentum
    buffer; about 3× faster than the per-tensor loop on CPU) is used where this torch build
    offers it for the parameters' device and dtype; otherwise the default one.  Both compute
    the same update (up to rounding)."""
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in param_groups]
    try:
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, fused=True)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """SGD parameter groups: weight decay only on >= 2-D parameters not listed as excluded.

    Exclusions come from ``model.no_weight_decay_parameters()`` when the architecture has it,
    else from every submodule's ``no_weight_decay`` attribute (local parameter names).
    """
    getter = getattr(model, "no_weight_decay_parameters", None)
    if callable(getter):
        excluded = set(getter())
    else:
        excluded = set()
        for prefix, module in model.named_modules():
            for local in getattr(module, "no_weight_decay", ()):
                excluded.add(f"{prefix}.{local}" if prefix else local)
    decay, no_decay = [], []
    decay_names, no_decay_names = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.dim() >= 2 and name not in excluded:
            decay.append(param)
            decay_names.append(name)
        else:
            no_decay.append(param)
            no_decay_names.append(name)
    return [
        {"params": decay, "weight_decay": weight_decay, "names": decay_names},
        {"params": no_decay, "weight_decay": 0.0, "names": no_decay_names},
    ]


def _margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``f_l − f_j`` for every class ``j`` with ``+inf`` at ``j = l``: shape ``(N, c)``."""
    true = logits.gather(1, labels[:, None])
    margins = true - logits
    return margins.scatter(1, labels[:, None], float("inf"))


class FeatureAttack:
    """The ``attack_steps``-step l2 attack on the features used by CRC-Lip training (eq. 5).

    See the module docstring; returns ``δ`` with ``‖δ‖ ≤ radius`` and no autograd history.
    """

    def __init__(self, radius: float, steps: int = 5, step_multiplier: float = 1.5) -> None:
        self.radius = float(radius)
        self.steps = int(steps)
        self.step_size = step_multiplier * self.radius / self.steps

    def __call__(self, head: nn.Module, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        y = features.detach().float()
        if self.radius <= 0:
            return torch.zeros_like(y)
        delta = self.step_size * F.normalize(torch.randn_like(y), dim=1)
        for _ in range(self.steps):
            with torch.enable_grad():
                d = delta.detach().requires_grad_(True)
                logits = head(y + d).float()
                margin = _margins(logits, labels)
                target = margin.argmin(dim=1, keepdim=True)
                objective = margin.gather(1, target).sum()
                (grad,) = torch.autograd.grad(objective, d)
            delta = delta - self.step_size * F.normalize(grad, dim=1)
            norms = delta.norm(dim=1, keepdim=True)
            delta = delta * torch.clamp(self.radius / norms.clamp_min(1e-12), max=1.0)
        return delta.detach()


class CurvaturePenalty(nn.Module):
    """``mean_j max(m_lj, M_lj)`` per example for an MLP head ``fc2(softplus(fc1(y)))``.

    See the module docstring for the estimate.  Buffer ``u`` (the top right singular vector
    of ``W₁``) is training state, saved in checkpoints.
    """

    #: bound on softplus'' (SPEC §4)
    HESSIAN_BOUND = 0.25

    def __init__(self, in_features: int, *, power_steps: int = 2, other_classes: int = 0, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        u = torch.randn(in_features, generator=gen)
        self.register_buffer("u", u / u.norm())
        self.power_steps = int(power_steps)
        self.other_classes = int(other_classes)

    @staticmethod
    def head_weights(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        fc1, fc2 = getattr(head, "fc1", None), getattr(head, "fc2", None)
        w1, w2 = getattr(fc1, "weight", None), getattr(fc2, "weight", None)
        if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor):
            raise LipUsageError(
                f"the curvature regulariser needs an MLP head with fc1/fc2 linear layers; "
                f"{type(head).__name__} has none (use --curvature-weight 0)"
            )
        return w1, w2

    @torch.no_grad()
    def update_u(self, head: nn.Module, steps: int = 1) -> None:
        """``steps`` power steps of ``W₁ᵀW₁`` on ``u`` (the reference's sigma vector)."""
        w1, _ = self.head_weights(head)
        w1 = w1.detach().float()
        u = self.u
        for _ in range(steps):
            u = F.normalize(w1.t() @ (w1 @ u), dim=0)
        self.u.copy_(u)

    def pair_bounds(self, head: nn.Module, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """Differentiable estimates of ``max(m, M)`` for the class pairs ``(first[i], second[i])``."""
        w1, w2 = self.head_weights(head)
        w1, w2 = w1.float(), w2.float()
        d = w2[first] - w2[second]  # (P, H)
        dmag = torch.cat([d.clamp_min(0.0), (-d).clamp_min(0.0)], dim=0)  # d⁺ rows, then d⁻
        with torch.no_grad():
            v = self.u.to(w1.dtype).expand(dmag.shape[0], -1).clone()
            w1d, dd = w1.detach(), dmag.detach()
            for _ in range(self.power_steps):
                v = F.normalize(((v @ w1d.t()) * dd) @ w1d, dim=1)
        z = v @ w1.t()  # (2P, H), gradient to W1
        lam = self.HESSIAN_BOUND * (z * z * dmag).sum(dim=1)
        n = first.shape[0]
        return torch.maximum(lam[:n], lam[n:])

    def forward(self, head: nn.Module, labels: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example ``mean_j max(m_lj, M_lj)``: shape ``(N,)``."""
        _, w2 = self.head_weights(head)
        c = w2.shape[0]
        if self.other_classes == 0 or self.other_classes >= c - 1 or logits is None:
            labs, inverse = torch.unique(labels, return_inverse=True)
            everyone = torch.arange(c, device=labels.device)
            others = everyone[None, :].expand(labs.shape[0], c).masked_select(
                everyone[None, :] != labs[:, None]
            ).view(labs.shape[0], c - 1)
            first = labs[:, None].expand_as(others).reshape(-1)
            values = self.pair_bounds(head, first, others.reshape(-1)).view(labs.shape[0], c - 1)
            return values.mean(dim=1)[inverse]
        k = self.other_classes
        masked = logits.detach().float().scatter(1, labels[:, None], float("-inf"))
        others = masked.topk(k, dim=1).indices  # (N, k)
        keys = labels[:, None] * c + others
        uniq, inverse = torch.unique(keys.reshape(-1), return_inverse=True)
        values = self.pair_bounds(head, uniq // c, uniq % c)
        return values[inverse].view(-1, k).mean(dim=1)


class TrainStep(nn.Module):
    """One training forward: the loss of the model's head type (the module DDP wraps).

    ``forward(images, labels)`` returns ``(loss, clean_logits, parts)`` where ``parts`` holds
    detached loss components.
    """

    def __init__(
        self, model: nn.Module, *, attack: FeatureAttack | None = None,
        curvature: CurvaturePenalty | None = None, curvature_weight: float = 0.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.attack = attack
        self.curvature = curvature
        self.curvature_weight = float(curvature_weight)

    @property
    def crc(self) -> bool:
        return self.attack is not None or self.curvature is not None

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        if not self.crc:
            logits = self.model(images)
            loss = F.cross_entropy(logits.float(), labels)
            return loss, logits.detach(), {"ce": loss.detach()}
        head = self.model.head
        features = self.model.features(images)
        with torch.no_grad():
            clean = head(features).detach()
        with torch.autocast(features.device.type, enabled=False):
            feats = features.float()
            delta = self.attack(head, feats, labels) if self.attack is not None else torch.zeros_like(feats)
            adv_logits = head(feats + delta)
            ce = F.cross_entropy(adv_logits, labels)
            loss = ce
            parts = {"ce": ce.detach()}
            if self.curvature is not None and self.curvature_weight > 0:
                if self.training:
                    self.curvature.update_u(head, 1)
                curv = self.curvature(head, labels, clean).mean()
                loss = loss + self.curvature_weight * curv
                parts["curvature"] = curv.detach()
        return loss, clean, parts


# ---------------------------------------------------------------------------------------------
# checkpoints: tensors + JSON, no pickle
# ---------------------------------------------------------------------------------------------
def flatten_state(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Turn a nested state (dicts, lists, tuples, Counters, tensors, numbers) into JSON + tensors.

    Every tensor is stored under a key starting with ``prefix`` and replaced by
    ``{"__tensor__": key}``; dicts with non-string keys, tuples, Counters and non-finite floats
    get tagged forms, so :func:`unflatten_state` restores the exact structure.
    """
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, collections.Counter):
        return {"__counter__": [[flatten_state(k, f"{prefix}.k{i}", tensors),
                                 flatten_state(v, f"{prefix}.{i}", tensors)]
                                for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: flatten_state(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
        return {"__items__": [[flatten_state(k, f"{prefix}.k{i}", tensors),
                               flatten_state(v, f"{prefix}.{i}", tensors)]
                              for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} in a checkpoint")


def unflatten_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__float__"}:
            return float(obj["__float__"])
        if set(obj) == {"__tuple__"}:
            return tuple(unflatten_state(v, tensors) for v in obj["__tuple__"])
        if set(obj) == {"__counter__"}:
            return collections.Counter(
                {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in obj["__counter__"]}
            )
        if set(obj) == {"__items__"}:
            return {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in obj["__items__"]}
        return {k: unflatten_state(v, tensors) for k, v in obj.items()}
    return obj


def rng_state() -> dict[str, Any]:
    """Torch (CPU and CUDA), numpy and Python RNG states as tensors + JSON."""
    import numpy as np

    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}
    version, internal, gauss = random.getstate()
    state["python"] = {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64),
                       "gauss": gauss}
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"].to(torch.uint8))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([t.to(torch.uint8) for t in cuda])
    npst = state.get("numpy")
    if npst:
        np.random.set_state((npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                             npst["has_gauss"], npst["cached"]))
    py = state.get("python")
    if py:
        random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))


def write_checkpoint(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Atomically write a checkpoint: safetensors with ``lipcli.checkpoint`` JSON metadata."""
    from safetensors.torch import save

    from .modelfile import atomic_write_bytes

    blob = save(tensors, metadata={"lipcli.checkpoint": json.dumps(meta, sort_keys=True, allow_nan=False)})
    try:
        atomic_write_bytes(path, blob)
    except OSError as exc:
        raise LipError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from None


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint written by :func:`write_checkpoint` (clear errors, no code execution)."""
    from safetensors import safe_open

    if not path.is_file():
        raise LipUsageError(f"no checkpoint at {path} (is this a lip train run directory?)")
    try:
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            raw = (fh.metadata() or {}).get("lipcli.checkpoint")
            for key in fh.keys():
                tensors[key] = fh.get_tensor(key)
        meta = json.loads(raw) if raw else None
    except Exception as exc:  # noqa: BLE001
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LipError(f"{path} is not a readable checkpoint (truncated or corrupt?): {first}") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise LipError(f"{path} is not a lipcli training checkpoint")
    if int(meta.get("format_version", 0)) > CHECKPOINT_VERSION:
        raise LipError(f"{path} was written by a newer lipcli; upgrade to resume it")
    return tensors, meta


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    n = len(prefix)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix)}


# ---------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------
@dataclass
class RunPaths:
    run_dir: Path
    out: Path

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / CHECKPOINT_NAME

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_NAME

    @property
    def config(self) -> Path:
        return self.run_dir / CONFIG_NAME

    @property
    def best(self) -> Path:
        return self.run_dir / BEST_NAME


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_writable_dir(path: Path, what: str) -> None:
    """``path`` is, or can be created as, a writable directory (nothing is created here)."""
    if path.exists():
        if not path.is_dir():
            raise LipUsageError(f"{what} {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise LipUsageError(f"{what} {path} is not writable")
        return
    anchor = _nearest_existing(path)
    if not anchor.is_dir():
        raise LipUsageError(f"cannot create {what} {path}: {anchor} is not a directory")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise LipUsageError(f"cannot create {what} {path}: {anchor} is not writable")


def plan_paths(cfg: TrainConfig, *, run_dir: str | None, out: str | None) -> RunPaths:
    """Decide the run directory and model path; validate them without writing anything.

    * ``run_dir`` given: used as is; else derived from ``out`` (``<out dir>/<out stem>-run``);
      else ``runs/<arch>-<head>-<YYYYmmdd-HHMMSS>``.
    * ``out`` defaults to ``<run dir>/model.safetensors``.
    * A run directory holding an unfinished run's checkpoint is refused (resume it instead);
      a finished run's directory may be reused.
    """
    if out is not None:
        out_path = Path(out).expanduser()
        if out_path.exists() and out_path.is_dir():
            raise LipUsageError(f"--out {out_path} is a directory; give a file name (e.g. model.safetensors)")
    else:
        out_path = None
    if run_dir is not None:
        rd = Path(run_dir).expanduser()
    elif out_path is not None:
        rd = out_path.parent / f"{out_path.stem}-run"
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        arch = cfg.arch.split(":", 1)[0]
        head = cfg.head.split(":", 1)[0]
        rd = Path("runs") / f"{arch}-{head}-{stamp}"
    if out_path is None:
        out_path = rd / MODEL_NAME
    _check_writable_dir(rd, "run directory")
    _check_writable_dir(out_path.parent, "output directory")
    if out_path.exists() and not os.access(out_path, os.W_OK):
        raise LipUsageError(f"--out {out_path} is not writable")
    ckpt = rd / CHECKPOINT_NAME
    if ckpt.exists():
        try:
            _, meta = read_checkpoint(ckpt)
            finished = meta.get("status") == "complete"
        except LipError:
            finished = False
        if not finished:
            raise LipUsageError(
                f"{rd} holds an unfinished run; resume it with `lip train --resume {rd}` "
                "or choose another --run-dir"
            )
    return RunPaths(run_dir=rd, out=out_path)


# ---------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------
class Reporter:
    """Rank 0's stderr output: resolved config, progress bars (TTY only), one line per epoch."""

    def __init__(self, enabled: bool, console: Any = None) -> None:
        self.enabled = enabled
        self.console = console
        self.progress = None
        self.task = None
        if enabled and console is None:
            from rich.console import Console

            self.console = Console(stderr=True)

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def start(self) -> None:
        if not self.enabled or not self.console.is_terminal:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  acc {task.fields[acc]:.3f}  "
                       "{task.fields[ips]:.0f} img/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=1, epoch="", loss=0.0, acc=0.0, ips=0.0)

    def epoch(self, epoch: int, epochs: int, total: int) -> None:
        if self.progress is not None:
            self.progress.reset(self.task, total=total, epoch=f"{epoch}/{epochs}", loss=0.0, acc=0.0, ips=0.0)

    def update(self, completed: int, loss: float, acc: float, ips: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=completed, loss=loss, acc=acc, ips=ips)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, ctx: DistContext) -> dict[str, float]:
    """Clean loss and accuracy over every process's shard (summed across processes)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)
    for images, labels in loader:
        images = images.to(ctx.device, non_blocking=True)
        labels = labels.to(ctx.device, non_blocking=True)
        logits = model(images).float()
        sums[0] += F.cross_entropy(logits, labels, reduction="sum").double()
        sums[1] += (logits.argmax(dim=1) == labels).sum()
        sums[2] += labels.numel()
    ctx.all_reduce_sum(sums)
    model.train(was_training)
    n = max(float(sums[2]), 1.0)
    return {"loss": float(sums[0]) / n, "accuracy": float(sums[1]) / n, "examples": int(sums[2])}


def lipschitz_record(model: nn.Module, *, estimate: bool = True) -> dict[str, Any]:
    """The model file's ``lipschitz`` slot.

    Uses :func:`lipcli.lipschitz.lipschitz_report` (guaranteed upper bound + power estimate).
    """
    from .lipschitz import lipschitz_report

    report = lipschitz_report(model, estimate=estimate, iters=50)
    return json.loads(json.dumps(report, default=float))


# ---------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------
@dataclass
class _State:
    epoch: int = 0
    step: int = 0
    elapsed: float = 0.0
    images: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    resumed_from: list[int] = field(default_factory=list)


def _interrupt_point() -> tuple[int, int] | None:
    raw = os.environ.get(INTERRUPT_ENV, "").strip()
    if not raw:
        return None
    epoch, _, step = raw.partition(":")
    return int(epoch), int(step or 0)


def _component_names(cfg: TrainConfig) -> dict[str, str]:
    return {"arch": cfg.arch, "conv": cfg.conv, "activation": cfg.activation, "pool": cfg.pool,
            "head": cfg.head}


RESUME_CHANGEABLE = frozenset({"device", "workers", "data_dir"})


def train(
    config: TrainConfig | None = None,
    *,
    run_dir: str | None = None,
    out: str | None = None,
    resume: str | None = None,
    resume_overrides: dict[str, Any] | None = None,
    quiet: bool = False,
    registry: Any = None,
) -> dict[str, Any]:
    """Train (or resume) a model; returns the JSON summary.  See the module docstring.

    For a new run pass ``config``; for ``resume`` (a run directory) the stored config is used
    and only ``resume_overrides`` in :data:`RESUME_CHANGEABLE` (and ``out``) may change it.
    Every argument is validated before anything is written.
    """
    from .data import check_data_dir, eval_loader, load_data, resolve_dataset, train_loader
    from .models import build_model, make_config
    from .plugins import get_registry

    reg = registry or get_registry()
    ctx = DistContext.from_env()

    # ---- 1. configuration (no side effects) --------------------------------------------------
    ckpt_tensors: dict[str, torch.Tensor] | None = None
    ckpt_meta: dict[str, Any] | None = None
    if resume is not None:
        rd = Path(resume).expanduser()
        if not rd.is_dir():
            raise LipUsageError(f"--resume {rd}: not a directory")
        ckpt_tensors, ckpt_meta = read_checkpoint(rd / CHECKPOINT_NAME)
        cfg = TrainConfig().updated(ckpt_meta["config"], source=str(rd / CHECKPOINT_NAME))
        overrides = dict(resume_overrides or {})
        fixed = sorted(k for k in overrides if k not in RESUME_CHANGEABLE)
        if fixed:
            raise LipUsageError(
                "--resume continues a run with its stored settings; cannot change "
                + ", ".join("--" + k.replace("_", "-") for k in fixed)
            )
        cfg = cfg.updated(overrides, source="--resume")
        out = out or ckpt_meta.get("out")
        if not os.access(rd, os.W_OK | os.X_OK):
            raise LipUsageError(f"run directory {rd} is not writable")
        paths = RunPaths(run_dir=rd, out=Path(out) if out else rd / MODEL_NAME)
        _check_writable_dir(paths.out.parent, "output directory")
    else:
        cfg = config or TrainConfig()
        paths = None  # decided after validation, below
    cfg.validate()
    comps = {}
    for kind, choice in _component_names(cfg).items():
        comps[kind] = reg.component(kind, choice, {"width": cfg.width} if kind == "arch" and cfg.width else None)
    data_comp = resolve_dataset(cfg.dataset, reg)
    crc = getattr(comps["head"].spec, "certificate", None) == CRC_CERTIFICATE
    cfg = cfg.resolved(dataset_name=data_comp.name, crc=crc)
    root = check_data_dir(data_comp, cfg.data_dir, cfg.download)
    device = ctx.resolve_device(cfg.device)
    if cfg.batch_size % ctx.world_size:
        raise LipUsageError(
            f"--batch-size {cfg.batch_size} is the global batch; it must be divisible by the "
            f"{ctx.world_size} processes"
        )
    if paths is None:
        paths = plan_paths(cfg, run_dir=run_dir, out=out)
    workers = cfg.workers if cfg.workers is not None else (
        0 if device.type == "cpu" else min(4, max(1, (os.cpu_count() or 2) // ctx.local_world_size - 1))
    )
    reporter = Reporter(enabled=ctx.is_main and not quiet)

    # ---- 2. data and model (still nothing written, except a requested download) -------------
    ctx.init(device)
    try:
        if ctx.distributed:  # one run directory for everyone (rank 0's timestamp)
            paths = RunPaths(*(Path(p) for p in ctx.broadcast_json([str(paths.run_dir), str(paths.out)])))
        if cfg.download and not ctx.is_main:
            ctx.barrier()  # rank 0 downloads first
        data = load_data(
            data_comp, root, download=cfg.download and ctx.is_main, augment=cfg.augment,
            val_split=cfg.val_split, limit_train=cfg.limit_train, limit_test=cfg.limit_test,
            seed=cfg.seed,
        )
        if cfg.download and ctx.is_main:
            ctx.barrier()
        if data.image_shape[1:] != (32, 32):
            raise LipUsageError(f"dataset {data_comp.name!r} yields {data.image_shape} images; need 32x32")
        model_config = make_config(
            comps["arch"].to_config(), conv=comps["conv"].to_config(),
            activation=comps["activation"].to_config(), pool=comps["pool"].to_config(),
            head=comps["head"].to_config(), num_classes=data.num_classes,
            in_channels=data.image_shape[0], image_size=data.image_shape[1:], mean=data.mean,
            std=data.std, registry=reg,
        )
        torch.manual_seed(cfg.seed)
        model = build_model(model_config, reg).to(device)
        return _run(cfg, ctx, device, paths, reporter, data, model, model_config, crc, workers,
                    ckpt_tensors, ckpt_meta, train_loader, eval_loader)
    finally:
        reporter.stop()
        ctx.destroy()


def _run(cfg, ctx, device, paths, reporter, data, model, model_config, crc, workers,
         ckpt_tensors, ckpt_meta, train_loader, eval_loader) -> dict[str, Any]:
    from .models import save_model

    pin = device.type == "cuda"
    per_rank_batch = cfg.batch_size // ctx.world_size
    loader, sampler = train_loader(
        data.train, batch_size=per_rank_batch, seed=cfg.seed, rank=ctx.rank,
        world_size=ctx.world_size, workers=workers, pin_memory=pin,
    )
    val_loader = None if data.val is None else eval_loader(
        data.val, batch_size=cfg.eval_batch_size, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin)
    test_loader = eval_loader(
        data.test, batch_size=cfg.eval_batch_size, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin)
    steps_per_epoch = len(loader)
    total_steps = cfg.epochs * steps_per_epoch

    groups = weight_decay_groups(model, cfg.weight_decay)
    optimizer = recipe_sgd(groups, lr=cfg.lr, momentum=cfg.momentum)
    # as the reference: milestones [total // 2, 3 * total // 4] (a list: equal ones compound)
    milestones = [int(f * total_steps) for f in cfg.lr_milestones]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=cfg.lr_gamma)
    amp_dtype = torch.bfloat16
    if cfg.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        amp_dtype = torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp and amp_dtype == torch.float16)

    attack = curvature = None
    if crc:
        min_std = min(data.std)
        attack = FeatureAttack(cfg.attack_radius / min_std, steps=cfg.attack_steps) if cfg.attack_radius else None
        if cfg.curvature_weight:
            feat_dim = CurvaturePenalty.head_weights(model.head)[0].shape[1]
            curvature = CurvaturePenalty(
                feat_dim, power_steps=cfg.curvature_power_steps, other_classes=cfg.curvature_classes,
                seed=cfg.seed,
            ).to(device)
            curvature.update_u(model.head, cfg.power_iter_steps)
    step_module = TrainStep(model, attack=attack, curvature=curvature,
                            curvature_weight=cfg.curvature_weight or 0.0)

    state = _State()
    if ckpt_tensors is not None:
        state = _restore(ckpt_tensors, ckpt_meta, model, optimizer, scheduler, scaler, curvature,
                         steps_per_epoch, data, model_config)
        state.resumed_from.append(state.epoch)

    def checkpoint(status: str = "running") -> None:
        if not ctx.is_main:
            return
        tensors: dict[str, torch.Tensor] = {}
        for k, v in model.state_dict().items():
            tensors[f"model.{k}"] = v.detach().cpu().clone().contiguous()
        meta = {
            "format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
            "lipcli_version": __version__, "status": status,
            "epoch": state.epoch, "step": state.step, "steps_per_epoch": steps_per_epoch,
            "elapsed_s": state.elapsed, "images": state.images,
            "config": cfg.to_json(), "model_config": model_config, "dataset": data.info(),
            "out": str(paths.out.absolute()), "world_size": ctx.world_size, "device": str(device),
            "history": state.history, "best": state.best, "resumed_from": state.resumed_from,
            "optimizer": flatten_state(optimizer.state_dict(), "optim", tensors),
            "scheduler": flatten_state(scheduler.state_dict(), "sched", tensors),
            "scaler": flatten_state(scaler.state_dict(), "scaler", tensors),
            "rng": flatten_state(rng_state(), "rng", tensors),
            "curvature": None if curvature is None else flatten_state(
                {k: v for k, v in curvature.state_dict().items()}, "curv", tensors),
        }
        write_checkpoint(paths.checkpoint, tensors, meta)

    # ---- 3. the run directory (first writes) --------------------------------------------------
    if ctx.is_main:
        try:
            paths.run_dir.mkdir(parents=True, exist_ok=True)
            paths.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LipError(f"cannot create {paths.run_dir}: {exc.strerror or exc}") from None
        if ckpt_tensors is None:
            for stale in (paths.log, paths.best):
                if stale.exists():
                    stale.unlink()
            from .modelfile import atomic_write_bytes

            atomic_write_bytes(paths.config, (json.dumps(cfg.to_json(), indent=2) + "\n").encode())
            checkpoint()
    ctx.barrier()

    reporter.print(f"lip train: run directory {paths.run_dir} (model -> {paths.out})")
    if ckpt_tensors is not None:
        reporter.print(f"resuming after epoch {state.epoch} of {cfg.epochs}")
    reporter.print("resolved configuration: " + json.dumps(cfg.to_json(), sort_keys=False))
    reporter.print(
        f"data: {data.component.name} ({data.num_classes} classes; "
        + ", ".join(f"{k} {v}" for k, v in data.sizes.items())
        + f"); device {device}" + (f" x {ctx.world_size} processes ({ctx.backend})" if ctx.distributed else "")
        + f"; {sum(p.numel() for p in model.parameters()):,} parameters"
    )

    ddp_module: nn.Module = step_module
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        import inspect

        # rank 0's buffers (SOC power-iteration vectors) are copied to all ranks at every forward
        sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                else "broadcast_buffers")
        ddp_module = DDP(step_module, device_ids=[device.index] if device.type == "cuda" else None,
                         **{sync: True})
    params = [p for p in model.parameters() if p.requires_grad]
    interrupt_at = _interrupt_point()
    check_every = 1 if device.type == "cpu" else 25
    mid_step = steps_per_epoch // 2

    def refresh() -> None:
        refresher = getattr(model, "refresh_power_iteration", None)
        if callable(refresher):
            refresher(cfg.power_iter_steps)
        ctx.sync_module_state(model)

    reporter.start()
    current_epoch = state.epoch
    try:
        for epoch in range(state.epoch, cfg.epochs):
            current_epoch = epoch
            seed = _epoch_seed(cfg.seed, epoch, ctx.rank)
            torch.manual_seed(seed)
            loader.generator.manual_seed(seed)
            sampler.set_epoch(epoch)
            model.train()
            step_module.train()
            reporter.epoch(epoch + 1, cfg.epochs, steps_per_epoch)
            sums = torch.zeros(3, dtype=torch.float64, device=device)
            extra = torch.zeros(1, dtype=torch.float64, device=device)
            checked = torch.zeros(1, dtype=torch.float64, device=device)
            t0 = time.perf_counter()
            seen = 0
            for i, (images, labels) in enumerate(loader):
                if interrupt_at is not None and interrupt_at == (epoch, i):
                    raise KeyboardInterrupt
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=amp_dtype, enabled=cfg.amp):
                    loss, logits, parts = ddp_module(images, labels)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.grad_clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                state.step += 1
                n = labels.shape[0]
                seen += n
                sums[0] += loss.detach().double() * n
                sums[1] += (logits.argmax(dim=1) == labels).sum()
                sums[2] += n
                if "curvature" in parts:
                    extra[0] += parts["curvature"].double() * n
                if i == mid_step and steps_per_epoch > 1:
                    refresh()
                if (i + 1) % check_every == 0 or i + 1 == steps_per_epoch:
                    checked.copy_(sums[:1])
                    ctx.all_reduce_sum(checked)
                    if not math.isfinite(float(checked)):
                        raise TrainingDiverged(
                            f"loss became NaN/inf at epoch {epoch + 1}, step {i + 1} (lr "
                            f"{scheduler.get_last_lr()[0]:.3g}); kept the last good checkpoint "
                            f"{paths.checkpoint} (epoch {state.epoch}); try a lower --lr or "
                            "--grad-clip 1"
                        )
                    if reporter.progress is not None:
                        dt = max(time.perf_counter() - t0, 1e-9)
                        reporter.update(i + 1, float(sums[0] / sums[2]), float(sums[1] / sums[2]),
                                        seen * ctx.world_size / dt)
            refresh()  # end of epoch: before evaluation and before the checkpoint
            if curvature is not None:
                curvature.update_u(model.head, cfg.power_iter_steps)
                ctx.sync_module_state(curvature)
            train_time = time.perf_counter() - t0
            ctx.all_reduce_sum(sums)
            ctx.all_reduce_sum(extra)
            record: dict[str, Any] = {
                "epoch": epoch + 1,
                "train_loss": float(sums[0] / sums[2]),
                "train_accuracy": float(sums[1] / sums[2]),
                "lr": float(optimizer.param_groups[0]["lr"]),
                "time_s": round(train_time, 3),
                "images_per_s": round(float(sums[2]) / max(train_time, 1e-9), 1),
            }
            if curvature is not None:
                record["train_curvature"] = float(extra[0] / sums[2])
            if val_loader is not None:
                val = evaluate(model, val_loader, ctx)
                record["val_loss"], record["val_accuracy"] = val["loss"], val["accuracy"]
                if cfg.keep_best and (state.best is None or val["accuracy"] > state.best["val_accuracy"]):
                    state.best = {"epoch": epoch + 1, "val_accuracy": val["accuracy"]}
                    if ctx.is_main:
                        save_model(model, paths.best, dataset=data.info(),
                                   training={"epoch": epoch + 1, "val_accuracy": val["accuracy"]})
            state.epoch = epoch + 1
            state.elapsed += train_time
            state.images += int(sums[2])
            state.history.append(record)
            if ctx.is_main:
                with open(paths.log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
            checkpoint()
            ctx.barrier()
            reporter.print(
                f"epoch {epoch + 1}/{cfg.epochs}  loss {record['train_loss']:.4f}  "
                f"acc {record['train_accuracy']:.4f}"
                + (f"  val {record['val_accuracy']:.4f}" if "val_accuracy" in record else "")
                + f"  lr {record['lr']:.3g}  {record['images_per_s']:.0f} img/s  {train_time:.1f}s"
            )
    except KeyboardInterrupt:
        reporter.stop()
        raise TrainingInterrupted(
            f"interrupted during epoch {current_epoch + 1}; the checkpoint after epoch "
            f"{state.epoch} is in {paths.run_dir}; resume with: lip train --resume {paths.run_dir}"
        ) from None
    finally:
        reporter.stop()

    # ---- 4. final evaluation and the model file ---------------------------------------------
    ctx.check_consistent(model)
    if cfg.keep_best and state.best is not None:
        from .modelfile import read_model_file

        model.load_state_dict(read_model_file(paths.best).tensors)
    model.eval()
    test = evaluate(model, test_loader, ctx)
    results: dict[str, Any] = {
        "test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_examples": test["examples"],
        "selected_epoch": state.best["epoch"] if (cfg.keep_best and state.best) else state.epoch,
        "selection": "best validation accuracy" if (cfg.keep_best and state.best) else "last epoch",
    }
    last = state.history[-1] if state.history else {}
    for key in ("train_accuracy", "train_loss", "val_accuracy"):
        if key in last:
            results[f"{key}_last_epoch"] = last[key]
    summary: dict[str, Any] = {}
    if ctx.is_main:
        lipschitz = lipschitz_record(model, estimate=cfg.lipschitz_estimate)
        training = {
            "time_s": round(state.elapsed, 3),
            "epochs": state.epoch,
            "steps": state.step,
            "images_per_s": round(state.images / max(state.elapsed, 1e-9), 1),
            "config": cfg.to_json(),
            "seed": cfg.seed,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "world_size": ctx.world_size,
            "backend": ctx.backend,
            "workers": workers,
            "amp_dtype": str(amp_dtype).replace("torch.", "") if cfg.amp else None,
            "lipcli_version": __version__,
            "torch_version": torch.__version__,
            "weight_decay_parameters": groups[0]["names"],
            "run_dir": str(paths.run_dir),
            "resumed_from_epochs": state.resumed_from,
            "history": state.history,
        }
        save_model(model, paths.out, dataset=data.info(), lipschitz=lipschitz, results=results,
                   training=training)
        checkpoint(status="complete")
        summary = {
            "model": str(paths.out),
            "run_dir": str(paths.run_dir),
            "dataset": data.component.name,
            "epochs": state.epoch,
            "test_accuracy": test["accuracy"],
            "val_accuracy": last.get("val_accuracy"),
            "lipschitz_upper_bound": lipschitz.get("upper_bound"),
            "lipschitz_estimate": lipschitz.get("estimate"),
            "time_s": training["time_s"],
            "images_per_s": training["images_per_s"],
            "device": str(device),
            "world_size": ctx.world_size,
        }
        reporter.print(
            f"test accuracy {test['accuracy']:.4f} ({test['examples']} images); Lipschitz bound "
            f"{lipschitz.get('upper_bound')}; model written to {paths.out}"
        )
    ctx.barrier()
    return summary


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    from .data import epoch_seed

    return epoch_seed(seed, epoch, rank)


def _restore(tensors, meta, model, optimizer, scheduler, scaler, curvature, steps_per_epoch,
             data, model_config) -> _State:
    """Load a checkpoint into the freshly built objects; check that it fits this run."""
    if meta.get("steps_per_epoch") != steps_per_epoch:
        raise LipUsageError(
            f"the checkpoint was made with {meta.get('steps_per_epoch')} steps per epoch but the "
            f"data now gives {steps_per_epoch}: the data set or the number of processes changed"
        )
    if meta.get("model_config", {}).get("num_classes") != model_config["num_classes"]:
        raise LipUsageError("the checkpoint's number of classes does not match the data")
    model_state = _prefixed(tensors, "model.")
    try:
        model.load_state_dict(model_state, strict=True)
    except RuntimeError as exc:
        raise LipError(f"checkpoint does not fit the model: {str(exc).splitlines()[0]}") from None
    optimizer.load_state_dict(unflatten_state(meta["optimizer"], tensors))
    scheduler.load_state_dict(unflatten_state(meta["scheduler"], tensors))
    scaler.load_state_dict(unflatten_state(meta["scaler"], tensors))
    if curvature is not None and meta.get("curvature"):
        curvature.load_state_dict(unflatten_state(meta["curvature"], tensors))
    set_rng_state(unflatten_state(meta["rng"], tensors))
    return _State(
        epoch=int(meta["epoch"]), step=int(meta["step"]), elapsed=float(meta.get("elapsed_s", 0.0)),
        images=int(meta.get("images", 0)), history=list(meta.get("history") or []),
        best=meta.get("best"), resumed_from=list(meta.get("resumed_from") or []),
    )
