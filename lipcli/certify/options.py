"""What a certification run does (:class:`CertifyOptions`, defaults written once) and the
parsing of radii lists; every bad value is a :class:`~lipcli.sdk.errors.SettingError` naming
the option's field (front ends add their own spelling of it)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from lipcli.lowering.caps import check_dense_max_mib
from lipcli.sdk.errors import SettingError

LIPSCHITZ_METHODS = ("bound", "estimate")
#: the largest value of each sized setting (inputs per batch, power iterations, PGD steps
#: and restarts): memory and time grow with them
SETTING_MAXIMA = {"batch_size": 65_536, "lipschitz_iters": 100_000, "attack_steps": 10_000,
                  "attack_restarts": 1000}
#: the default radii, in units of 1/``radius_unit`` (the paper's 36/255, 72/255, 108/255)
DEFAULT_RADII = "36,72,108"

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def parse_radii(text: str, unit: float = 255.0) -> list[float]:
    """Parse a radii list into absolute input-space l2 radii (sorted, unique).

    Items are comma separated. A plain number ``v`` means ``v / unit`` (``unit`` 255: pixel
    levels, so ``36`` -> ``36/255``; ``unit`` 1: absolute, ``0.14``). An item ``a/b`` is the
    absolute radius ``a / b`` whatever the unit (``36/255``). Radii must be finite and
    ``>= 0``. Raises :class:`SettingError` (``radii``/``radius_unit``) with the offending item.
    """
    if not math.isfinite(unit) or unit <= 0:
        raise SettingError("radius_unit", f"the radius unit must be a positive number, got {unit!r}")
    items = [item.strip() for item in (text or "").split(",")]
    if not any(items):
        raise SettingError("radii", "the radii list is empty; give comma-separated radii such as 36,72,108")
    out: list[float] = []
    for item in items:
        if not item:
            raise SettingError("radii", f"radii {text!r} have an empty item")
        num, slash, den = item.partition("/")
        try:
            if not _NUMBER.match(num.strip()) or (slash and not _NUMBER.match(den.strip())):
                raise ValueError
            value = float(num) / (float(den) if slash else unit)
        except (ValueError, ZeroDivisionError):
            raise SettingError(
                "radii", f"bad radius {item!r} in radii {text!r}; use numbers like 36 or fractions like 36/255"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise SettingError("radii", f"radius {item!r} must be finite and >= 0")
        out.append(value)
    return sorted(set(out))


@dataclass
class CertifyOptions:
    """What :func:`lipcli.certify.run_certification` does (``lip certify``'s options and
    their defaults, read by its help)."""

    radii: list[float] = field(default_factory=lambda: parse_radii(DEFAULT_RADII))
    radius_unit: float = 255.0
    dataset: str | None = None
    data_dir: str | None = None
    download: bool = False
    split: str = "test"
    limit: int | None = None
    batch_size: int = 256
    device: str = "auto"
    lipschitz: str = "bound"
    lipschitz_iters: int = 50
    top_k: int | None = None
    attack: bool = False
    attack_steps: int = 100
    attack_restarts: int = 2
    write: bool = True
    seed: int = 0
    ignore_class_names: bool = False
    #: run every layer in its literal form (no dense eval lowering), for comparison
    series: bool = False
    #: per-layer cap of the dense eval lowering, MiB of float32 (None, the default: the
    #: device's, :data:`lipcli.lowering.caps.CERTIFY_DENSE_MAX_MIB`; 0: no dense layer).
    #: Within the cap a layer is lowered only where its build pays off on this run's inputs
    #: (:meth:`eval_inputs`, :func:`lipcli.sdk.lowering.pays_off`)
    dense_max_mib: float | None = None
    #: features, logits and margins in float64 on a float64 copy of the model, every layer
    #: literal (:mod:`lipcli.certify.exact`)
    exact: bool = False
    #: torch.compile the feature pass: True, False or None (per device,
    #: :data:`lipcli.compiling.AUTO_COMPILE`); ``compile_mode``: the torch.compile mode
    compile: bool | None = None
    compile_mode: str = "default"

    def eval_inputs(self, n: int) -> int:
        """The forward passes the features make through the eval lowering on ``n`` inputs
        (``n``): whether a layer runs lowered, and so the radii, does not depend on the
        attack, whose network is lowered for its own passes (:meth:`attack_inputs`)."""
        return int(n)

    def attack_inputs(self, n: int) -> int:
        """The forward passes of the PGD check on ``n`` inputs: ``3·steps·restarts`` per
        input (one forward and one backward, about two forwards, per PGD step)."""
        return int(n) * 3 * self.attack_steps * self.attack_restarts

    def check(self) -> None:
        """Bad values (before any work): :class:`SettingError` naming the field."""
        if self.lipschitz not in LIPSCHITZ_METHODS:
            raise SettingError(
                "lipschitz", f"the Lipschitz method must be one of {', '.join(LIPSCHITZ_METHODS)}"
            )
        for name in ("batch_size", "limit", "top_k", "lipschitz_iters") + (
            ("attack_steps", "attack_restarts") if self.attack else ()
        ):
            value, most = getattr(self, name), SETTING_MAXIMA.get(name)
            if value is not None and value < 1:
                raise SettingError(name, f"{name} must be >= 1, got {value}")
            if value is not None and most is not None and value > most:
                raise SettingError(name, f"{name} must be in 1..{most}, got {value}")
        if not self.radii:
            raise SettingError("radii", "no radii given")
        check_dense_max_mib(self.dense_max_mib, default_allowed=True)
        from lipcli.compiling import COMPILE_MODES  # lazy: imports torch

        if self.compile_mode not in COMPILE_MODES:
            raise SettingError("compile_mode", f"compile_mode must be one of {', '.join(COMPILE_MODES)}, "
                                               f"got {self.compile_mode!r}")
        if self.compile and self.exact:
            raise SettingError("compile", "exact evaluates the literal float64 network eagerly; "
                                          "compile does not apply to it")
