"""The driver: :func:`train` (configure, build, run, checkpoint, resume, write the model file)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lipcli import __version__
from lipcli.host.cuda_graphs import GraphedStep, graph_unsupported_reason
from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.train.checkpoint import (_prefixed, flatten_state, read_checkpoint, rng_state, set_rng_state,
                         unflatten_state, write_checkpoint)
from lipcli.train.config import (CHECKPOINT_FORMAT, CHECKPOINT_NAME, CHECKPOINT_VERSION, INTERRUPT_ENV,
                     MODEL_NAME, TrainConfig)
from lipcli.train.distributed import DistContext
from lipcli.train.errors import TrainingDiverged, TrainingInterrupted
from lipcli.train.evaluation import evaluate, lipschitz_record
from lipcli.train.objective import TrainStep, build_loss, loss_record, resolve_loss
from lipcli.train.optim import build_optimization, optimization_record
from lipcli.train.paths import RunPaths, _check_writable_dir, check_replaceable, plan_paths
from lipcli.host.locks import check_run_unlocked, run_locks
from lipcli.train.reporting import Reporter


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
    if not raw or raw == "end":
        return None
    epoch, _, step = raw.partition(":")
    return int(epoch), int(step or 0)


def _component_names(cfg: TrainConfig) -> dict[str, str]:
    return {"arch": cfg.arch, "conv": cfg.conv, "activation": cfg.activation, "pool": cfg.pool,
            "head": cfg.head}


RESUME_CHANGEABLE = frozenset({"device", "workers", "data_dir", "cuda_graphs"})
COMPONENT_SETTINGS = ("arch", "conv", "activation", "pool", "head", "dataset", "loss")


def _same_setting(key: str, stored: TrainConfig, given: Any, reg: Any) -> bool:
    """Whether ``given`` (a resume override) equals the stored value of setting ``key``."""
    try:
        value = getattr(stored.updated({key: given}, source="--resume"), key)
    except LipError:
        return False
    old = getattr(stored, key)
    if value == old:
        return True
    if key in COMPONENT_SETTINGS and isinstance(value, str) and isinstance(old, str):
        try:  # "mlp:hidden=32" and "mlp: hidden = 32" are the same choice
            a, b = reg.component(key, value), reg.component(key, old)
        except LipError:
            return False
        return a.name == b.name and a.params == b.params
    return False


def _arch_component(cfg: TrainConfig, reg: Any) -> Any:
    """The architecture with ``--width`` applied; the same width given twice (``--arch
    NAME:width=W`` and ``--width W``) is fine, two different widths are a usage error."""
    from lipcli.host.plugins import parse_component_choice

    inline = parse_component_choice(cfg.arch)[1]
    if cfg.width is None:
        return reg.component("arch", cfg.arch)
    if "width" in inline:
        own = reg.component("arch", cfg.arch).params.get("width")
        if own != cfg.width:
            raise LipUsageError(
                f"conflicting widths: --arch {cfg.arch} sets width {own} but --width is "
                f"{cfg.width}; give the width once"
            )
    return reg.component("arch", cfg.arch, {"width": cfg.width})


def _component_error_message(exc: Any, cfg: TrainConfig) -> str:
    """The CLI wording of a :class:`~lipcli.host.models.ComponentParameterError`: the option that
    set the rejected value when that is ``--width``, else the component and its values."""
    width_only = cfg.width is not None and (
        (exc.kind == "arch" and set(exc.params) == {"width"})
        or (not exc.params and exc.context is not None and set(exc.context[2]) == {"width"})
    )
    if width_only:
        return f"--width {cfg.width}: {exc.reason}"
    return str(exc)


def train(
    config: TrainConfig | None = None,
    *,
    run_dir: str | None = None,
    out: str | None = None,
    resume: str | None = None,
    resume_overrides: dict[str, Any] | None = None,
    quiet: bool = False,
    registry: Any = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train (or resume) a model; returns the JSON summary.  See the :mod:`lipcli.train` docstring.

    For a new run pass ``config``; for ``resume`` (a run directory) the stored config is used
    and only ``resume_overrides`` in :data:`RESUME_CHANGEABLE` (and ``out``) may change it
    (an override equal to the stored value is accepted).  An existing model file or finished
    run directory is replaced only with ``overwrite`` (see :func:`plan_paths`).
    Every argument is validated before anything is written.
    """
    from lipcli.host.data import check_data_dir, load_data, resolve_dataset
    from lipcli.host.models import ComponentParameterError, build_model, make_config
    from lipcli.host.plugins import get_registry

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
        fixed = sorted(
            k for k in overrides if k not in RESUME_CHANGEABLE and not _same_setting(k, cfg, overrides[k], reg)
        )
        if fixed:
            raise LipUsageError(
                "--resume continues a run with its stored settings; cannot change "
                + ", ".join(f"--{k.replace('_', '-')} (stored: {getattr(cfg, k)!r})" for k in fixed)
            )
        cfg = cfg.updated({k: v for k, v in overrides.items() if k in RESUME_CHANGEABLE}, source="--resume")
        stored_out = ckpt_meta.get("out")
        if stored_out is not None and (not isinstance(stored_out, str) or not stored_out.strip()):
            raise LipError(f"{rd / CHECKPOINT_NAME} records an invalid output path; pass --out FILE")
        out = out or stored_out
        if not os.access(rd, os.W_OK | os.X_OK):
            raise LipUsageError(f"run directory {rd} is not writable")
        paths = RunPaths(run_dir=rd, out=Path(out).expanduser() if out else rd / MODEL_NAME)
        if paths.out.is_dir():
            raise LipUsageError(f"--out {paths.out} is a directory; give a file name (e.g. model.safetensors)")
        # the same rule as a new run: an existing file is replaced only with --overwrite,
        # and only if it is a lipcli model file (the checkpoint's path is not trusted)
        check_replaceable(paths.out, overwrite, f"or write elsewhere: lip train --resume {rd} --out OTHER")
        _check_writable_dir(paths.out.parent, "output directory")
        check_run_unlocked(rd, paths.out)
    else:
        cfg = config or TrainConfig()
        paths = None  # decided after validation, below
    cfg.validate()
    comps = {}
    for kind, choice in _component_names(cfg).items():
        comps[kind] = _arch_component(cfg, reg) if kind == "arch" else reg.component(kind, choice)
    data_comp = resolve_dataset(cfg.dataset, reg)
    cfg, loss_comp = resolve_loss(cfg.resolved(), comps["head"], data_comp.name, reg)
    root = check_data_dir(data_comp, cfg.data_dir, cfg.download)
    device = ctx.resolve_device(cfg.device)
    if cfg.batch_size % ctx.world_size:
        raise LipUsageError(
            f"--batch-size {cfg.batch_size} is the global batch; it must be divisible by the "
            f"{ctx.world_size} processes"
        )
    if paths is None:
        paths = plan_paths(cfg, run_dir=run_dir, out=out, overwrite=overwrite)
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
        extra = _open_extra_data(cfg, data)
        model_config = make_config(
            comps["arch"].to_config(), conv=comps["conv"].to_config(),
            activation=comps["activation"].to_config(), pool=comps["pool"].to_config(),
            head=comps["head"].to_config(), num_classes=data.num_classes,
            in_channels=data.image_shape[0], image_size=data.image_shape[1:], mean=data.mean,
            std=data.std, registry=reg,
        )
        torch.manual_seed(cfg.seed)
        try:
            model = build_model(model_config, reg)
        except ComponentParameterError as exc:
            raise LipUsageError(_component_error_message(exc, cfg)) from exc
        model = model.to(device)
        run = _TrainingRun.build(cfg, ctx, device, paths, reporter, data, model, model_config,
                                 loss=loss_comp, workers=workers, extra=extra)
        run.overwrite = overwrite
        return run.execute(ckpt_tensors, ckpt_meta)
    finally:
        reporter.stop()
        ctx.destroy()


