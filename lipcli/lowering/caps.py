"""The one setting of the eval lowering, ``dense_max_mib``: its two defaults, its one check and
its conversion to bytes (no torch: options and help texts read them).

``dense_max_mib`` caps, per layer, the float32 matrix (MiB) that a layer with a fixed linear
map may run as instead of its literal form (0: every layer literal).  The cap only bounds
memory; whether the matrix is cheaper per input and its build pays off is the layer's
decision (:func:`lipcli.sdk.lowering.dense_lowering`, :func:`lipcli.sdk.lowering.pays_off`).
"""

from __future__ import annotations

import math

from lipcli.sdk.errors import SettingError

#: the name of the setting in every driver's options and in its errors
#: (``lip certify``, ``lip bench certify`` and ``lip export`` spell it ``--dense-max-mib``)
SETTING = "dense_max_mib"

#: ``lip export``'s default cap (MiB per layer, :class:`lipcli.export.options.ExportOptions`)
EXPORT_DENSE_MAX_MIB = 32.0

#: the default cap of lipcli's own eval runs (``lip certify``, ``lip bench certify``,
#: ``lip lipschitz --empirical``, :func:`lipcli.lowering.network.lowered_network`), per
#: device type.  LipConvnet-20 at width 32 (8.13 GFLOP per input literal, torch's flop
#: counter): 64 MiB would lower the layers on 4×4 and smaller images, 256 MiB the 8×8 ones
#: too (4.67 G; 1 GiB of float32 matrices).  On a 2-core CPU the 8×8 layers' float64 build
#: takes minutes, so ``lip certify`` lowers them only on long runs (``pays_off``).
CERTIFY_DENSE_MAX_MIB: dict[str, float] = {"cpu": 256.0, "cuda": 256.0}
#: the cap for a device type not listed in :data:`CERTIFY_DENSE_MAX_MIB`
CERTIFY_DENSE_MAX_MIB_OTHER = 32.0


def certify_dense_max_mib(device_type: str) -> float:
    """The default cap of lipcli's own eval runs on a device of type ``device_type``
    (``"cpu"``, ``"cuda"``, ...)."""
    return CERTIFY_DENSE_MAX_MIB.get(device_type, CERTIFY_DENSE_MAX_MIB_OTHER)


def describe_certify_default() -> str:
    """``"256 MiB on cpu and cuda, 32 MiB elsewhere"`` (for help texts; device types with the
    same cap share one entry)."""
    kinds: dict[float, list[str]] = {}
    for kind, mib in CERTIFY_DENSE_MAX_MIB.items():
        kinds.setdefault(mib, []).append(kind)
    listed = ", ".join(f"{mib:g} MiB on {' and '.join(names)}" for mib, names in kinds.items())
    return f"{listed}, {CERTIFY_DENSE_MAX_MIB_OTHER:g} MiB elsewhere"


def check_dense_max_mib(value: float | None, *, default_allowed: bool = False) -> None:
    """The one check of the setting: a finite number of MiB ``>= 0`` (``None`` too where
    ``default_allowed``: the device's default).  Else a :class:`SettingError` naming
    :data:`SETTING` (exit 2)."""
    if value is None and default_allowed:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        raise SettingError(SETTING, f"{SETTING} must be a finite number of MiB >= 0 (the largest "
                           f"dense matrix per layer of the eval lowering), got {value!r}")


def dense_max_bytes(mib: float) -> int:
    """The cap in bytes (what :class:`lipcli.sdk.lowering.LoweringContext` carries), checked."""
    check_dense_max_mib(mib)
    return int(mib * 2**20)
