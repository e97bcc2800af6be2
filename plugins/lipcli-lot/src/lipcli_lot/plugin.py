"""The lipcli plugin module (entry point ``lot`` in the ``lipcli`` group).

Provides the convolution ``lot`` (``lip train --conv lot``, parameters inline, e.g.
``--conv lot:iterations=20``) and the architectures ``lipresnet-<n>``, LipConvnet-n with the
LOT authors' convex-combination residuals (``--arch lipresnet-20``, :mod:`lipcli_lot.resnet`).
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from functools import partial

from lipcli.builtins.lipconvnet import DEPTHS
from lipcli.sdk.specs import ArchSpec, ConvSpec, Param

from .lot import INITS, LOTConv
from .resnet import AUTHORS_MIX, LipResNet

#: the most Newton-Schulz iterations (10 times the authors' 10; each one is two batched
#: matrix products per frequency, kept for the backward pass in training)
MAX_ITERATIONS = 100


def lot_spec() -> ConvSpec:
    """The ``lot`` conv spec: no promise (orthogonal only when the Newton–Schulz iteration has
    converged; ``‖W(f)‖ ≤ 1`` for any count in exact arithmetic); the layer's
    ``lipschitz_upper_bound()`` is a verified bound on the float matrices used, converged or
    not, which the certificates divide by."""
    return ConvSpec(
        name="lot",
        factory=LOTConv,
        description="LOT: per-frequency polar factor by Newton-Schulz iterations (Xu et al., NeurIPS 2022)",
        params=(
            Param(name="iterations", type=int, default=10, min=1, max=MAX_ITERATIONS,
                  help="Newton-Schulz iterations for (V^H V)^(-1/2), in training and eval (10: the authors')"),
            Param(name="eps", type=float, default=1e-4, min=0.0, max=1.0,
                  help="regulariser added to V^H V and its norm (the authors' 1e-4)"),
            Param(name="init", type=str, default="identity", choices=INITS,
                  help="identity: centre tap [I 0] (the authors' default); random"),
        ),
        promises=(),
    )


def lipresnet_specs() -> list[ArchSpec]:
    """``lipresnet-<n>`` for every LipConvnet depth: LipConvnet-n with convex-combination
    residuals ``λx + (1 − λ)f(x)`` on each block's pairs 2 .. n/5 − 1 (the LOT authors'
    ``--residual`` network; ``lipresnet-5`` and ``-10`` have none)."""
    return [
        ArchSpec(
            name=f"lipresnet-{n}",
            factory=partial(LipResNet, depth=n),
            description=f"LipConvnet-{n} with the LOT authors' convex-combination residuals "
                        "(Xu et al. 2022, --residual)",
            params=(
                Param(name="width", type=int, default=32, min=1, max=256, help="channels after the stem"),
                Param(name="mix", type=float, default=AUTHORS_MIX, min=0.0, max=1.0,
                      help="weight of the skip path, x <- mix*x + (1-mix)*block(x) (the authors' sigmoid(0) = 0.5)"),
            ),
        )
        for n in DEPTHS
    ]


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [lot_spec()]


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return lipresnet_specs()
