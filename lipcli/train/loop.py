"""The epochs and steps of a training run (:class:`TrainingLoop`): per epoch a pass over the
training data, the power-iteration refreshes, validation, the log record and the checkpoint;
per step forward, backward and the optimiser step, replayed from a CUDA graph where one is
used (:mod:`lipcli.train.cuda_graphs`)."""

from __future__ import annotations

import inspect
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from lipcli.data.loaders import epoch_seed
from lipcli.train.budget import budget_exhausted
from lipcli.host.models import save_model
from lipcli.train.config import INTERRUPT_ENV, TrainConfig
from lipcli.train.distributed import DistContext
from lipcli.train.cuda_graphs import GraphedStep, graph_unsupported_reason
from lipcli.compiling import GRAPHING_MODES, Compiled, compile_record, compiled_or_none, measuring
from lipcli.sdk.errors import LipError, is_allocation_failure
from lipcli.sdk.losses import TrainProgress
from lipcli.train.errors import TrainingInterrupted, TrainingOutOfMemory, WorkerLost, literal
from lipcli.train.evaluation import evaluate
from lipcli.train.guard import DivergenceGuard
from lipcli.train.parts import Loaders, Optimization
from lipcli.train.reporting import Reporter

class RunContext(Protocol):
    """What the loop uses of the run that hands itself to it
    (:class:`lipcli.train.run.TrainingRun`, which imports this module, not the reverse)."""

    settings: Any
    state: Any
    model: nn.Module
    data: Any
    loaders: Loaders
    optim: Optimization

    def save_checkpoint(self, status: str = "running") -> None: ...


def _interrupt_point() -> tuple[int, int] | None:
    raw = os.environ.get(INTERRUPT_ENV, "").strip()
    if not raw or raw in ("end", "end-term"):
        return None
    epoch, _, step = raw.partition(":")
    return int(epoch), int(step or 0)


