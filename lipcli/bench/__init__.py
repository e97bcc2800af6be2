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

from lipcli._util.lazy import lazy_exports

#: public name -> module defining it, imported on first use (PEP 562): ``lip bench --help``
#: reads :mod:`lipcli.bench.options` without importing torch
_EXPORTS: dict[str, str] = {
    "bench_certify": "certify",
    "fit_head": "certify",
    "resolve_device": "lipcli._util.devices",
    "DEFAULT_DEPTHS": "inputs",
    "Progress": "inputs",
    "environment": "inputs",
    "parse_archs": "inputs",
    "soc_layers": "inputs",
    "EXACT_CONV": "models",
    "FAST_CONV": "models",
    "build_model": "models",
    "build_twins": "models",
    "count_parameters": "models",
    "state_dicts_identical": "models",
    "CIFAR_SHAPE": "step",
    "EPOCH_IMAGES": "step",
    "RECIPE_LR": "step",
    "RECIPE_MOMENTUM": "step",
    "RECIPE_WEIGHT_DECAY": "step",
    "RecipeStep": "step",
    "recipe_optimizer": "step",
    "synthetic_batch": "step",
    "SavedTensorMeter": "memory",
    "measure_step_memory": "memory",
    "CATEGORY_LABELS": "profile",
    "attribute_kernels": "profile",
    "bench_profile": "profile",
    "classify_event": "profile",
    "CertifyBenchReport": "reports",
    "ComponentBenchReport": "reports",
    "Environment": "reports",
    "HeadFit": "reports",
    "ProfileReport": "reports",
    "StepMemory": "reports",
    "Table1Row": "reports",
    "TrainBenchReport": "reports",
    "bench_train": "table1",
    "bench_train_arch": "table1",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
