"""The training driver behind ``lip train``: the paper's recipe, resumable, one or many processes.

Recipe (SPEC §6, reference defaults; every value is a :class:`TrainConfig` field):

* SGD, lr 0.1, momentum 0.9, weight decay 5e-4 on the SOC filters and the LLN weight only.
  Concretely: a parameter gets weight decay iff it has >= 2 dimensions (filters, weight
  matrices) and no module lists it in its ``no_weight_decay`` attribute (the MLP head lists
  all of its parameters, projection pooling its ``theta``); biases and angles are 1-D.
* ``MultiStepLR`` x0.1 at 50 % and 75 % of all iterations, stepped once per iteration.
* 200 epochs, batch 128 (the global batch: with N processes each takes 128/N), seed 0,
  random crop + flip (see :mod:`lipcli.builtins.datasets`), gradient-norm clipping as the
  loss's spec says (``LossSpec.grad_clip``).
* Power iteration of SOC layers: ``model.refresh_power_iteration(50)`` at the middle and at
  the end of every epoch (i.e. twice per epoch, and before every evaluation).

Losses (``lip_losses`` plugins, protocol in :mod:`lipcli.sdk.losses`): the ``loss`` setting
(``NAME:key=value``), by default the head's own (``HeadSpec.loss``).  A loss's ``recipe``
gives data-set dependent parameter defaults and its spec the default gradient clipping; the
built-in losses and their recipes are documented with their plugins (docs/plugins.md).
The trainer names no loss or head: it only calls the protocol
(:mod:`~lipcli.train.objective`).

Optimisers and schedules (:mod:`~lipcli.train.optim`): ``--optimizer sgd`` (the recipe's,
default) ``| adamw | nadam`` (``--betas``), ``--lookahead K`` (Lookahead every K steps),
``--schedule step`` (default) ``| cosine | triangular`` with ``--warmup-epochs``; the resolved choice is recorded in the model
file.  Extra training data (``--extra-data``, ``--extra-ratio``): :mod:`lipcli.train.extradata`
(reading and checking the arrays) and :mod:`~lipcli.train.mixing` (mixed batches).

Nothing is lost: a run directory holds ``config.json`` (resolved config), ``train_log.jsonl``
(one JSON object per epoch), ``checkpoint.safetensors`` (model, optimizer, scheduler, AMP
scaler, RNG states and the loss's state, all as tensors, plus JSON metadata; no pickle) written
atomically at the start and after every epoch, and ``best.safetensors`` (``keep_best``).
An existing model file or a finished run's directory is replaced only with ``overwrite``
(``--overwrite``); an unfinished run's directory is always refused (resume it instead).
``resume`` continues a killed or interrupted run from its last checkpoint; on one CPU
process it ends bit-identical to an uninterrupted run, because every epoch re-derives its
random state from ``(seed, epoch, rank)`` (:func:`lipcli.data.loaders.epoch_seed`).

Several processes (``lip train --nproc-per-node N``, or ``torchrun --nproc-per-node N -m lipcli
train ...``): DDP with NCCL on CUDA and gloo on CPU, a DistributedSampler, SOC buffers
broadcast from rank 0 after every refresh (and by DDP at every forward); only rank 0 writes
files and shows progress.  :func:`check_train` validates a run of N processes without
starting any, and :mod:`~lipcli.train.launch` starts the workers (:func:`launch_workers`).

Layout: :mod:`~lipcli.train.config` (:class:`TrainConfig`, settings files, file names),
:mod:`~lipcli.train.errors`, :mod:`~lipcli.train.distributed` (:class:`DistContext`),
:mod:`~lipcli.train.optim` (optimisers, schedules), :mod:`~lipcli.train.objective` (the loss
plumbing, :class:`TrainStep`), :mod:`~lipcli.train.checkpoint`,
:mod:`~lipcli.train.paths`, :mod:`~lipcli.train.reporting`, :mod:`~lipcli.train.evaluation`,
:mod:`~lipcli.train.driver` (:func:`train`: configuration and resume),
:mod:`~lipcli.train.run` (:class:`~lipcli.train.run.TrainingRun`: checkpoints and model file;
its parts in :mod:`~lipcli.train.parts`), :mod:`~lipcli.train.loop` (its epochs and steps;
non-finite steps stopped by :mod:`~lipcli.train.guard`),
:mod:`~lipcli.train.results`
(:class:`TrainSummary`, what :func:`train` returns) and :mod:`~lipcli.train.launch`
(worker processes started by lipcli).  Everything public is
re-exported here.  Errors name settings, never command-line options
(:mod:`~lipcli.train.errors`).
"""

from __future__ import annotations

from lipcli._util.lazy import callable_package, lazy_exports

#: public name -> submodule; imported on first use (PEP 562), so that ``lipcli.train.config``
#: (the CLI's defaults) loads without torch
_EXPORTS: dict[str, str] = {
    "flatten_state": "checkpoint",
    "read_checkpoint": "checkpoint",
    "rng_state": "checkpoint",
    "set_rng_state": "checkpoint",
    "unflatten_state": "checkpoint",
    "write_checkpoint": "checkpoint",
    "BEST_NAME": "config",
    "CHECKPOINT_FORMAT": "config",
    "CHECKPOINT_NAME": "config",
    "CHECKPOINT_VERSION": "config",
    "CONFIG_NAME": "config",
    "DEFAULT_EXTRA_RATIO": "config",
    "INTERRUPT_ENV": "config",
    "DEFAULT_NPROC_PER_NODE": "config",
    "LAUNCHER_ENV": "config",
    "LOG_NAME": "config",
    "loss_shortcut_names": "config",
    "MAX_CUDA_WORKERS": "config",
    "MODEL_NAME": "config",
    "OPTIMIZER_LR": "config",
    "SCHEDULES": "config",
    "TrainConfig": "config",
    "load_config_file": "config",
    "DistContext": "distributed",
    "TrainError": "errors",
    "TrainUsageError": "errors",
    "TrainingDiverged": "errors",
    "TrainingInterrupted": "errors",
    "evaluate": "evaluation",
    "lipschitz_record": "evaluation",
    "RESUME_CHANGEABLE": "driver",
    "check_train": "driver",
    "train": "driver",
    "LaunchResult": "launch",
    "launch_workers": "launch",
    "Evaluation": "results",
    "TrainSummary": "results",
    "TrainStep": "objective",
    "resolve_loss": "objective",
    "Lookahead": "optim",
    "make_optimizer": "optim",
    "make_schedule": "optim",
    "recipe_sgd": "optim",
    "weight_decay_groups": "optim",
    "RunPaths": "paths",
    "plan_paths": "paths",
    "Reporter": "reporting",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
#: ``lipcli.train(recipe=..., dataset=..., ...)``: the Python twin of ``lip train`` (:mod:`~lipcli.train.api`)
callable_package(__name__, "api", "run")


__all__ = sorted(_EXPORTS)  # the names above, listed once
