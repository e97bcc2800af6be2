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
An existing model file or a finished run's directory is replaced only with ``overwrite``
(``--overwrite``); an unfinished run's directory is always refused (resume it instead).
``resume`` continues a killed or interrupted run from its last checkpoint; on one CPU
process it ends bit-identical to an uninterrupted run, because every epoch re-derives its
random state from ``(seed, epoch, rank)`` (:func:`lipcli.data.epoch_seed`).

Several processes (``torchrun --nproc-per-node N -m lipcli train ...``): DDP with NCCL on
CUDA and gloo on CPU, a DistributedSampler, SOC buffers broadcast from rank 0 after every
refresh (and by DDP at every forward); only rank 0 writes files and shows progress.

Layout: :mod:`~lipcli.train.config` (:class:`TrainConfig`, settings files, file names),
:mod:`~lipcli.train.errors`, :mod:`~lipcli.train.distributed` (:class:`DistContext`),
:mod:`~lipcli.train.optim` (the recipe's SGD), :mod:`~lipcli.train.losses` (CE, CRC-Lip's
attack and curvature penalty, :class:`TrainStep`), :mod:`~lipcli.train.checkpoint`,
:mod:`~lipcli.train.paths`, :mod:`~lipcli.train.reporting`, :mod:`~lipcli.train.evaluation`
and :mod:`~lipcli.train.loop` (:func:`train`).  Everything public is re-exported here.
"""

from __future__ import annotations

from .checkpoint import (flatten_state, read_checkpoint, rng_state, set_rng_state, unflatten_state,
                         write_checkpoint)
from .config import (BEST_NAME, CHECKPOINT_FORMAT, CHECKPOINT_NAME, CHECKPOINT_VERSION, CONFIG_NAME,
                     CRC_CERTIFICATE, INTERRUPT_ENV, LOG_NAME, MODEL_NAME, PAPER_CRC_SETTINGS,
                     TrainConfig, load_config_file)
from .distributed import DistContext
from .errors import TrainingDiverged, TrainingInterrupted
from .evaluation import evaluate, lipschitz_record
from .loop import RESUME_CHANGEABLE, train
from .losses import CurvaturePenalty, FeatureAttack, TrainStep
from .optim import recipe_sgd, weight_decay_groups
from .paths import RunPaths, plan_paths
from .reporting import Reporter

__all__ = [
    # config
    "PAPER_CRC_SETTINGS", "CRC_CERTIFICATE", "CHECKPOINT_NAME", "LOG_NAME", "CONFIG_NAME",
    "BEST_NAME", "MODEL_NAME", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "INTERRUPT_ENV",
    "TrainConfig", "load_config_file",
    # errors
    "TrainingDiverged", "TrainingInterrupted",
    # distributed
    "DistContext",
    # optim
    "recipe_sgd", "weight_decay_groups",
    # losses
    "FeatureAttack", "CurvaturePenalty", "TrainStep",
    # checkpoint
    "flatten_state", "unflatten_state", "rng_state", "set_rng_state", "write_checkpoint",
    "read_checkpoint",
    # paths
    "RunPaths", "plan_paths",
    # reporting
    "Reporter",
    # evaluation
    "evaluate", "lipschitz_record",
    # loop
    "RESUME_CHANGEABLE", "train",
]
