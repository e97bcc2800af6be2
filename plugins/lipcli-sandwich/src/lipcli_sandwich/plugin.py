"""The lipcli plugin module (entry point ``sandwich`` in the ``lipcli`` group).

Provides the convolution ``sandwich`` (``lip train --conv sandwich``;
``--conv sandwich:psi_in_bias=yes``), :mod:`lipcli_sandwich.conv`.
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ConvSpec, Param

from .conv import SandwichConv


def factory(in_channels: int, out_channels: int, kernel_size: int, stride: int, *,
            psi_in_bias: bool = False) -> SandwichConv:
    return SandwichConv(in_channels, out_channels, kernel_size, stride, psi_in_bias=psi_in_bias)


def sandwich_spec() -> ConvSpec:
    """The ``sandwich`` conv spec: no promise (the Cayley matrices are orthogonal only up to
    rounding); ``lipschitz_upper_bound()`` is a verified bound of the matrices used."""
    return ConvSpec(
        name="sandwich",
        factory=factory,
        description="Sandwich: sqrt2 A^T Psi relu(sqrt2 Psi^-1 B h + b), Cayley-parameterised per frequency "
                    "(Wang & Manchester, ICML 2023)",
        params=(
            Param(name="psi_in_bias", type=bool, default=False,
                  help="fold Psi into the bias (the same function; the comparison study's numerical_stable)"),
        ),
        promises=(),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [sandwich_spec()]
