"""Measurement logic behind ``lip bench`` (paper Table 1, certification throughput, profile).

Everything here *measures*; nothing is cached, guessed or hard-coded.  Every number a
function returns was timed in the call that returns it, on synthetic inputs of the data
set's shape (CIFAR: ``3 x 32 x 32`` images in ``[0, 1]``, uniform random labels), so no data
set is needed.  Weights are random (freshly initialised) unless a model file is given.

Three measurements:

``train`` (paper Table 1, SPEC §1.5-§1.6 and §6)
    For each architecture one model with the fast-gradient SOC (``soc-fast``, paper §4,
    eq. 4) and one with plain autograd through the Horner series (``soc``) are built from the
    SAME weights (the exact model loads the fast model's ``state_dict``; equality of every
    tensor is checked and reported).  One *training step* is ``zero_grad`` + forward +
    cross-entropy + backward + the recipe's SGD step (lr 0.1, momentum 0.9, weight decay
    5e-4 on SOC filters and the LLN weight only: SPEC §6).  The two models run
    **interleaved**: in round ``i`` both take a step on the same batch, the order alternating
    between rounds, so that machine noise (other processes, thermal state) hits both alike.
    Reported: median step time, the implied time per CIFAR-10 epoch
    ``median * ceil(50000 / batch)`` (data loading excluded), images/s ``= batch / median``,
    the reduction ``1 - fast/exact`` in %, both from the medians and as the median of the
    per-round ratios, and the peak memory of one step (see :func:`measure_step_memory`).

``certify`` (SPEC §4-§5)
    Inputs/s of feature extraction (eval mode, evaluation terms), of every certificate
    method applicable to the head (its spec's ``certificate``; optionally also with
    ``top_k``), and the time of the GUARANTEED Lipschitz bound and of the power estimate
    (:func:`lipcli.lipschitz.report.lipschitz_report`).

``profile``
    :mod:`torch.profiler` over a few training steps; every operator's *self* time is put in
    one category, convolution first: an operator is "convolution" when it, or any operator
    it was called from, is a convolution op (``aten::conv2d``, ``aten::convolution``,
    ``aten::convolution_backward``, ``aten::mkldnn_convolution``, ``aten::cudnn_convolution``,
    the fused ``mkldnn::_convolution_pointwise``...) or runs inside a SOC layer's
    ``lipcli::soc_convolution`` range.  On CUDA, each kernel's time is attributed once,
    through the operator that launched it.

Modules, by job: :mod:`.inputs` (architecture parsing, step-benchmark settings, the
environment report), :mod:`.models` (fresh models, the fast/exact twins), :mod:`.step` (the
recipe training step, synthetic batches, timing), :mod:`.memory` (peak memory of a step),
:mod:`.table1` (``lip bench train``), :mod:`.compare` (``lip bench train`` with component
lists), :mod:`.certify` (``lip bench certify``), :mod:`.profile` (``lip bench profile``;
its report's tables: :mod:`.profile_report`) and
:mod:`.reports` (the reports they return, one module per command:
:class:`TrainBenchReport`, :class:`ComponentBenchReport`, :class:`CertifyBenchReport`,
:class:`ProfileReport`; ``report.to_json()`` is what ``--json`` prints).
"""

from lipcli.bench.certify import bench_certify, fit_head
from lipcli._util.devices import resolve_device
from lipcli.bench.inputs import DEFAULT_DEPTHS, Progress, environment, parse_archs, soc_layers
from lipcli.bench.models import (
    EXACT_CONV,
    FAST_CONV,
    build_model,
    build_twins,
    count_parameters,
    state_dicts_identical,
)
from lipcli.bench.step import (
    CIFAR_SHAPE,
    EPOCH_IMAGES,
    RECIPE_LR,
    RECIPE_MOMENTUM,
    RECIPE_WEIGHT_DECAY,
    RecipeStep,
    recipe_optimizer,
    synthetic_batch,
)
from lipcli.bench.memory import SavedTensorMeter, measure_step_memory
from lipcli.bench.profile import CATEGORY_LABELS, attribute_kernels, bench_profile, classify_event
from lipcli.bench.reports import (
    CertifyBenchReport,
    ComponentBenchReport,
    Environment,
    HeadFit,
    ProfileReport,
    StepMemory,
    Table1Row,
    TrainBenchReport,
)
from lipcli.bench.table1 import bench_train, bench_train_arch

__all__ = [
    "CATEGORY_LABELS",
    "CIFAR_SHAPE",
    "CertifyBenchReport",
    "ComponentBenchReport",
    "Environment",
    "HeadFit",
    "ProfileReport",
    "StepMemory",
    "Table1Row",
    "TrainBenchReport",
    "DEFAULT_DEPTHS",
    "EPOCH_IMAGES",
    "EXACT_CONV",
    "FAST_CONV",
    "RECIPE_LR",
    "RECIPE_MOMENTUM",
    "RECIPE_WEIGHT_DECAY",
    "Progress",
    "SavedTensorMeter",
    "RecipeStep",
    "attribute_kernels",
    "bench_certify",
    "bench_profile",
    "bench_train",
    "bench_train_arch",
    "build_model",
    "build_twins",
    "classify_event",
    "count_parameters",
    "environment",
    "fit_head",
    "measure_step_memory",
    "parse_archs",
    "recipe_optimizer",
    "resolve_device",
    "soc_layers",
    "state_dicts_identical",
    "synthetic_batch",
]
