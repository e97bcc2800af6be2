"""Neutral constants shared by the host, the built-ins and the drivers (no torch, no plugin
imports): the paper's data statistics and shapes.

The datasets built-in (:mod:`lipcli.builtins.datasets`) normalises CIFAR with these
statistics; the host (:func:`lipcli.host.models.make_config`) and the LipConvnet built-in use
them as the default input normalisation of a model built without data-set statistics;
``lip bench`` (:mod:`lipcli.bench.step`) times steps on inputs of :data:`CIFAR_SHAPE`.
"""

from __future__ import annotations

#: CIFAR-10 statistics used by the paper, also for CIFAR-100; the reference uses one std for
#: every channel (SPEC §2).  The default input normalisation of every LipConvnet.
CIFAR_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR_STD: tuple[float, float, float] = (0.2507, 0.2507, 0.2507)
#: input shape ``(C, H, W)`` of the CIFAR data sets
CIFAR_SHAPE: tuple[int, int, int] = (3, 32, 32)
#: images in one CIFAR-10 / CIFAR-100 training epoch
CIFAR_TRAIN_IMAGES = 50_000
#: the most classes a model file may have (:mod:`lipcli.host.modelcheck`; bench sizes too)
MAX_CLASSES = 100_000
#: torch.compile modes (``--compile-mode``; :mod:`lipcli.compiling`), and those that replay CUDA
#: graphs themselves
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
GRAPHING_MODES = ("reduce-overhead", "max-autotune")