@dataclass
class TrainingLoop:
    """The epochs and steps of ``run`` (from its ``state.epoch`` to the configured epochs),
    and whether they are replayed from a CUDA graph (``graphed``, else ``graph_reason``)."""

    run: RunContext
    graphed: GraphedStep | None = None
    graph_reason: str | None = None
    graph_reported: bool = False
    #: the training forward compiled by torch.compile (``--compile``), else None; the
    #: seconds of its compiling steps in the last epoch
    compiled: Compiled | None = None
    epoch_compile_s: float = 0.0
    #: the step running now, for an out-of-memory message: (what, epoch, step in the epoch)
    at: tuple[str, int, int] = ("training", 0, 0)
    # the run's parts the loop works with (fixed for the run's life)
    cfg: TrainConfig = field(init=False)
    ctx: DistContext = field(init=False)
    device: torch.device = field(init=False)
    reporter: Reporter = field(init=False)
    loaders: Loaders = field(init=False)
    optim: Optimization = field(init=False)
    guard: DivergenceGuard = field(init=False)

    def __post_init__(self) -> None:
        settings = self.run.settings
        self.cfg, self.ctx, self.device = settings.cfg, settings.ctx, settings.device
        self.reporter, self.loaders, self.optim = settings.reporter, self.run.loaders, self.run.optim
        # the CPU loop reads the loss every step: there a non-finite step is stopped before it is applied
        self.guard = DivergenceGuard(self.device, check_grads=not self.optim.scaler.is_enabled(),
                                     host=self.device.type == "cpu")

    def _distributed_step(self) -> nn.Module:
        """The training step, wrapped in DistributedDataParallel in a torchrun job."""
        if not self.ctx.distributed:
            return self.optim.step_module
        # rank 0's buffers (SOC power-iteration vectors) are copied to all ranks at every forward
        sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                else "broadcast_buffers")
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DDP(self.optim.step_module, device_ids=device_ids, **{sync: True})

    def _make_graphed_step(self, forward: nn.Module) -> None:
        """Set :attr:`graphed` (``cuda_graphs``, :mod:`lipcli.train.cuda_graphs`) or the reason why not."""
        mode = self.cfg.cuda_graphs
        if mode == "off":
            self.graph_reason = "off (--cuda-graphs off)"
            return
        if self.compiled is not None and self.compiled.mode in GRAPHING_MODES:
            self.graph_reason = f"torch.compile mode {self.compiled.mode} replays CUDA graphs itself"
            self.reporter.print(f"cuda graphs: not used: {self.graph_reason}")
            return
        self.graph_reason = graph_unsupported_reason(
            self.device, self.optim.optimizer, distributed=self.ctx.distributed,
            grad_scaler=self.optim.scaler.is_enabled())
        if self.graph_reason is None:
            params = [p for p in self.run.model.parameters() if p.requires_grad]
            self.graphed = GraphedStep(
                lambda images, labels: self._step_body(forward, images, labels, params),
                self.optim.optimizer, self.device)
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

    def compile_record(self) -> dict[str, Any]:
        """The model file's record of torch.compile use (``training.compile``)."""
        return compile_record(self.cfg.compile, self.cfg.compile_mode, self.device, self.compiled)

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
        # compiled around DDP (torch's recipe: its optimiser splits the graph at the buckets)
        self.compiled = compiled_or_none(forward, self.cfg.compile, self.cfg.compile_mode, self.device)
        if self.compiled is not None:
            forward = self.compiled  # type: ignore[assignment]
            self.reporter.print(f"compile: the training forward is compiled by torch.compile "
                                f"(mode {self.compiled.mode}; the first steps compile it)")
        self._make_graphed_step(forward)
        interrupt_at = _interrupt_point()
        self.reporter.start()
        current_epoch = self.run.state.epoch
        try:
            for epoch in range(self.run.state.epoch, self.cfg.epochs):
                if budget_exhausted(self.cfg, self.run.state.elapsed):  # --time-budget spent (resume too)
                    break
                current_epoch = epoch
                sums, extra, train_time = self._train_epoch(epoch, forward, interrupt_at)
                record = self._epoch_record(epoch, sums, extra, train_time)
                self._validate(epoch, record)
                self._finish_epoch(epoch, record, int(sums[2]), train_time)
        except KeyboardInterrupt:
            self.reporter.stop()
            raise self.interrupted(self.run.state.epoch, f"during epoch {current_epoch + 1}") from None
        except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            if isinstance(exc, LipError) or not is_allocation_failure(exc):
                raise
            self.reporter.stop()
            raise self.out_of_memory() from None
        finally:
            self.reporter.stop()

    def _train_epoch(self, epoch: int, forward: nn.Module,
                     interrupt_at: tuple[int, int] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
        """One pass over this rank's training data, then the end-of-epoch power-iteration
        refresh and the loss's ``end_epoch``.  Returns the local sums (loss, correct, images),
        the summed loss parts (by name) and the time taken."""
        cfg, device = self.cfg, self.device
        seed = epoch_seed(cfg.seed, epoch, self.ctx.rank)
        torch.manual_seed(seed)
        self.loaders.train.generator.manual_seed(seed)
        self.loaders.sampler.set_epoch(epoch)
        self.run.model.train()
        self.optim.step_module.train()
        self.optim.step_module.begin_epoch(TrainProgress(epoch, cfg.epochs, self.run.state.step,
                                                         self.loaders.steps_per_epoch))
        self.reporter.epoch(epoch + 1, cfg.epochs, self.loaders.steps_per_epoch)
        params = [p for p in self.run.model.parameters() if p.requires_grad]
        check_every = 1 if device.type == "cpu" else 25
        mid_step = self.loaders.steps_per_epoch // 2
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        extra: dict[str, torch.Tensor] = {}
        t0 = time.perf_counter()
        compile_before = self.compiled.compile_s if self.compiled is not None else 0.0
        seen = 0
        for i, (images, labels) in enumerate(self.loaders.train):
            if interrupt_at is not None and interrupt_at == (epoch, i):
                raise KeyboardInterrupt
            self.at = ("training", epoch, i)
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
            if i == mid_step and self.loaders.steps_per_epoch > 1:
                self.at = ("refresh", epoch, i)
                self._refresh_power_iteration()
            if (i + 1) % check_every == 0 or i + 1 == self.loaders.steps_per_epoch:
                self.guard.read(sums[0], self.ctx, self.run)
                if self.reporter.progress is not None:
                    dt = max(time.perf_counter() - t0, 1e-9)
                    self.reporter.update(i + 1, float(sums[0] / sums[2]), float(sums[1] / sums[2]),
                                         seen * self.ctx.world_size / dt)
        self._report_graph_failure()
        self.at = ("refresh", epoch, self.loaders.steps_per_epoch)
        self._refresh_power_iteration()  # end of epoch: before evaluation and before the checkpoint
        self.optim.step_module.end_epoch()
        end_epoch = getattr(self.optim.optimizer, "end_epoch", None)  # e.g. a retraction (lipcli.sdk.optimizers)
        if callable(end_epoch):
            end_epoch()
        self.ctx.sync_module_state(self.optim.step_module.loss)
        if self.compiled is not None:
            self.epoch_compile_s = self.compiled.compile_s - compile_before
        return sums, extra, time.perf_counter() - t0

    def _optimizer_step(self, forward: nn.Module, images: torch.Tensor,
                        labels: torch.Tensor, params: list[nn.Parameter]) -> tuple[Any, Any, Any]:
        """zero_grad, then :meth:`_step_body` (replayed from a CUDA graph where one is used),
        then the scheduler step; returns the step module's (loss, logits, parts)."""
        with measuring(self.compiled):  # its compile seconds kept apart
            if self.graphed is not None:
                out = self.graphed(images, labels)
            else:
                self.optim.optimizer.zero_grad(set_to_none=True)
                out = self._step_body(forward, images, labels, params)
        self.optim.scheduler.step()
        self.run.state.step += 1
        return out

    def _step_body(self, forward: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   params: list[nn.Parameter]) -> tuple[Any, Any, Any]:
        """Forward (under autocast), backward, clip, optimiser step (no zero_grad, no
        scheduler step: the part a CUDA graph records); returns (loss, logits, parts)."""
        cfg, optimizer, scaler = self.cfg, self.optim.optimizer, self.optim.scaler
        with torch.autocast(self.device.type, dtype=self.optim.amp_dtype, enabled=cfg.amp):
            loss, logits, parts = forward(images, labels)
        scaler.scale(loss).backward()
        norm = None  # the clipping's total norm: non-finite exactly when some gradient is
        if cfg.grad_clip:
            scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        self.guard.before_step(params, loss, self.run, norm=norm)
        scaler.step(optimizer)
        scaler.update()
        # detached: a returned graph would keep the step's autograd graph (and, when it is
        # captured, the graph's gradient-accumulation nodes) alive between steps
        return loss.detach(), logits, parts

    def _refresh_power_iteration(self) -> None:
        """Advance the model's power iterations (where it has them); copy rank 0's state to all."""
        refresher = getattr(self.run.model, "refresh_power_iteration", None)
        if callable(refresher):
            refresher(self.cfg.power_iter_steps)
        self.ctx.sync_module_state(self.run.model)

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
            "lr": float(self.optim.optimizer.param_groups[0]["lr"]),
            "time_s": round(train_time, 3),
            "images_per_s": round(float(sums[2]) / max(train_time, 1e-9), 1),
        }
        for name in sorted(extra):
            record[f"train_{name}"] = float(extra[name] / sums[2])
        if self.compiled is not None:  # this rank's compile seconds, included in time_s
            record["compile_s"] = round(self.epoch_compile_s, 3)
            record["compile"] = self.compiled.mode
        return record

    def _validate(self, epoch: int, record: dict[str, Any]) -> None:
        """Add the validation loss and accuracy to ``record`` (where there is a validation set);
        with ``keep_best``, rank 0 saves a new best model."""
        if self.loaders.val is None:
            return
        self.at = ("validation", epoch, 0)

        val = evaluate(self.run.model, self.loaders.val, self.ctx)
        record["val_loss"], record["val_accuracy"] = val.loss, val.accuracy
        state = self.run.state
        if self.cfg.keep_best and (state.best is None or val.accuracy > state.best["val_accuracy"]):
            state.best = {"epoch": epoch + 1, "val_accuracy": val.accuracy}
            if self.ctx.is_main:
                save_model(self.run.model, self.run.settings.paths.best, dataset=self.run.data.info(),
                           training={"epoch": epoch + 1, "val_accuracy": val.accuracy})

    def _finish_epoch(self, epoch: int, record: dict[str, Any], images: int, train_time: float) -> None:
        """Count the epoch as done: update the progress, checkpoint, append to the log, print."""
        state = self.run.state
        state.epoch = epoch + 1
        state.elapsed += train_time
        state.images += images
        state.history.append(record)
        self.run.save_checkpoint()  # first: a log line never names an epoch no checkpoint holds
        if self.ctx.is_main:
            with open(self.run.settings.paths.log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        self.ctx.barrier()
        self.reporter.print(
            f"epoch {epoch + 1}/{self.cfg.epochs}  loss {record['train_loss']:.4f}  "
            f"acc {record['train_accuracy']:.4f}"
            + (f"  val {record['val_accuracy']:.4f}" if "val_accuracy" in record else "")
            + f"  lr {record['lr']:.3g}  {record['images_per_s']:.0f} img/s  {train_time:.1f}s"
            + (f" (compiling {record['compile_s']:.1f}s)" if record.get("compile_s") else "")
        )

    def interrupted(self, done: int, when: str, lost: bool = False) -> TrainingInterrupted | WorkerLost:
        """The error for a Ctrl-C ``when`` (e.g. "during epoch 3") with ``done`` epochs
        checkpointed, with the resume command (:mod:`lipcli.train.errors`); ``lost``: for a
        lost connection to another process of the run instead (exit 1)."""
        ctx = self.ctx
        run_dir = literal(self.run.settings.paths.run_dir)
        what = "another process of the run stopped (connection lost)" if lost else f"interrupted {when}"
        error = (WorkerLost if lost else TrainingInterrupted)(
            f"{what}; the checkpoint after epoch {done} is in {run_dir}; resume "
            f"with: {{command}} {{resume}} {run_dir}",
            launch=None if ctx.world_size == 1 else ctx.local_world_size, launcher=ctx.launcher,
        )
        error.silent = not ctx.is_main  # one message per run, from rank 0 (or the launcher)
        return error

    def out_of_memory(self, what: str | None = None) -> TrainingOutOfMemory:
        """The error for an allocation failure in the step :attr:`at` (``what``: another step,
        e.g. "test evaluation"): the step, the settings that size it, the checkpoint kept and
        how to go on (:mod:`lipcli.train.errors`)."""
        ctx, done = self.ctx, self.run.state.epoch
        kind, epoch, step = self.at
        run_dir = literal(self.run.settings.paths.run_dir)
        resume = f"{{command}} {{resume}} {run_dir}"
        evaluation = what is not None or kind == "validation"
        if what is None:
            what = {"training": f"training step {step + 1}", "refresh": "power-iteration refresh",
                    "validation": "validation"}[kind] + f" of epoch {epoch + 1}"
        if evaluation:
            sized = "{eval_batch_size} and {width}"
            advice = f"resume it with a lower {{eval_batch_size}}: `{resume} {{eval_batch_size}} N`"
        else:
            sized = "{batch_size}, {width} and the parameters of {conv} and the other components"
            advice = (f"resume it where more memory is free, `{resume}`, or start again with a lower "
                      "{batch_size} or {width} or smaller component parameters")
        return TrainingOutOfMemory(
            f"out of memory in the {literal(what)} (its memory grows with {sized}); the checkpoint after "
            f"epoch {done} is kept in {run_dir}: {advice}",
            launch=None if ctx.world_size == 1 else ctx.local_world_size, launcher=ctx.launcher,
        )
