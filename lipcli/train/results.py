"""Typed results of a training run: what :func:`lipcli.train.train` returns
(:class:`TrainSummary`) and what its evaluations measure (:class:`Evaluation`).

``summary.to_json()`` is the JSON that ``lip train --json`` prints (keys in field order; see
:mod:`lipcli._util.records`).  The records a run stores in its model file and checkpoint
(``training``, ``results``, ``lipschitz``, the epoch log) stay JSON dicts: they are the
files' serialisation format, read back by :mod:`lipcli.host.modelfile`, not driver results.
"""

from __future__ import annotations

from dataclasses import dataclass

from lipcli._util.records import JsonRecord


@dataclass(frozen=True)
class Evaluation:
    """Clean loss and accuracy over ``examples`` images (all processes' shards together)."""

    loss: float
    accuracy: float
    examples: int


@dataclass
class TrainSummary(JsonRecord):
    """A finished run (rank 0's view): where the model and run directory are, its test
    accuracy, Lipschitz numbers and throughput (``to_json()``: ``lip train --json``)."""

    model: str
    run_dir: str
    dataset: str
    epochs: int
    test_accuracy: float
    #: the last epoch's validation accuracy (``None`` without a validation split)
    val_accuracy: float | None
    #: the GUARANTEED bound stored in the model file
    lipschitz_upper_bound: float | None
    #: the power-method estimate (``None`` with ``lipschitz_estimate`` off)
    lipschitz_estimate: float | None
    time_s: float
    images_per_s: float
    device: str
    world_size: int
    #: the torch.compile mode of the training forward ("off": eager) and the seconds of the
    #: steps that compiled it, over the run's epochs (included in ``time_s``)
    compile: str = "off"
    compile_s: float = 0.0
