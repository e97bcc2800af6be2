"""The float64 rounding model that every guaranteed bound in lipcli is written against.

Standard model (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2.2,
§3.1): every float64 operation returns ``fl(a ∘ b) = (a ∘ b)(1 + ε)`` with ``|ε| ≤ u`` for
``u = 2⁻⁵³`` (no underflow), and a length-``n`` dot product or sum, in any order and with or
without FMA, is off by at most ``γ_n = n·u/(1 − n·u)`` times the sum of the absolute terms.
Underflow adds at most ``η = 2⁻¹⁰⁷⁴`` (the smallest subnormal) per operation.  The final
scalar arithmetic of a bound (a handful of roundings of relative size ``u``) is covered by
:func:`round_up` (a relative ``1e-12``, i.e. about 4,500 such roundings).

Used by :mod:`lipcli.numerics.eigen` (verified ``λ_max``, SPEC §4–§5),
:mod:`lipcli.numerics.spectral`, :mod:`lipcli.numerics.conv`,
:mod:`lipcli.numerics.gram_bounds` and the certificates of the built-in heads.
"""

from __future__ import annotations

import math

__all__ = ["ETA", "SCALAR_MARGIN", "UNIT_ROUNDOFF", "gamma", "norm_from_squares", "pow2_scale", "round_up",
           "sum_upper"]

#: Unit roundoff ``u`` of float64.
UNIT_ROUNDOFF = 2.0**-53
#: Smallest positive subnormal float64 (Rump's underflow unit ``η``).
ETA = 2.0**-1074
#: Relative margin covering the last few scalar roundings of every bound.
SCALAR_MARGIN = 1e-12


def gamma(n: int) -> float:
    """Higham's ``γ_n = n·u / (1 − n·u)`` for float64 (``ValueError`` once ``n·u ≥ ½``)."""
    nu = n * UNIT_ROUNDOFF
    if nu >= 0.5:
        raise ValueError(f"problem too large for the rounding analysis (n = {n})")
    return nu / (1.0 - nu)


def sum_upper(computed: float, terms: int) -> float:
    """An upper bound on a sum of ``terms`` non-negative float64 values (each exact or rounded
    up already) from its computed value, summed in any order: ``computed·(1 + 2γ_{terms+2})``."""
    return computed * (1.0 + 2.0 * gamma(terms + 2))


def norm_from_squares(square_sum: float, terms: int) -> float:
    """An upper bound on ``√(Σ x²)`` from the computed float64 sum of ``terms`` squares (the
    squares' own roundings, the sum in any order, the square root and the product):
    ``√(square_sum·up)·up`` with ``up = 1 + 2γ_{terms+2}``."""
    up = 1.0 + 2.0 * gamma(terms + 2)
    return math.sqrt(square_sum * up) * up


def round_up(x: float) -> float:
    """``x`` moved up by the relative scalar margin (also correct for ``x < 0``)."""
    return x + abs(x) * SCALAR_MARGIN


def pow2_scale(value: float) -> float:
    """An exact power of two ``s`` with ``value·s ∈ [0.5, 1)`` (value > 0, finite)."""
    _, exponent = math.frexp(value)
    return math.ldexp(1.0, -exponent)