def _open_extra_data(cfg: TrainConfig, data: Any) -> Any:
    """The ``--extra-data`` arrays, memory-mapped and checked against the data (or None)."""
    if cfg.extra_data is None:
        return None
    from lipcli.host.extradata import check_compatible, open_extra_data

    extra = open_extra_data(cfg.extra_data)
    check_compatible(extra, image_shape=data.image_shape, num_classes=data.num_classes)
    return extra


def _make_loaders(cfg: TrainConfig, ctx: DistContext, device: torch.device, data: Any,
                  workers: int, extra: Any = None) -> tuple[Any, Any, Any, Any]:
    """This rank's training loader and sampler (with ``extra`` images mixed in where given),
    validation loader (or None) and test loader."""
    from lipcli.host.data import eval_loader, train_loader
    from lipcli.train.mixing import extra_loader_or_none

    pin = device.type == "cuda"
    per_rank_batch = cfg.batch_size // ctx.world_size
    loader, sampler = extra_loader_or_none(
        cfg, extra, data, batch_size=per_rank_batch, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin,
    ) or train_loader(
        data.train, batch_size=per_rank_batch, seed=cfg.seed, rank=ctx.rank,
        world_size=ctx.world_size, workers=workers, pin_memory=pin,
    )
    val_loader = None if data.val is None else eval_loader(
        data.val, batch_size=cfg.eval_batch_size, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin)
    test_loader = eval_loader(
        data.test, batch_size=cfg.eval_batch_size, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin)
    return loader, sampler, val_loader, test_loader


