"""One training run (:class:`TrainingRun`): built from the configured data and model, then
its epochs, steps, power-iteration refreshes, validation and CUDA graphs; its checkpoints and
model file are :class:`lipcli.train.outputs.RunOutputs`."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.train.cuda_graphs import GraphedStep, graph_unsupported_reason
from lipcli.train.locks import run_locks
from lipcli.sdk.errors import LipError
from lipcli.train.config import INTERRUPT_ENV, TrainConfig
from lipcli.train.distributed import DistContext, lost_connection
from lipcli.train.errors import TrainingDiverged, TrainingInterrupted, WorkerLost, literal
from lipcli.train.evaluation import evaluate
from lipcli.train.objective import TrainStep, build_loss
from lipcli.train.optim import build_optimization
from lipcli.train.outputs import RunOutputs
from lipcli.train.paths import RunPaths
from lipcli.train.reporting import Reporter
from lipcli.train.results import TrainSummary
from lipcli.data.loaders import epoch_seed, eval_loader, train_loader
from lipcli.host.models import save_model
from lipcli.sdk.losses import LossContext
from lipcli.train.mixing import extra_loader_or_none


def _interrupt_point() -> tuple[int, int] | None:
    raw = os.environ.get(INTERRUPT_ENV, "").strip()
    if not raw or raw == "end":
        return None
    epoch, _, step = raw.partition(":")
    return int(epoch), int(step or 0)



def _make_loaders(cfg: TrainConfig, ctx: DistContext, device: torch.device, data: Any,
                  workers: int, extra: Any = None) -> tuple[Any, Any, Any, Any]:
    """This rank's training loader and sampler (with ``extra`` images mixed in where given),
    validation loader (or None) and test loader."""
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
    context = LossContext(model=model, num_classes=data.num_classes, dataset=data.component.name,
                          mean=tuple(data.mean), std=tuple(data.std), seed=cfg.seed, device=device,
                          refresh_steps=cfg.power_iter_steps)
    return build_loss(component, context)

@dataclass
class TrainingRun(RunOutputs):
    """One training run: its parts (declared by :class:`RunOutputs`), its epochs and steps,
    and whether they are replayed from a CUDA graph."""

    graphed: GraphedStep | None = None
    graph_reason: str | None = None
    graph_reported: bool = False

    @classmethod
    def build(cls, cfg: TrainConfig, ctx: DistContext, device: torch.device, paths: RunPaths,
              reporter: Reporter, data: Any, model: nn.Module, model_config: dict[str, Any], *,
              loss: Any, workers: int, extra: Any = None) -> TrainingRun:
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
                ckpt_meta: dict[str, Any] | None) -> TrainSummary | None:
        """Resume from the checkpoint if given, train the remaining epochs, write the model
        file; returns the summary (``None`` on ranks other than 0)."""
        if ckpt_tensors is not None:
            self.restore_checkpoint(ckpt_tensors, ckpt_meta)
        self.make_dirs()
        # one writer per run directory and model file for the whole run (lipcli.train.locks)
        with run_locks(self.paths.run_dir, self.paths.out, enabled=self.ctx.is_main):
            self.create_run_dir()
            self.announce()
            try:
                self.train_epochs()
                try:
                    return self.finish()
                except KeyboardInterrupt:
                    raise self._interrupted(self.state.epoch, "after the last epoch") from None
            except RuntimeError as exc:  # a collective failed: another process is gone
                if not (self.ctx.initialized and lost_connection(exc)):
                    raise
                self.reporter.stop()
                raise self._interrupted(self.state.epoch, "", lost=True) from None

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
                from lipcli.host.modelfile import atomic_write_bytes  # lazy: looked up at call time (tests replace it on its module)

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
        """Set :attr:`graphed` (``cuda_graphs``, :mod:`lipcli.train.cuda_graphs`) or the reason why not."""
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
            diverged = TrainingDiverged(
                f"loss became NaN/inf at epoch {epoch + 1}, step {i + 1} (lr "
                f"{self.scheduler.get_last_lr()[0]:.3g}); kept the last good checkpoint "
                f"{literal(self.paths.checkpoint)} (epoch {self.state.epoch}); try a lower {{lr}} or "
                "{grad_clip} 1"
            )
            diverged.silent = not self.ctx.is_main  # every rank sees the same sum: rank 0 says it
            raise diverged

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

        val = evaluate(self.model, self.val_loader, self.ctx)
        record["val_loss"], record["val_accuracy"] = val.loss, val.accuracy
        state = self.state
        if self.cfg.keep_best and (state.best is None or val.accuracy > state.best["val_accuracy"]):
            state.best = {"epoch": epoch + 1, "val_accuracy": val.accuracy}
            if self.ctx.is_main:
                save_model(self.model, self.paths.best, dataset=self.data.info(),
                           training={"epoch": epoch + 1, "val_accuracy": val.accuracy})

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

    def _interrupted(self, done: int, when: str, lost: bool = False) -> TrainingInterrupted | WorkerLost:
        """The error for a Ctrl-C ``when`` (e.g. "during epoch 3") with ``done`` epochs
        checkpointed, with the resume command (:mod:`lipcli.train.errors`); ``lost``: for a
        lost connection to another process of the run instead (exit 1)."""
        ctx = self.ctx
        run_dir = literal(self.paths.run_dir)
        what = "another process of the run stopped (connection lost)" if lost else f"interrupted {when}"
        error = (WorkerLost if lost else TrainingInterrupted)(
            f"{what}; the checkpoint after epoch {done} is in {run_dir}; resume "
            f"with: {{command}} {{resume}} {run_dir}",
            launch=None if ctx.world_size == 1 else ctx.local_world_size, launcher=ctx.launcher,
        )
        error.silent = not ctx.is_main  # one message per run, from rank 0 (or the launcher)
        return error


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return epoch_seed(seed, epoch, rank)
