"""Every parameter of the ``crc-lip`` certificate, with its default and help written once.

:class:`CRCSettings` is read by the certificate spec (its ``Param`` list, hence
``lip certify``/``lip info`` and their help), by :class:`~lipcli.builtins.crc.certifier.
CRCCertifier` (its keyword defaults) and by the dual solver (:func:`~lipcli.builtins.crc.dual.
solve_dual`).  None of these parameters can make a certificate unsound: they trade time for
tightness, except ``trust_cache`` (see its help).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from lipcli.sdk.specs import Param

CURVATURE_LEVELS = ("lazy", "exact", "global")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _param(default: Any, help: str, choices: tuple[Any, ...] | None = None, **limits: Any) -> Any:
    """A field with its help, choices and range (``min``, ``max``, ``min_open``, ``max_open``:
    the :class:`~lipcli.sdk.specs.Param` fields)."""
    return field(default=default, metadata={"help": help, "choices": choices, "limits": limits})


#: a tolerance or fraction in (0, 1)
_FRACTION = {"min": 0.0, "min_open": True, "max": 1.0}


@dataclass(frozen=True)
class CRCSettings:
    """Parameters of the CRC-Lip certifier (module docstring)."""

    curvature: str = _param(
        "lazy",
        "curvature bounds: class-split + exact where they decide a radius (lazy), "
        "exact for all pairs up front, or global only",
        CURVATURE_LEVELS,
    )
    dual: bool = _param(True, "run the dual (CRC) solve, not only the closed form")
    grad_tol: float = _param(1e-6, "inner gradient norm required for a dual certificate", **_FRACTION)
    dual_rtol: float = _param(1e-7, "relative tolerance of the η search (dual value)", **_FRACTION)
    boundary: float = _param(1e-3, "τ: η <= (1-τ)/m keeps the inner problem τ-strongly convex",
                             min=0.0, min_open=True, max=1.0, max_open=True)
    max_iter: int = _param(40, "Newton iterations per pair", min=1, max=10_000)
    cg_rtol: float = _param(1e-4, "relative residual of each CG solve", **_FRACTION)
    cg_max_iter: int = _param(200, "CG iterations per Newton step", min=1, max=100_000)
    solver_dtype: str = _param(
        "float32",
        "precision of CG search directions (certificates are always float64)",
        tuple(_DTYPES),
    )
    chunk_size: int = _param(256, "inputs certified together", min=1, max=65_536)
    trust_cache: bool = _param(
        False,
        "reuse curvature bounds stored in the model file instead of recomputing "
        "them (the certificate is then only as sound as that stored data)",
    )

    def __post_init__(self) -> None:
        if self.curvature not in CURVATURE_LEVELS:
            raise ValueError("curvature must be lazy, exact or global")
        if not 0 < self.boundary < 1:
            raise ValueError("boundary must be in (0, 1)")
        if self.solver_dtype not in _DTYPES:
            raise ValueError("solver_dtype must be float32 or float64")

    @property
    def torch_solver_dtype(self) -> torch.dtype:
        """``solver_dtype`` as a torch dtype."""
        return _DTYPES[self.solver_dtype]

    @classmethod
    def params(cls) -> tuple[Param, ...]:
        """The certificate spec's parameters: one per field, same name, default and help."""
        return tuple(
            Param(
                name=f.name,
                type=type(f.default),
                default=f.default,
                help=f.metadata["help"],
                choices=f.metadata["choices"],
                **f.metadata["limits"],
            )
            for f in fields(cls)
        )