def _make_scaler(cfg: TrainConfig, device: torch.device) -> tuple[torch.dtype, torch.amp.GradScaler]:
    """The autocast dtype (bfloat16, float16 where CUDA lacks bf16) and the gradient scaler
    (enabled only for float16)."""
    amp_dtype = torch.bfloat16
    if cfg.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        amp_dtype = torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp and amp_dtype == torch.float16)
    return amp_dtype, scaler


def _make_loss(cfg: TrainConfig, device: torch.device, data: Any, model: nn.Module,
               component: Any) -> nn.Module:
    """The run's training loss, built by its component's factory (see :mod:`lipcli.sdk.losses`)."""
    from lipcli.sdk.losses import LossContext

    context = LossContext(model=model, num_classes=data.num_classes, dataset=data.component.name,
                          mean=tuple(data.mean), std=tuple(data.std), seed=cfg.seed, device=device,
                          refresh_steps=cfg.power_iter_steps)
    return build_loss(component, context)


@dataclass
class _TrainingRun:
    """One training run: its settings, data, model, training objects and progress."""

    cfg: TrainConfig
    ctx: DistContext
    device: torch.device
    paths: RunPaths
    reporter: Reporter
    data: Any
    model: nn.Module
    model_config: dict[str, Any]
    workers: int
    loader: Any
    sampler: Any
    val_loader: Any
    test_loader: Any
    steps_per_epoch: int
    groups: list[dict[str, Any]]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    amp_dtype: torch.dtype
    scaler: torch.amp.GradScaler
    loss_component: Any
    step_module: TrainStep
    extra: Any = None
    state: _State = field(default_factory=_State)
    resumed: bool = False
    graphed: GraphedStep | None = None
    graph_reason: str | None = None
    graph_reported: bool = False
    overwrite: bool = False  # the final write may replace an existing model file

    @classmethod
    def build(cls, cfg: TrainConfig, ctx: DistContext, device: torch.device, paths: RunPaths,
              reporter: Reporter, data: Any, model: nn.Module, model_config: dict[str, Any], *,
              loss: Any, workers: int, extra: Any = None) -> _TrainingRun:
        """Build the loaders, optimiser, scheduler, AMP scaler and the training loss for ``model``."""
        loader, sampler, val_loader, test_loader = _make_loaders(cfg, ctx, device, data, workers, extra)
        steps_per_epoch = len(loader)
        groups, optimizer, scheduler = build_optimization(cfg, model, steps_per_epoch=steps_per_epoch)
        amp_dtype, scaler = _make_scaler(cfg, device)
        step_module = TrainStep(model, _make_loss(cfg, device, data, model, loss))
        return cls(cfg=cfg, ctx=ctx, device=device, paths=paths, reporter=reporter, data=data,
                   model=model, model_config=model_config, workers=workers, loader=loader,
                   sampler=sampler, val_loader=val_loader, test_loader=test_loader,
                   steps_per_epoch=steps_per_epoch, groups=groups, optimizer=optimizer,
                   scheduler=scheduler, amp_dtype=amp_dtype, scaler=scaler, loss_component=loss,
                   step_module=step_module, extra=extra)

    def execute(self, ckpt_tensors: dict[str, torch.Tensor] | None,
                ckpt_meta: dict[str, Any] | None) -> dict[str, Any]:
        """Resume from the checkpoint if given, train the remaining epochs, write the model
        file; returns the summary (empty on ranks other than 0)."""
        if ckpt_tensors is not None:
            self.restore_checkpoint(ckpt_tensors, ckpt_meta)
        self.make_dirs()
        # one writer per run directory and model file for the whole run (lipcli.host.locks)
        with run_locks(self.paths.run_dir, self.paths.out, enabled=self.ctx.is_main):
            self.create_run_dir()
            self.announce()
            self.train_epochs()
            try:
                return self.finish()
            except KeyboardInterrupt:
                raise self._interrupted(self.state.epoch, "after the last epoch") from None

    # ---- checkpoints ------------------------------------------------------------------------
    def restore_checkpoint(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Load a checkpoint into the freshly built objects; check that it fits this run."""
        if meta.get("steps_per_epoch") != self.steps_per_epoch:
            raise LipUsageError(
                f"the checkpoint was made with {meta.get('steps_per_epoch')} steps per epoch but the "
                f"data now gives {self.steps_per_epoch}: the data set or the number of processes changed"
            )
        if meta.get("model_config", {}).get("num_classes") != self.model_config["num_classes"]:
            raise LipUsageError("the checkpoint's number of classes does not match the data")
        stored_extra = (meta.get("extra_data") or {}).get("sha256")
        if self.extra is not None and stored_extra and stored_extra != self.extra.sha256:
            raise LipUsageError(f"extra data {self.extra.path} changed since the run started "
                                f"(SHA-256 {self.extra.sha256[:12]}..., was {stored_extra[:12]}...)")
        model_state = _prefixed(tensors, "model.")
        try:
            self.model.load_state_dict(model_state, strict=True)
        except RuntimeError as exc:
            raise LipError(f"checkpoint does not fit the model: {str(exc).splitlines()[0]}") from None
        self.optimizer.load_state_dict(unflatten_state(meta["optimizer"], tensors))
        self.scheduler.load_state_dict(unflatten_state(meta["scheduler"], tensors))
        self.scaler.load_state_dict(unflatten_state(meta["scaler"], tensors))
        loss_state = meta.get("loss", meta.get("curvature"))  # "curvature": before loss plugins
        if loss_state:
            self.step_module.loss.load_state_dict(unflatten_state(loss_state, tensors))
        set_rng_state(unflatten_state(meta["rng"], tensors))
        self.state = _State(
            epoch=int(meta["epoch"]), step=int(meta["step"]), elapsed=float(meta.get("elapsed_s", 0.0)),
            images=int(meta.get("images", 0)), history=list(meta.get("history") or []),
            best=meta.get("best"), resumed_from=list(meta.get("resumed_from") or []),
        )
        self.state.resumed_from.append(self.state.epoch)
        self.resumed = True

    def save_checkpoint(self, status: str = "running") -> None:
        """Rank 0 writes the checkpoint: model, optimiser, scheduler, scaler, RNG, loss state, progress."""
        if not self.ctx.is_main:
            return
        state = self.state
        loss_state = dict(self.step_module.loss.state_dict())
        tensors: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            tensors[f"model.{k}"] = v.detach().cpu().clone().contiguous()
        meta = {
            "format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
            "lipcli_version": __version__, "status": status,
            "epoch": state.epoch, "step": state.step, "steps_per_epoch": self.steps_per_epoch,
            "elapsed_s": state.elapsed, "images": state.images,
            "config": self.cfg.to_json(), "model_config": self.model_config, "dataset": self.data.info(),
            "out": str(self.paths.out.absolute()), "world_size": self.ctx.world_size,
            "device": str(self.device),
            "history": state.history, "best": state.best, "resumed_from": state.resumed_from,
            "extra_data": self._extra_record(),
            "optimizer": flatten_state(self.optimizer.state_dict(), "optim", tensors),
            "scheduler": flatten_state(self.scheduler.state_dict(), "sched", tensors),
            "scaler": flatten_state(self.scaler.state_dict(), "scaler", tensors),
            "rng": flatten_state(rng_state(), "rng", tensors),
            "loss": flatten_state(loss_state, "loss", tensors) if loss_state else None,
        }
        write_checkpoint(self.paths.checkpoint, tensors, meta)

    # ---- before training --------------------------------------------------------------------
    def make_dirs(self) -> None:
        """Rank 0 creates the run and output directories."""
        paths = self.paths
        if self.ctx.is_main:
            try:
                paths.run_dir.mkdir(parents=True, exist_ok=True)
                paths.out.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LipError(f"cannot create {paths.run_dir}: {exc.strerror or exc}") from None

    def create_run_dir(self) -> None:
        """Rank 0 (holding the run's locks): a new run drops a stale log and best model and
        writes config.json and the epoch-0 checkpoint.  All ranks then wait."""
        paths = self.paths
        if self.ctx.is_main:
            if not self.resumed:
                for stale in (paths.log, paths.best):
                    if stale.exists():
                        stale.unlink()
                from lipcli.host.modelfile import atomic_write_bytes

                atomic_write_bytes(paths.config, (json.dumps(self.cfg.to_json(), indent=2) + "\n").encode())
                self.save_checkpoint()
        self.ctx.barrier()

    def announce(self) -> None:
        """Print the run directory, the resume point, the resolved configuration and the data."""
        cfg, ctx, data, reporter = self.cfg, self.ctx, self.data, self.reporter
        reporter.print(f"lip train: run directory {self.paths.run_dir} (model -> {self.paths.out})")
        if self.resumed:
            reporter.print(f"resuming after epoch {self.state.epoch} of {cfg.epochs}")
        reporter.print("resolved configuration: " + json.dumps(cfg.to_json(), sort_keys=False))
        reporter.print(
            f"data: {data.component.name} ({data.num_classes} classes; "
            + ", ".join(f"{k} {v}" for k, v in data.sizes.items())
            + f"); device {self.device}"
            + (f" x {ctx.world_size} processes ({ctx.backend})" if ctx.distributed else "")
            + f"; {sum(p.numel() for p in self.model.parameters()):,} parameters"
        )

    def _distributed_step(self) -> nn.Module:
        """The training step, wrapped in DistributedDataParallel in a torchrun job."""
        if not self.ctx.distributed:
            return self.step_module
        from torch.nn.parallel import DistributedDataParallel as DDP

        import inspect

        # rank 0's buffers (SOC power-iteration vectors) are copied to all ranks at every forward
        sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                else "broadcast_buffers")
        return DDP(self.step_module, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                   **{sync: True})

    def _make_graphed_step(self, forward: nn.Module) -> None:
        """Set :attr:`graphed` (``--cuda-graphs``, :mod:`lipcli.host.cuda_graphs`) or the reason why not."""
        mode = self.cfg.cuda_graphs
        if mode == "off":
            self.graph_reason = "off (--cuda-graphs off)"
            return
        self.graph_reason = graph_unsupported_reason(
            self.device, self.optimizer, distributed=self.ctx.distributed,
            grad_scaler=self.scaler.is_enabled())
        if self.graph_reason is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.graphed = GraphedStep(
                lambda images, labels: self._step_body(forward, images, labels, params),
                self.optimizer, self.device)
            self.reporter.print("cuda graphs: training steps replayed from a CUDA graph")
        elif mode == "on" or self.device.type == "cuda":
            self.reporter.print(f"cuda graphs: not used: {self.graph_reason}")

    def _report_graph_failure(self) -> None:
        """Say once (one line) when the graph capture failed and steps ran eagerly."""
        graphed = self.graphed
        if graphed is not None and graphed.reason and not self.graph_reported:
            self.graph_reported = True
            self.graph_reason = graphed.reason
            self.reporter.print(f"cuda graphs: not used: {graphed.reason}; training steps run eagerly")

    def graph_record(self) -> dict[str, Any]:
        """The model file's record of CUDA-graph use."""
        record: dict[str, Any] = {"mode": self.cfg.cuda_graphs}
        if self.graphed is not None:
            record.update(self.graphed.summary())
        else:
            record.update(captured=False, reason=self.graph_reason)
        return record

    # ---- training ---------------------------------------------------------------------------
    def train_epochs(self) -> None:
        """Train from ``state.epoch`` to ``cfg.epochs``; Ctrl-C becomes :class:`TrainingInterrupted`."""
        forward = self._distributed_step()
        self._make_graphed_step(forward)
        interrupt_at = _interrupt_point()
        self.reporter.start()
        current_epoch = self.state.epoch
        try:
            for epoch in range(self.state.epoch, self.cfg.epochs):
                current_epoch = epoch
                sums, extra, train_time = self._train_epoch(epoch, forward, interrupt_at)
                record = self._epoch_record(epoch, sums, extra, train_time)
                self._validate(epoch, record)
                self._finish_epoch(epoch, record, int(sums[2]), train_time)
        except KeyboardInterrupt:
            self.reporter.stop()
            raise self._interrupted(self.state.epoch, f"during epoch {current_epoch + 1}") from None
        finally:
            self.reporter.stop()

    def _train_epoch(self, epoch: int, forward: nn.Module,
                     interrupt_at: tuple[int, int] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
        """One pass over this rank's training data, then the end-of-epoch power-iteration
        refresh and the loss's ``end_epoch``.  Returns the local sums (loss, correct, images),
        the summed loss parts (by name) and the time taken."""
        cfg, device = self.cfg, self.device
        seed = _epoch_seed(cfg.seed, epoch, self.ctx.rank)
        torch.manual_seed(seed)
        self.loader.generator.manual_seed(seed)
        self.sampler.set_epoch(epoch)
        self.model.train()
        self.step_module.train()
        self.reporter.epoch(epoch + 1, cfg.epochs, self.steps_per_epoch)
        params = [p for p in self.model.parameters() if p.requires_grad]
        check_every = 1 if device.type == "cpu" else 25
        mid_step = self.steps_per_epoch // 2
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        extra: dict[str, torch.Tensor] = {}
        checked = torch.zeros(1, dtype=torch.float64, device=device)
        t0 = time.perf_counter()
        seen = 0
        for i, (images, labels) in enumerate(self.loader):
            if interrupt_at is not None and interrupt_at == (epoch, i):
                raise KeyboardInterrupt
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            loss, logits, parts = self._optimizer_step(forward, images, labels, params)
            n = labels.shape[0]
            seen += n
            sums[0] += loss.detach().double() * n
            sums[1] += (logits.argmax(dim=1) == labels).sum()
            sums[2] += n
            for name, value in parts.items():
                if name not in extra:
                    extra[name] = torch.zeros((), dtype=torch.float64, device=device)
                extra[name] += value.double() * n
            if i == mid_step and self.steps_per_epoch > 1:
                self._refresh_power_iteration()
            if (i + 1) % check_every == 0 or i + 1 == self.steps_per_epoch:
                self._check_finite(sums, checked, epoch, i)
                if self.reporter.progress is not None:
                    dt = max(time.perf_counter() - t0, 1e-9)
                    self.reporter.update(i + 1, float(sums[0] / sums[2]), float(sums[1] / sums[2]),
                                         seen * self.ctx.world_size / dt)
        self._report_graph_failure()
        self._refresh_power_iteration()  # end of epoch: before evaluation and before the checkpoint
        self.step_module.end_epoch()
        self.ctx.sync_module_state(self.step_module.loss)
        return sums, extra, time.perf_counter() - t0

    def _optimizer_step(self, forward: nn.Module, images: torch.Tensor,
                        labels: torch.Tensor, params: list[nn.Parameter]) -> tuple[Any, Any, Any]:
        """zero_grad, then :meth:`_step_body` (replayed from a CUDA graph where one is used),
        then the scheduler step; returns the step module's (loss, logits, parts)."""
        if self.graphed is not None:
            out = self.graphed(images, labels)
        else:
            self.optimizer.zero_grad(set_to_none=True)
            out = self._step_body(forward, images, labels, params)
        self.scheduler.step()
        self.state.step += 1
        return out

    def _step_body(self, forward: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   params: list[nn.Parameter]) -> tuple[Any, Any, Any]:
        """Forward (under autocast), backward, clip, optimiser step (no zero_grad, no
        scheduler step: the part a CUDA graph records); returns (loss, logits, parts)."""
        cfg, optimizer, scaler = self.cfg, self.optimizer, self.scaler
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=cfg.amp):
            loss, logits, parts = forward(images, labels)
        scaler.scale(loss).backward()
        if cfg.grad_clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        # detached: a returned graph would keep the step's autograd graph (and, when it is
        # captured, the graph's gradient-accumulation nodes) alive between steps
        return loss.detach(), logits, parts

    def _check_finite(self, sums: torch.Tensor, checked: torch.Tensor, epoch: int, i: int) -> None:
        """Raise :class:`TrainingDiverged` when the summed loss over all ranks is NaN or inf."""
        checked.copy_(sums[:1])
        self.ctx.all_reduce_sum(checked)
        if not math.isfinite(float(checked)):
            raise TrainingDiverged(
                f"loss became NaN/inf at epoch {epoch + 1}, step {i + 1} (lr "
                f"{self.scheduler.get_last_lr()[0]:.3g}); kept the last good checkpoint "
                f"{self.paths.checkpoint} (epoch {self.state.epoch}); try a lower --lr or "
                "--grad-clip 1"
            )

    def _refresh_power_iteration(self) -> None:
        """Advance the model's power iterations (where it has them); copy rank 0's state to all."""
        refresher = getattr(self.model, "refresh_power_iteration", None)
        if callable(refresher):
            refresher(self.cfg.power_iter_steps)
        self.ctx.sync_module_state(self.model)

    def _epoch_record(self, epoch: int, sums: torch.Tensor, extra: dict[str, torch.Tensor],
                      train_time: float) -> dict[str, Any]:
        """Sum the epoch's statistics over all ranks; the log record of its training metrics."""
        self.ctx.all_reduce_sum(sums)
        for name in sorted(extra):
            self.ctx.all_reduce_sum(extra[name])
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "train_loss": float(sums[0] / sums[2]),
            "train_accuracy": float(sums[1] / sums[2]),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "time_s": round(train_time, 3),
            "images_per_s": round(float(sums[2]) / max(train_time, 1e-9), 1),
        }
        for name in sorted(extra):
            record[f"train_{name}"] = float(extra[name] / sums[2])
        return record

    def _validate(self, epoch: int, record: dict[str, Any]) -> None:
        """Add the validation loss and accuracy to ``record`` (where there is a validation set);
        with ``keep_best``, rank 0 saves a new best model."""
        if self.val_loader is None:
            return
        from lipcli.host.models import save_model

        val = evaluate(self.model, self.val_loader, self.ctx)
        record["val_loss"], record["val_accuracy"] = val["loss"], val["accuracy"]
        state = self.state
        if self.cfg.keep_best and (state.best is None or val["accuracy"] > state.best["val_accuracy"]):
            state.best = {"epoch": epoch + 1, "val_accuracy": val["accuracy"]}
            if self.ctx.is_main:
                save_model(self.model, self.paths.best, dataset=self.data.info(),
                           training={"epoch": epoch + 1, "val_accuracy": val["accuracy"]})

    def _finish_epoch(self, epoch: int, record: dict[str, Any], images: int, train_time: float) -> None:
        """Count the epoch as done: update the progress, append to the log, checkpoint, print."""
        state = self.state
        state.epoch = epoch + 1
        state.elapsed += train_time
        state.images += images
        state.history.append(record)
        if self.ctx.is_main:
            with open(self.paths.log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        self.save_checkpoint()
        self.ctx.barrier()
        self.reporter.print(
            f"epoch {epoch + 1}/{self.cfg.epochs}  loss {record['train_loss']:.4f}  "
            f"acc {record['train_accuracy']:.4f}"
            + (f"  val {record['val_accuracy']:.4f}" if "val_accuracy" in record else "")
            + f"  lr {record['lr']:.3g}  {record['images_per_s']:.0f} img/s  {train_time:.1f}s"
        )

    def _interrupted(self, done: int, when: str) -> TrainingInterrupted:
        """The error for a Ctrl-C ``when`` (e.g. "during epoch 3") with ``done`` epochs
        checkpointed, with the resume command."""
        ctx = self.ctx
        command = (
            "lip train" if ctx.world_size == 1
            else f"torchrun --nproc-per-node {ctx.local_world_size} -m lipcli train"
        )
        run_dir = self.paths.run_dir
        interrupted = TrainingInterrupted(
            f"interrupted {when}; the checkpoint after epoch {done} is in {run_dir}; resume "
            f"with: {command} --resume {run_dir}"
        )
        interrupted.silent = not ctx.is_main  # one message per run, from rank 0
        return interrupted

    # ---- after training ---------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """Test the selected weights; rank 0 writes the model file and the final checkpoint.
        Returns the summary (empty on ranks other than 0)."""
        if os.environ.get(INTERRUPT_ENV, "").strip() == "end":  # testing hook: a real Ctrl-C
            import signal

            os.kill(os.getpid(), signal.SIGINT)
        test, results = self._test_selected_model()
        summary: dict[str, Any] = {}
        if self.ctx.is_main:
            summary = self._write_model(test, results)
        self.ctx.barrier()
        return summary

    def _test_selected_model(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load the selected weights and evaluate them on the test set; returns the evaluation
        and the model file's ``results``."""
        cfg, state = self.cfg, self.state
        self.ctx.check_consistent(self.model)
        if cfg.keep_best and state.best is not None:
            from lipcli.host.modelfile import read_model_file

            self.model.load_state_dict(read_model_file(self.paths.best).tensors)
        self.model.eval()
        test = evaluate(self.model, self.test_loader, self.ctx)
        results: dict[str, Any] = {
            "test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_examples": test["examples"],
            "selected_epoch": state.best["epoch"] if (cfg.keep_best and state.best) else state.epoch,
            "selection": "best validation accuracy" if (cfg.keep_best and state.best) else "last epoch",
        }
        last = self._last_record()
        for key in ("train_accuracy", "train_loss", "val_accuracy"):
            if key in last:
                results[f"{key}_last_epoch"] = last[key]
        return test, results

    def _last_record(self) -> dict[str, Any]:
        """The last epoch's log record ({} when no epoch has run)."""
        return self.state.history[-1] if self.state.history else {}

    def _training_metadata(self) -> dict[str, Any]:
        """The model file's ``training`` record: time, throughput, settings, versions, history."""
        cfg, ctx, device, state = self.cfg, self.ctx, self.device, self.state
        return {
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
            "workers": self.workers,
            "amp_dtype": str(self.amp_dtype).replace("torch.", "") if cfg.amp else None,
            "lipcli_version": __version__,
            "torch_version": torch.__version__,
            "weight_decay_parameters": self.groups[0]["names"],
            "loss": loss_record(self.loss_component, self.step_module.loss),
            "optimization": optimization_record(cfg, self.optimizer),
            "extra_data": self._extra_record(),
            "run_dir": str(self.paths.run_dir),
            "resumed_from_epochs": state.resumed_from,
            "cuda_graphs": self.graph_record(),
            "history": state.history,
        }

    def _extra_record(self) -> dict[str, Any] | None:
        return None if self.extra is None else self.extra.record(self.cfg.extra_ratio)

    def _write_model(self, test: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
        """Rank 0: write the model file and the final checkpoint, print the result; returns the
        JSON summary."""
        from lipcli.host.models import save_model

        lipschitz = lipschitz_record(self.model, estimate=self.cfg.lipschitz_estimate)
        training = self._training_metadata()
        try:  # never replace a file that appeared meanwhile unless --overwrite (and a model)
            check_replaceable(self.paths.out, self.overwrite)
            save_model(self.model, self.paths.out, dataset=self.data.info(), lipschitz=lipschitz,
                       results=results, training=training)
        except LipError as exc:  # e.g. disk full: the run is not lost
            run_dir = self.paths.run_dir
            raise LipError(
                f"{exc}; the trained run is kept in {run_dir} (checkpoint after epoch "
                f"{self.state.epoch}): write the model with `lip train --resume {run_dir} "
                "--out OTHER.safetensors`"
            ) from None
        self.save_checkpoint(status="complete")
        summary = {
            "model": str(self.paths.out),
            "run_dir": str(self.paths.run_dir),
            "dataset": self.data.component.name,
            "epochs": self.state.epoch,
            "test_accuracy": test["accuracy"],
            "val_accuracy": self._last_record().get("val_accuracy"),
            "lipschitz_upper_bound": lipschitz.get("upper_bound"),
            "lipschitz_estimate": lipschitz.get("estimate"),
            "time_s": training["time_s"],
            "images_per_s": training["images_per_s"],
            "device": str(self.device),
            "world_size": self.ctx.world_size,
        }
        self.reporter.print(
            f"test accuracy {test['accuracy']:.4f} ({test['examples']} images); Lipschitz bound "
            f"{lipschitz.get('upper_bound')}; model written to {self.paths.out}"
        )
        return summary


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    from lipcli.host.data import epoch_seed

    return epoch_seed(seed, epoch, rank)
