"""What a certification run does (:class:`CertifyOptions`, defaults written once) and the
parsing of radii lists; every bad value is a :class:`~lipcli.sdk.errors.SettingError` naming
the option's field (front ends add their own spelling of it)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from lipcli._util.constants import COMPILE_MODES
from lipcli.host.settings import problems, setting
from lipcli.lowering.caps import check_dense_max_mib, describe_certify_default
from lipcli.sdk.errors import SettingError, render_template, template_fields
from lipcli.sdk.lowering_costs import BUILD_FLOP_WEIGHT, DENSE_MIN_GAIN

LIPSCHITZ_METHODS = ("bound", "estimate")
#: the largest value of each sized setting (inputs per batch, power iterations, PGD steps
#: and restarts): memory and time grow with them
SETTING_MAXIMA = {"batch_size": 65_536, "lipschitz_iters": 100_000, "attack_steps": 10_000,
                  "attack_restarts": 1000}
#: help of ``dense_max_mib``
DENSE_HELP = (
    "Largest dense matrix per layer of the eval lowering, MiB of float32 (default: "
    f"{describe_certify_default()}): a layer whose matrix fits and is at least "
    f"{DENSE_MIN_GAIN:g}x cheaper per input runs as that matrix (the bound covers it) when "
    "the operations it saves on this run's inputs (the {attack} check: on its own passes) exceed "
    f"{BUILD_FLOP_WEIGHT}x those of building it in float64; 0: every layer literal."
)
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


_C = "certify"


@dataclass
class CertifyOptions:
    """What :func:`lipcli.certify.run_certification` does: ``lip certify``'s settings, each
    declared once (:func:`lipcli.host.settings.setting`; options, help and range checks are
    derived from the declarations)."""

    radii: list[float] = field(default_factory=lambda: parse_radii(DEFAULT_RADII))
    radius_unit: float = setting(255.0, "Divisor for plain radii: 255 (pixel levels, the paper's convention) "
                                 "or 1 (absolute, e.g. 0.14).", owner=_C, min=0.0, min_open=True)
    dataset: str | None = setting(None, "Data set NAME[:key=value,...] (default: the one recorded in the "
                                  "model file).", owner="data")
    data_dir: str | None = setting(None, "Data set root directory.", owner="data", cli=False)
    download: bool = setting(False, "Download a missing CIFAR-10/100.", owner="data", cli=False)
    split: str = setting("test", "Data set split to certify.", owner="data")
    limit: int | None = setting(None, "Only N points of the split: a seeded subset stratified by class, the "
                                "same for every model and the one `lip train` evaluates with {limit_test} N.",
                                owner="data", min=1)
    batch_size: int = setting(256, "Batch size for features, certificates and attacks.", owner=_C, min=1,
                              max=SETTING_MAXIMA["batch_size"])
    device: str = setting("auto", "Device.", owner="run", cli=False)
    lipschitz: str = setting("bound", "bound: GUARANTEED upper bound of Lip(g) (default, sound). estimate: the "
                             "paper's product of power-method estimates (NOT guaranteed; output is labelled).",
                             owner=_C, choices=LIPSCHITZ_METHODS)
    lipschitz_iters: int = setting(50, "Power iterations for {lipschitz} estimate.", owner=_C, min=1,
                                   max=SETTING_MAXIMA["lipschitz_iters"])
    top_k: int | None = setting(None, "Only check the K highest other logits (reference heuristic; NOT sound "
                                "unless K >= classes-1; labelled).", owner=_C, min=1)
    attack: bool = setting(False, "PGD-attack every certified point at each radius (a success is a "
                           "soundness violation: exit 1) and report empirical robust accuracy.", owner=_C)
    attack_steps: int = setting(100, "PGD steps per restart.", owner=_C, min=1,
                                max=SETTING_MAXIMA["attack_steps"])
    attack_restarts: int = setting(2, "PGD restarts.", owner=_C, min=1, max=SETTING_MAXIMA["attack_restarts"])
    write: bool = True
    seed: int = 0
    ignore_class_names: bool = setting(False, "Certify even if the data set's class names differ from those "
                                       "recorded in the model file (by default that is refused: same class "
                                       "count, different data).", owner=_C)
    #: run every layer in its literal form (no dense eval lowering), for comparison
    series: bool = setting(False, "Run every layer in its literal form (e.g. SOC's 15-term series) instead "
                           "of the eval lowering (a layer whose fixed linear map is cheaper as one dense "
                           "matrix on this input size runs as that matrix; the bound covers it). For "
                           "comparison.", owner=_C)
    #: per-layer cap of the dense eval lowering, MiB of float32 (None, the default: the
    #: device's, :data:`lipcli.lowering.caps.CERTIFY_DENSE_MAX_MIB`; 0: no dense layer).
    #: Within the cap a layer is lowered only where its build pays off on this run's inputs
    #: (:meth:`eval_inputs`, :func:`lipcli.sdk.lowering.pays_off`)
    dense_max_mib: float | None = setting(None, DENSE_HELP, owner=_C)  # checked by check_dense_max_mib
    #: features, logits and margins in float64 on a float64 copy of the model, every layer
    #: literal (:mod:`lipcli.certify.exact`)
    exact: bool = setting(False, "Compute the features, logits and margins in float64 on a float64 copy of "
                          "the model, every layer literal (no dense lowering): radii free of float32 "
                          "rounding, for reference (slower). Recorded in the summary ('exact').", owner=_C)
    #: torch.compile the feature pass (None: per device, lipcli.compiling.AUTO_COMPILE)
    compile: bool | None = setting(None, "torch.compile the feature pass (radii from the stored weights as "
                                   "always; not with {exact}). Default: per device (eager).", owner=_C,
                                   negative=True)
    compile_mode: str = setting("default", "torch.compile mode with {compile}.", owner=_C,
                                choices=COMPILE_MODES)

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
        for problem in problems(self):
            name = template_fields(problem)[0]
            raise SettingError(name, render_template(problem, str))
        if not self.radii:
            raise SettingError("radii", "no radii given")
        check_dense_max_mib(self.dense_max_mib, default_allowed=True)
        if self.compile and self.exact:
            raise SettingError("compile", "exact evaluates the literal float64 network eagerly; "
                                          "compile does not apply to it")
