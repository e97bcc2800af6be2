"""The parts a :class:`lipcli.train.run.TrainingRun` is composed of, each built once: where
and how it runs (:class:`RunSettings`), its loaders (:class:`Loaders`), its optimisation
objects (:class:`Optimization`); its progress is :class:`lipcli.train.run.RunState`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.data.loaders import eval_loader, train_loader
from lipcli.sdk.losses import LossContext
from lipcli.train.config import TrainConfig
from lipcli.train.distributed import DistContext
from lipcli.train.mixing import extra_loader_or_none
from lipcli.train.objective import TrainStep, build_loss
from lipcli.train.optim import build_optimization
from lipcli.train.paths import RunPaths
from lipcli.train.reporting import Reporter


@dataclass
class RunSettings:
    """Where and how a run trains: its settings, processes, device, files, progress display
    and data-loader workers; ``overwrite``: the final write may replace an existing model file."""

    cfg: TrainConfig
    ctx: DistContext
    device: torch.device
    paths: RunPaths
    reporter: Reporter
    workers: int
    overwrite: bool = False


@dataclass
class Loaders:
    """This rank's training loader and sampler (with extra images mixed in where given), the
    validation loader (or None), the test loader, and the training steps per epoch."""

    train: Any
    sampler: Any
    val: Any
    test: Any
    steps_per_epoch: int

    @classmethod
    def build(cls, settings: RunSettings, data: Any, extra: Any = None) -> Loaders:
        cfg, ctx, workers = settings.cfg, settings.ctx, settings.workers
        pin = settings.device.type == "cuda"
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
        return cls(loader, sampler, val_loader, test_loader, len(loader))


@dataclass
class Optimization:
    """The optimiser (``groups``: its parameter groups with their names), the schedule, the
    autocast dtype and gradient scaler, and the training loss with its step module."""

    groups: list[dict[str, Any]]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    amp_dtype: torch.dtype
    scaler: torch.amp.GradScaler
    loss_component: Any
    step_module: TrainStep

    @classmethod
    def build(cls, settings: RunSettings, data: Any, model: nn.Module, loss: Any,
              steps_per_epoch: int) -> Optimization:
        """The optimiser and schedule, the AMP dtype (bfloat16, float16 where CUDA lacks bf16)
        and scaler (enabled only for float16), and the loss built by its component's factory
        (see :mod:`lipcli.sdk.losses`)."""
        cfg, device = settings.cfg, settings.device
        groups, optimizer, scheduler = build_optimization(cfg, model, steps_per_epoch=steps_per_epoch)
        amp_dtype = torch.bfloat16
        if cfg.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            amp_dtype = torch.float16
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp and amp_dtype == torch.float16)
        context = LossContext(model=model, num_classes=data.num_classes, dataset=data.component.name,
                              mean=tuple(data.mean), std=tuple(data.std), seed=cfg.seed,
                              device=device, refresh_steps=cfg.power_iter_steps)
        step_module = TrainStep(model, build_loss(loss, context))
        return cls(groups, optimizer, scheduler, amp_dtype, scaler, loss, step_module)

