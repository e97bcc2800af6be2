"""The driver :func:`train`: configure (a new run, or a resume from its checkpoint), build the
data and model, then hand over to :class:`lipcli.train.run.TrainingRun` (train, checkpoint,
write the model file), whose epochs run in :class:`lipcli.train.loop.TrainingLoop`.  Every
argument is validated before anything is written."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lipcli.host.defaults import COMPONENT_SETTINGS, DEFAULT_COMPONENTS, LAYER_KINDS
from lipcli.host.locks import check_run_unlocked
from lipcli.host.modelcheck import BuildTooLarge, budgeted_build
from lipcli.sdk.errors import LipError, OutOfMemory, memory_step, out_of_memory_template
from lipcli.train.memory import build_budget
from lipcli.sdk.specs import Component
from lipcli.train.checkpoint import read_checkpoint
from lipcli.train.config import (CHECKPOINT_NAME, DEFAULT_NPROC_PER_NODE, MAX_CUDA_WORKERS, MODEL_NAME,
                                 TrainConfig)
from lipcli.train.distributed import DistContext
from lipcli.train.errors import TrainError, TrainUsageError, literal
from lipcli.train.memory import MODEL_SIZED, check_fits
from lipcli.train.objective import resolve_loss
from lipcli.train.paths import RunPaths, _check_writable_dir, check_replaceable, plan_paths
from lipcli.train.reporting import Reporter
from lipcli.train.results import TrainSummary
from lipcli.train.parts import RunSettings
from lipcli.train.run import TrainingRun
from lipcli.train.budget import plan_budget
from lipcli.data.augmentation import resolve_augmentation
from lipcli.data.loaders import check_data_dir, load_data, resolve_dataset
from lipcli.host.models import ComponentParameterError, build_model, make_config
from lipcli.host.plugins import Registry, get_registry, parse_component_choice
from lipcli.train.extradata import check_compatible, open_extra_data


def network_slots(cfg: TrainConfig, reg: Registry) -> tuple[Component, tuple[str, ...]]:
    """The run's architecture (width applied) and the layer kinds it takes from the settings
    (its slots: :meth:`~lipcli.sdk.specs.ArchSpec.slots_for`)."""
    arch = _arch_component(cfg, reg)
    return arch, arch.spec.slots_for(arch.params, reg.component("head", cfg.head).spec)


RESUME_CHANGEABLE = frozenset({"device", "workers", "data_dir", "cuda_graphs", "compile", "compile_mode", "lr", "eval_batch_size"})


def _same_setting(key: str, stored: TrainConfig, given: Any, reg: Registry) -> bool:
    """Whether ``given`` (a resume override) equals the stored value of setting ``key``."""
    if not hasattr(stored, key):  # a loss parameter's shortcut: the stored loss has it written out
        return False
    try:
        value = getattr(stored.updated({key: given}, source="resume"), key)
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


def _arch_component(cfg: TrainConfig, reg: Registry) -> Component:
    """The architecture with the ``width`` setting applied; the same width given twice (in
    ``arch``, ``NAME:width=W``, and as ``width``) is fine, two different widths are a usage
    error."""
    inline = parse_component_choice(cfg.arch)[1]
    if cfg.width is None:
        return reg.component("arch", cfg.arch)
    if "width" in inline:
        own = reg.component("arch", cfg.arch).params.get("width")
        if own != cfg.width:
            raise TrainUsageError(
                f"conflicting widths: {{arch}} {literal(cfg.arch)} sets width {literal(own)} but "
                f"{{width}} is {cfg.width}; give the width once"
            )
    return reg.component("arch", cfg.arch, {"width": cfg.width})


def _component_error(exc: ComponentParameterError, cfg: TrainConfig) -> TrainUsageError:
    """A :class:`~lipcli.host.models.ComponentParameterError` as the trainer reports it: the
    setting that gave the rejected value when that is ``width``, else the component and its
    values."""
    width_only = cfg.width is not None and (
        (exc.kind == "arch" and set(exc.params) == {"width"})
        or (not exc.params and exc.context is not None and set(exc.context[2]) == {"width"})
    )
    if width_only:
        return TrainUsageError(f"{{width}} {cfg.width}: {literal(exc.reason)}")
    return TrainUsageError(literal(exc))


@dataclass
class _Setup:
    """A run as configured and validated (step 1 of :func:`train`); nothing written yet."""

    cfg: TrainConfig
    comps: dict[str, Component]
    data_comp: Component
    loss_comp: Component
    augmentation: Component
    root: str | None
    device: torch.device
    paths: RunPaths
    workers: int
    ckpt_tensors: dict[str, torch.Tensor] | None = None
    ckpt_meta: dict[str, Any] | None = None


def _configure(config: TrainConfig | None, ctx: DistContext, reg: Registry, *, run_dir: str | None,
               out: str | None, resume: str | None, resume_overrides: dict[str, Any] | None,
               overwrite: bool) -> _Setup:
    """Step 1 of :func:`train` for the process ``ctx``: the settings, components, data
    directory, device, global batch, paths and locks, all validated; no side effects."""
    ckpt_tensors: dict[str, torch.Tensor] | None = None
    ckpt_meta: dict[str, Any] | None = None
    paths: RunPaths | None = None  # for a new run: decided after validation, below
    if resume is not None:
        cfg, paths, ckpt_tensors, ckpt_meta = _resume_plan(resume, resume_overrides, out, overwrite, reg)
    else:
        cfg = config or TrainConfig()
    cfg.validate()
    arch, slots = network_slots(cfg, reg)
    comps = {"arch": arch}
    for kind in slots:
        comps[kind] = reg.component(kind, getattr(cfg, kind) or DEFAULT_COMPONENTS[kind])
    # a kind the network fixes itself is no setting of the run (nor recorded as one)
    cfg = dataclasses.replace(cfg, **{kind: None for kind in LAYER_KINDS if kind not in slots})
    data_comp = resolve_dataset(cfg.dataset, reg)
    augmentation_text, augmentation = resolve_augmentation(cfg.augmentation, cfg.augment, reg)
    cfg = dataclasses.replace(cfg, augmentation=augmentation_text)
    cfg, loss_comp = resolve_loss(cfg.resolved(), comps["head"], data_comp.name, reg)
    root = check_data_dir(data_comp, cfg.data_dir, cfg.download)
    device = ctx.resolve_device(cfg.device)
    if cfg.batch_size % ctx.world_size:
        raise TrainUsageError(
            f"{{batch_size}} {cfg.batch_size} is the global batch; it must be divisible by the "
            f"{ctx.world_size} processes"
        )
    if paths is None:
        paths = plan_paths(cfg, run_dir=run_dir, out=out, overwrite=overwrite)
    workers = cfg.workers if cfg.workers is not None else (
        0 if device.type == "cpu"
        else min(MAX_CUDA_WORKERS, max(1, (os.cpu_count() or 2) // ctx.local_world_size - 1))
    )
    return _Setup(cfg=cfg, comps=comps, data_comp=data_comp, loss_comp=loss_comp, augmentation=augmentation, root=root,
                  device=device, paths=paths, workers=workers, ckpt_tensors=ckpt_tensors,
                  ckpt_meta=ckpt_meta)


def _data_and_model(setup: _Setup, *, download: bool) -> tuple[Any, Any, dict[str, Any], nn.Module]:
    """Step 2 of :func:`train`: the data (downloaded first when ``download``), the extra
    data, the model configuration and the model (seeded, on the CPU)."""
    cfg, comps = setup.cfg, setup.comps
    data = load_data(
        setup.data_comp, setup.root, download=download, augment=cfg.augment, augmentation=setup.augmentation,
        val_split=cfg.val_split, limit_train=cfg.limit_train, limit_test=cfg.limit_test,
        seed=cfg.seed,
    )
    extra = _open_extra_data(cfg, data)
    model_config = make_config(
        comps, num_classes=data.num_classes, in_channels=data.image_shape[0],
        image_size=data.image_shape[1:], mean=data.mean, std=data.std,
    )
    torch.manual_seed(cfg.seed)
    try:
        with memory_step("model build", *MODEL_SIZED):
            model = budgeted_build(lambda: build_model(model_config, comps), build_budget())
    except ComponentParameterError as exc:
        raise _component_error(exc, cfg) from exc
    except BuildTooLarge as exc:
        raise OutOfMemory(out_of_memory_template(
            f"model build (it asks for over {exc.requested / 2**30:.3g} GiB, more than a third of the "
            f"{3 * exc.budget / 2**30:.3g} GiB available, before the first step)", *MODEL_SIZED)) from None
    return data, extra, model_config, model


def check_train(
    config: TrainConfig | None = None,
    *,
    processes: int = DEFAULT_NPROC_PER_NODE,
    run_dir: str | None = None,
    out: str | None = None,
    resume: str | None = None,
    resume_overrides: dict[str, Any] | None = None,
    registry: Registry | None = None,
    overwrite: bool = False,
) -> RunPaths:
    """Everything :func:`train` validates before it trains, for a run of ``processes``
    processes on this machine (ranks ``0 .. processes - 1``), done in this process: the
    settings, components, data directory, device of every rank, global batch, paths, locks,
    then the data (downloaded here when ``download`` asks for it) and the model, which are
    dropped again.  Nothing is written except a requested download.  Returns the run
    directory and model file that :func:`train` would use (a new timestamped run directory
    is decided here; pass it on as ``run_dir``).  Raises what :func:`train` would raise."""
    if processes < 1:
        raise TrainUsageError(f"processes must be at least 1 (got {processes})")
    reg = registry or get_registry()
    ctx = DistContext(rank=0, world_size=processes, local_rank=processes - 1,
                      local_world_size=processes, distributed=processes > 1)
    setup = _configure(config, ctx, reg, run_dir=run_dir, out=out, resume=resume,
                       resume_overrides=resume_overrides, overwrite=overwrite)
    _data_and_model(setup, download=setup.cfg.download)
    return setup.paths


def train(
    config: TrainConfig | None = None,
    *,
    run_dir: str | None = None,
    out: str | None = None,
    resume: str | None = None,
    resume_overrides: dict[str, Any] | None = None,
    quiet: bool = False,
    registry: Registry | None = None,
    overwrite: bool = False,
) -> TrainSummary | None:
    """Train (or resume) a model; returns its :class:`~lipcli.train.results.TrainSummary`
    (``None`` on the processes other than rank 0 of a torchrun job; ``summary.to_json()`` is
    what ``lip train --json`` prints).  See the :mod:`lipcli.train` docstring.

    For a new run pass ``config``; for ``resume`` (a run directory) the stored config is used
    and only ``resume_overrides`` in :data:`RESUME_CHANGEABLE` (and ``out``) may change it
    (an override equal to the stored value is accepted).  An existing model file or finished
    run directory is replaced only with ``overwrite`` (see :func:`plan_paths`).
    Every argument is validated before anything is written (:func:`check_train` does the same
    validation alone, e.g. before worker processes are started).
    """
    reg = registry or get_registry()
    ctx = DistContext.from_env()

    # ---- 1. configuration (no side effects) --------------------------------------------------
    setup = _configure(config, ctx, reg, run_dir=run_dir, out=out, resume=resume,
                       resume_overrides=resume_overrides, overwrite=overwrite)
    cfg, device, paths = setup.cfg, setup.device, setup.paths
    reporter = Reporter(enabled=ctx.is_main and not quiet)

    # ---- 2. data and model (still nothing written, except a requested download) -------------
    ctx.init(device)
    try:
        if ctx.distributed:  # one run directory for everyone (rank 0's timestamp)
            paths = RunPaths(*(Path(p) for p in ctx.broadcast_json([str(paths.run_dir), str(paths.out)])))
        if cfg.download and not ctx.is_main:
            ctx.barrier()  # rank 0 downloads first
        data, extra, model_config, model = _data_and_model(setup, download=cfg.download and ctx.is_main)
        if cfg.download and ctx.is_main:
            ctx.barrier()
        with memory_step("model set-up on " + str(device), *MODEL_SIZED):
            model = model.to(device)
        check_fits(model, cfg, tuple(data.image_shape), ctx, device)  # before anything is written
        settings = RunSettings(cfg=cfg, ctx=ctx, device=device, paths=paths, reporter=reporter,
                               workers=setup.workers, overwrite=overwrite)
        with memory_step("optimiser set-up", *MODEL_SIZED):
            run = TrainingRun.build(settings, data, model, model_config, loss=setup.loss_comp, extra=extra)
        if cfg.time_budget and setup.ckpt_tensors is None:  # a new run: measure, fix epochs and schedule
            settings = dataclasses.replace(settings, cfg=plan_budget(run))
            run = TrainingRun.build(settings, data, model, model_config, loss=setup.loss_comp, extra=extra)
        return run.execute(setup.ckpt_tensors, setup.ckpt_meta)
    finally:
        reporter.stop()
        ctx.destroy()


def _resume_plan(
    resume: str, resume_overrides: dict[str, Any] | None, out: str | None, overwrite: bool, reg: Registry
) -> tuple[TrainConfig, RunPaths, dict[str, torch.Tensor], dict[str, Any]]:
    """The stored config (with the allowed overrides), the paths and the checkpoint of the run
    in directory ``resume``; nothing is written."""
    rd = Path(resume).expanduser()
    if not rd.is_dir():
        raise TrainUsageError(f"{{resume}} {literal(rd)}: not a directory")
    ckpt_tensors, ckpt_meta = read_checkpoint(rd / CHECKPOINT_NAME)
    cfg = TrainConfig().updated(ckpt_meta["config"], source=str(rd / CHECKPOINT_NAME))
    overrides = dict(resume_overrides or {})
    fixed = sorted(
        k for k in overrides if k not in RESUME_CHANGEABLE and not _same_setting(k, cfg, overrides[k], reg)
    )
    if fixed:
        raise TrainUsageError(
            "{resume} continues a run with its stored settings; cannot change "
            + ", ".join(f"{{{k}}} (stored: {literal(repr(getattr(cfg, k, cfg.loss)))})" for k in fixed)
        )
    cfg = cfg.updated({k: v for k, v in overrides.items() if k in RESUME_CHANGEABLE}, source="resume")
    stored_out = ckpt_meta.get("out")
    if stored_out is not None and (not isinstance(stored_out, str) or not stored_out.strip()):
        raise TrainError(f"{literal(rd / CHECKPOINT_NAME)} records an invalid output path; pass {{out}} FILE")
    out = out or stored_out
    if not os.access(rd, os.W_OK | os.X_OK):
        raise TrainUsageError(f"run directory {literal(rd)} is not writable")
    paths = RunPaths(run_dir=rd, out=Path(out).expanduser() if out else rd / MODEL_NAME)
    if paths.out.is_dir():
        raise TrainUsageError(
            f"{{out}} {literal(paths.out)} is a directory; give a file name (e.g. model.safetensors)")
    # the same rule as a new run: an existing file is replaced only with ``overwrite``, and
    # only if it is a lipcli model file (the checkpoint's path is not trusted)
    check_replaceable(paths.out, overwrite, f"or write elsewhere: {{command}} {{resume}} {literal(rd)} {{out}} OTHER")
    _check_writable_dir(paths.out.parent, "output directory")
    check_run_unlocked(rd, paths.out)
    return cfg, paths, ckpt_tensors, ckpt_meta


def _open_extra_data(cfg: TrainConfig, data: Any) -> Any:
    """The ``extra_data`` arrays, memory-mapped and checked against the data (or None)."""
    if cfg.extra_data is None:
        return None

    extra = open_extra_data(cfg.extra_data)
    check_compatible(extra, image_shape=data.image_shape, num_classes=data.num_classes)
    return extra

