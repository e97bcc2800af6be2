"""One training run (:class:`TrainingRun`): built from the configured data and model, it
restores a checkpoint where it resumes, prepares its run directory, hands the epochs to
:class:`lipcli.train.loop.TrainingLoop`, then tests the selected weights and writes the model
file, its ``training`` record, the final checkpoint and the run's summary."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lipcli.version import __version__
from lipcli.train.budget import budget_record
from lipcli.sdk.errors import LipError, LipUsageError, is_allocation_failure
from lipcli.train.checkpoint import (_prefixed, flatten_state, rng_state, set_rng_state, unflatten_state,
                                     write_checkpoint)
from lipcli.train.config import CHECKPOINT_FORMAT, CHECKPOINT_VERSION, INTERRUPT_ENV
from lipcli.sdk.errors import NamedSettings
from lipcli.train.errors import TrainError, literal
from lipcli.train.evaluation import evaluate, lipschitz_record
from lipcli.train.guard import load_keeping_lr
from lipcli.host.locks import run_locks
from lipcli.train.distributed import lost_connection
from lipcli.train.loop import TrainingLoop
from lipcli.train.objective import loss_record
from lipcli.train.optim import optimization_record
from lipcli.train.parts import Loaders, Optimization, RunSettings
from lipcli.train.paths import check_replaceable
from lipcli.train.results import Evaluation, TrainSummary
from lipcli._util.safetext import clean
from lipcli.host.modelfile import atomic_write_bytes, read_model_file, tensors_fingerprint
from lipcli.host.models import save_model
from lipcli.lipschitz.promises import capture_inputs


@dataclass
class RunState:
    """The progress of a run (what its checkpoints record besides the tensors)."""

    epoch: int = 0
    step: int = 0
    elapsed: float = 0.0
    images: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    resumed_from: list[int] = field(default_factory=list)


@dataclass
class TrainingRun:
    """One training run: where and how it runs (``settings``), the data (``extra``: the extra
    training data or None), the model, its loaders and optimisation objects, and its progress
    (``state``; ``resumed`` when it continues a checkpoint)."""

    settings: RunSettings
    data: Any
    extra: Any
    model: nn.Module
    model_config: dict[str, Any]
    loaders: Loaders
    optim: Optimization
    state: RunState = field(default_factory=RunState)
    resumed: bool = False
    #: inputs of the promised layers recorded during the final test pass (promise check)
    promise_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def build(cls, settings: RunSettings, data: Any, model: nn.Module, model_config: dict[str, Any], *,
              loss: Any, extra: Any = None) -> TrainingRun:
        """Build the loaders, optimiser, scheduler, AMP scaler and the training loss for ``model``."""
        loaders = Loaders.build(settings, data, extra)
        optim = Optimization.build(settings, data, model, loss, loaders.steps_per_epoch)
        return cls(settings=settings, data=data, extra=extra, model=model, model_config=model_config,
                   loaders=loaders, optim=optim)

    def execute(self, ckpt_tensors: dict[str, torch.Tensor] | None,
                ckpt_meta: dict[str, Any] | None) -> TrainSummary | None:
        """Resume from the checkpoint if given, train the remaining epochs, write the model
        file; returns the summary (``None`` on ranks other than 0)."""
        if ckpt_tensors is not None:
            self.restore_checkpoint(ckpt_tensors, ckpt_meta)
        self.make_dirs()
        paths = self.settings.paths
        # one writer per run directory and model file for the whole run (lipcli.host.locks)
        with run_locks(paths.run_dir, paths.out, enabled=self.settings.ctx.is_main):
            self.create_run_dir()
            self.announce()
            loop = TrainingLoop(self)
            try:
                loop.train_epochs()
                try:
                    return self.finish(loop.graph_record(), loop.compile_record())
                except KeyboardInterrupt:
                    raise loop.interrupted(self.state.epoch, "after the last epoch") from None
                except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
                    if isinstance(exc, LipError) or not is_allocation_failure(exc):
                        raise
                    raise loop.out_of_memory("test evaluation of the trained model") from None
            except RuntimeError as exc:  # a collective failed: another process is gone
                if not (self.settings.ctx.initialized and lost_connection(exc)):
                    raise
                self.settings.reporter.stop()
                raise loop.interrupted(self.state.epoch, "", lost=True) from None

    # ---- before training --------------------------------------------------------------------
    def make_dirs(self) -> None:
        """Rank 0 creates the run and output directories."""
        paths = self.settings.paths
        if self.settings.ctx.is_main:
            try:
                paths.run_dir.mkdir(parents=True, exist_ok=True)
                paths.out.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LipError(f"cannot create {paths.run_dir}: {exc.strerror or exc}") from None

    def create_run_dir(self) -> None:
        """Rank 0 (holding the run's locks): a new run drops a stale log and best model and
        writes config.json and the epoch-0 checkpoint.  All ranks then wait."""
        paths, ctx = self.settings.paths, self.settings.ctx
        if ctx.is_main:
            if not self.resumed:
                for stale in (paths.log, paths.best):
                    if stale.exists():
                        stale.unlink()
                atomic_write_bytes(paths.config,
                                   (json.dumps(self.settings.cfg.to_json(), indent=2) + "\n").encode())
                self.save_checkpoint()
        ctx.barrier()

    def announce(self) -> None:
        """Print the run directory, the resume point, the resolved configuration and the data."""
        cfg, ctx, reporter = self.settings.cfg, self.settings.ctx, self.settings.reporter
        data, paths = self.data, self.settings.paths
        reporter.print(f"lip train: run directory {paths.run_dir} (model -> {paths.out})")
        if self.resumed:
            reporter.print(f"resuming after epoch {self.state.epoch} of {cfg.epochs}")
        reporter.print("resolved configuration: " + json.dumps(cfg.to_json(), sort_keys=False))
        reporter.print(
            f"data: {data.component.name} ({data.num_classes} classes; "
            + ", ".join(f"{k} {v}" for k, v in data.sizes.items())
            + f"); device {self.settings.device}"
            + (f" x {ctx.world_size} processes ({ctx.backend})" if ctx.distributed else "")
            + f"; {sum(p.numel() for p in self.model.parameters()):,} parameters"
        )

    # ---- checkpoints ------------------------------------------------------------------------
    def restore_checkpoint(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Load a checkpoint into the freshly built objects; check that it fits this run."""
        if meta.get("steps_per_epoch") != self.loaders.steps_per_epoch:
            raise LipUsageError(
                f"the checkpoint was made with {meta.get('steps_per_epoch')} steps per epoch but the "
                f"data now gives {self.loaders.steps_per_epoch}: the data set or the number of processes changed"
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
        load_keeping_lr(self.optim.optimizer, self.optim.scheduler,  # lr may change on resume
                        unflatten_state(meta["optimizer"], tensors), unflatten_state(meta["scheduler"], tensors))
        self.optim.scaler.load_state_dict(unflatten_state(meta["scaler"], tensors))
        loss_state = meta.get("loss", meta.get("curvature"))  # "curvature": before loss plugins
        if loss_state:
            self.optim.step_module.loss.load_state_dict(unflatten_state(loss_state, tensors))
        set_rng_state(unflatten_state(meta["rng"], tensors))
        self.state = RunState(
            epoch=int(meta["epoch"]), step=int(meta["step"]), elapsed=float(meta.get("elapsed_s", 0.0)),
            images=int(meta.get("images", 0)), history=list(meta.get("history") or []),
            best=meta.get("best"), resumed_from=list(meta.get("resumed_from") or []),
        )
        self.state.resumed_from.append(self.state.epoch)
        self.resumed = True

    def save_checkpoint(self, status: str = "running") -> None:
        """Rank 0 writes the checkpoint: model, optimiser, scheduler, scaler, RNG, loss state, progress."""
        if not self.settings.ctx.is_main:
            return
        state = self.state
        loss_state = dict(self.optim.step_module.loss.state_dict())
        tensors: dict[str, torch.Tensor] = {}
        for k, v in self.model.state_dict().items():
            tensors[f"model.{k}"] = v.detach().cpu().clone().contiguous()
        meta = {
            "format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
            "lipcli_version": __version__, "status": status,
            "epoch": state.epoch, "step": state.step, "steps_per_epoch": self.loaders.steps_per_epoch,
            "elapsed_s": state.elapsed, "images": state.images,
            "config": self.settings.cfg.to_json(), "model_config": self.model_config, "dataset": self.data.info(),
            "out": str(self.settings.paths.out.absolute()), "world_size": self.settings.ctx.world_size,
            "device": str(self.settings.device),
            "history": state.history, "best": state.best, "resumed_from": state.resumed_from,
            "extra_data": self._extra_record(),
            "optimizer": flatten_state(self.optim.optimizer.state_dict(), "optim", tensors),
            "scheduler": flatten_state(self.optim.scheduler.state_dict(), "sched", tensors),
            "scaler": flatten_state(self.optim.scaler.state_dict(), "scaler", tensors),
            "rng": flatten_state(rng_state(), "rng", tensors),
            "loss": flatten_state(loss_state, "loss", tensors) if loss_state else None,
        }
        write_checkpoint(self.settings.paths.checkpoint, tensors, meta)


    # ---- after training ---------------------------------------------------------------------
    def finish(self, graphs: dict[str, Any], compiled: dict[str, Any] | None = None) -> TrainSummary | None:
        """Test the selected weights; rank 0 writes the model file (``graphs``: its record of
        CUDA-graph use; ``compiled``: of torch.compile use) and the final checkpoint.  Returns the summary (``None`` on ranks
        other than 0)."""
        hook = os.environ.get(INTERRUPT_ENV, "").strip()
        if hook in ("end", "end-term"):  # testing hook: a real Ctrl-C, or a real SIGTERM
            import signal

            os.kill(os.getpid(), signal.SIGTERM if hook == "end-term" else signal.SIGINT)
        test, results = self._test_selected_model()
        summary = None
        if self.settings.ctx.is_main:
            summary = self._write_model(test, results, graphs, compiled)
        self.settings.ctx.barrier()
        return summary

    def _test_selected_model(self) -> tuple[Evaluation, dict[str, Any]]:
        """Load the selected weights and evaluate them on the test set; returns the evaluation
        and the model file's ``results``."""
        cfg, state = self.settings.cfg, self.state
        self.settings.ctx.check_consistent(self.model)
        if cfg.keep_best and state.best is not None:
            self.model.load_state_dict(read_model_file(self.settings.paths.best).tensors)
        self.model.eval()

        with capture_inputs(self.model) as inputs:  # for the promise check
            test = evaluate(self.model, self.loaders.test, self.settings.ctx)
        self.promise_inputs = inputs
        results: dict[str, Any] = {
            "test_accuracy": test.accuracy, "test_loss": test.loss, "test_examples": test.examples,
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

    def _training_metadata(self, graphs: dict[str, Any], compiled: dict[str, Any] | None = None) -> dict[str, Any]:
        """The model file's ``training`` record: time, throughput, settings, versions, history."""
        cfg, ctx, device, state = self.settings.cfg, self.settings.ctx, self.settings.device, self.state
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
            "workers": self.settings.workers,
            "amp_dtype": str(self.optim.amp_dtype).replace("torch.", "") if cfg.amp else None,
            "lipcli_version": __version__,
            "torch_version": torch.__version__,
            "weight_decay_parameters": self.optim.groups[0]["names"],
            "loss": loss_record(self.optim.loss_component, self.optim.step_module.loss),
            "optimization": optimization_record(cfg, self.optim.optimizer),
            "extra_data": self._extra_record(),
            "run_dir": str(self.settings.paths.run_dir),
            "resumed_from_epochs": state.resumed_from,
            "time_budget": budget_record(cfg, state),
            "cuda_graphs": graphs,
            **({} if compiled is None else {"compile": compiled}),
            "history": state.history,
        }

    def _extra_record(self) -> dict[str, Any] | None:
        return None if self.extra is None else self.extra.record(self.settings.cfg.extra_ratio)

    def _write_model(self, test: Evaluation, results: dict[str, Any], graphs: dict[str, Any],
                     compiled: dict[str, Any] | None = None) -> TrainSummary:
        """Rank 0: write the model file and the final checkpoint, print the result; returns the
        summary."""
        lipschitz = lipschitz_record(self.model, estimate=self.settings.cfg.lipschitz_estimate,
                                     inputs=self.promise_inputs)
        if lipschitz.get("promise_broken"):  # the weights are kept, without a guaranteed bound

            print(clean(f"warning: {lipschitz['promise_broken']}; the model file records no "
                        "Lipschitz bound"), file=sys.stderr)
        training = self._training_metadata(graphs, compiled)
        results = {**results, "weights_sha256": tensors_fingerprint(self.model.state_dict())}
        try:  # never replace a file that appeared meanwhile unless ``overwrite`` (and a model)
            check_replaceable(self.settings.paths.out, self.settings.overwrite)
            save_model(self.model, self.settings.paths.out, dataset=self.data.info(), lipschitz=lipschitz,
                       results=results, training=training)
        except LipError as exc:  # e.g. disk full: the run is not lost
            run_dir = literal(self.settings.paths.run_dir)
            first = exc.template if isinstance(exc, NamedSettings) else literal(exc)
            raise TrainError(
                f"{first}; the trained run is kept in {run_dir} (checkpoint after epoch "
                f"{self.state.epoch}): write the model with `{{command}} {{resume}} {run_dir} "
                "{out} OTHER.safetensors`"
            ) from None
        self.save_checkpoint(status="complete")
        summary = TrainSummary(
            model=str(self.settings.paths.out),
            run_dir=str(self.settings.paths.run_dir),
            dataset=self.data.component.name,
            epochs=self.state.epoch,
            test_accuracy=test.accuracy,
            val_accuracy=self._last_record().get("val_accuracy"),
            lipschitz_upper_bound=lipschitz.get("upper_bound"),
            lipschitz_estimate=lipschitz.get("estimate"),
            time_s=training["time_s"],
            images_per_s=training["images_per_s"],
            device=str(self.settings.device),
            world_size=self.settings.ctx.world_size,
            compile=(compiled or {}).get("mode", "off"),
            compile_s=sum(float(r.get("compile_s", 0.0)) for r in self.state.history),
        )
        self.settings.reporter.print(
            f"test accuracy {test.accuracy:.4f} ({test.examples} images); Lipschitz bound "
            f"{lipschitz.get('upper_bound') if not lipschitz.get('promise_broken') else 'none'}; "
            f"model written to {self.settings.paths.out}"
            + (f" (trained with torch.compile {summary.compile}: {summary.compile_s:.1f} s of the "
               f"{summary.time_s:.1f} s compiling)" if summary.compile != "off" else "")
        )
        return summary

