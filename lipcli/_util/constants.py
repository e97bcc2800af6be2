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
#: default cap (MiB of float32 per layer matrix) of the eval lowering
#: (:mod:`lipcli.lipschitz.lowered`), per device type.  LipConvnet-20 at width 32 (8.13 GFLOP
#: per input literal, torch's flop counter): 64 MiB would lower the layers on 4×4 and smaller
#: images, 256 MiB the 8×8 ones too (4.67 G; 1 GiB of float32 matrices).  The
#: cap only bounds memory: whether a layer's build pays off on the run's inputs is
#: :func:`lipcli.sdk.lowering.pays_off`'s decision (on a 2-core CPU the 8×8 layers' float64
#: build takes minutes, so ``lip certify`` lowers them only on long runs).
DENSE_MAX_MIB_DEFAULT: dict[str, float] = {"cpu": 256.0, "cuda": 256.0}
#: the cap for a device type not listed in :data:`DENSE_MAX_MIB_DEFAULT`
DENSE_MAX_MIB_OTHER = 32.0


def describe_dense_max_mib_default() -> str:
    """``"256 MiB on cpu and cuda, 32 MiB elsewhere"`` (for help texts; device types with the
    same cap share one entry)."""
    kinds: dict[float, list[str]] = {}
    for kind, mib in DENSE_MAX_MIB_DEFAULT.items():
        kinds.setdefault(mib, []).append(kind)
    listed = ", ".join(f"{mib:g} MiB on {' and '.join(names)}" for mib, names in kinds.items())
    return f"{listed}, {DENSE_MAX_MIB_OTHER:g} MiB elsewhere"
