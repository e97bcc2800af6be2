"""What a training run writes: its checkpoints (save and restore), then the final model
file, its ``training`` record and the run's summary (:class:`RunOutputs`, the base of
:class:`lipcli.train.run.TrainingRun` that also declares the run's parts), and the progress
they record (:class:`RunState`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lipcli import __version__
from lipcli.sdk.errors import LipError, LipUsageError
from lipcli.train.checkpoint import (_prefixed, flatten_state, rng_state, set_rng_state, unflatten_state,
                                     write_checkpoint)
from lipcli.train.config import CHECKPOINT_FORMAT, CHECKPOINT_VERSION, INTERRUPT_ENV, TrainConfig
from lipcli.train.distributed import DistContext
from lipcli.train.errors import NamedSettings, TrainError, literal
from lipcli.train.evaluation import evaluate, lipschitz_record
from lipcli.train.objective import TrainStep, loss_record
from lipcli.train.optim import optimization_record
from lipcli.train.paths import RunPaths, check_replaceable
from lipcli.train.reporting import Reporter
from lipcli.train.results import Evaluation, TrainSummary


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
class RunOutputs:
    """A training run's parts (settings, data, model, training objects, progress) and the
    checkpoint and model-file half of its methods; :class:`lipcli.train.run.TrainingRun`
    adds the epochs and steps."""

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
    state: RunState = field(default_factory=RunState)
    resumed: bool = False
    overwrite: bool = False  # the final write may replace an existing model file
    #: inputs of the promised layers recorded during the final test pass (promise check)
    promise_inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    def graph_record(self) -> dict[str, Any]:  # pragma: no cover - TrainingRun's
        raise NotImplementedError

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
        self.state = RunState(
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


    # ---- after training ---------------------------------------------------------------------
    def finish(self) -> TrainSummary | None:
        """Test the selected weights; rank 0 writes the model file and the final checkpoint.
        Returns the summary (``None`` on ranks other than 0)."""
        if os.environ.get(INTERRUPT_ENV, "").strip() == "end":  # testing hook: a real Ctrl-C
            import signal

            os.kill(os.getpid(), signal.SIGINT)
        test, results = self._test_selected_model()
        summary = None
        if self.ctx.is_main:
            summary = self._write_model(test, results)
        self.ctx.barrier()
        return summary

    def _test_selected_model(self) -> tuple[Evaluation, dict[str, Any]]:
        """Load the selected weights and evaluate them on the test set; returns the evaluation
        and the model file's ``results``."""
        cfg, state = self.cfg, self.state
        self.ctx.check_consistent(self.model)
        if cfg.keep_best and state.best is not None:
            from lipcli.host.modelfile import read_model_file

            self.model.load_state_dict(read_model_file(self.paths.best).tensors)
        self.model.eval()
        from lipcli.host.promises import capture_inputs

        with capture_inputs(self.model) as inputs:  # for the promise check
            test = evaluate(self.model, self.test_loader, self.ctx)
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

    def _write_model(self, test: Evaluation, results: dict[str, Any]) -> TrainSummary:
        """Rank 0: write the model file and the final checkpoint, print the result; returns the
        summary."""
        from lipcli.host.models import save_model

        lipschitz = lipschitz_record(self.model, estimate=self.cfg.lipschitz_estimate,
                                     inputs=self.promise_inputs)
        if lipschitz.get("promise_broken"):  # the weights are kept, without a guaranteed bound
            from lipcli.host.safetext import clean  # printed even with quiet: it is a warning

            print(clean(f"warning: {lipschitz['promise_broken']}; the model file records no "
                        "Lipschitz bound"), file=sys.stderr)
        training = self._training_metadata()
        from lipcli.host.modelfile import tensors_fingerprint

        results = {**results, "weights_sha256": tensors_fingerprint(self.model.state_dict())}
        try:  # never replace a file that appeared meanwhile unless ``overwrite`` (and a model)
            check_replaceable(self.paths.out, self.overwrite)
            save_model(self.model, self.paths.out, dataset=self.data.info(), lipschitz=lipschitz,
                       results=results, training=training)
        except LipError as exc:  # e.g. disk full: the run is not lost
            run_dir = literal(self.paths.run_dir)
            first = exc.template if isinstance(exc, NamedSettings) else literal(exc)
            raise TrainError(
                f"{first}; the trained run is kept in {run_dir} (checkpoint after epoch "
                f"{self.state.epoch}): write the model with `{{command}} {{resume}} {run_dir} "
                "{out} OTHER.safetensors`"
            ) from None
        self.save_checkpoint(status="complete")
        summary = TrainSummary(
            model=str(self.paths.out),
            run_dir=str(self.paths.run_dir),
            dataset=self.data.component.name,
            epochs=self.state.epoch,
            test_accuracy=test.accuracy,
            val_accuracy=self._last_record().get("val_accuracy"),
            lipschitz_upper_bound=lipschitz.get("upper_bound"),
            lipschitz_estimate=lipschitz.get("estimate"),
            time_s=training["time_s"],
            images_per_s=training["images_per_s"],
            device=str(self.device),
            world_size=self.ctx.world_size,
        )
        self.reporter.print(
            f"test accuracy {test.accuracy:.4f} ({test.examples} images); Lipschitz bound "
            f"{lipschitz.get('upper_bound') if not lipschitz.get('promise_broken') else 'none'}; "
            f"model written to {self.paths.out}"
        )
        return summary

