"""The lipcli plugin module (entry point ``sll`` in the ``lipcli`` group).

Provides the convolution ``sll`` (``lip train --conv sll``, options e.g.
``--conv sll:kernel=3,inner_factor=2`` or ``--conv sll:hidden=5,q_init=normal``) and the
architectures ``sll-small`` .. ``sll-xlarge``, the SLL authors' networks
(:mod:`lipcli_sll.network`), the recipe ``sll-small`` (``recipes.toml`` beside this module)
and the importer ``sll`` (``lip import CKPT --from sll``: checkpoints of the SLL authors' code,
:mod:`lipcli_sll.importer`).
"""

from __future__ import annotations

from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, ConvSpec, ImporterSpec, Param, RecipeSpec

from .conv import SLLConv
from .core import Q_INITS
from .importer import DESCRIPTION, SOURCE, SLLImporter
from .network import MAX_DENSE, MAX_DENSE_HIDDEN, MAX_DEPTH, MAX_WIDTH, SIZES, SLLNetwork

#: the largest residual-branch filter, hidden-units factor and hidden-channel count
MAX_KERNEL, MAX_INNER_FACTOR, MAX_HIDDEN = 15, 16, 65536


def factory(in_channels: int, out_channels: int, kernel_size: int, stride: int, *,
            kernel: int = 0, inner_factor: int = 1, hidden: int = 0,
            q_init: str = "ones") -> SLLConv:
    """ConvSpec factory (channel handling: :mod:`lipcli_sll.conv`)."""
    return SLLConv(in_channels, out_channels, kernel_size, stride, kernel=kernel,
                   inner_factor=inner_factor, hidden=hidden, q_init=q_init)


def sll_spec() -> ConvSpec:
    """The ``sll`` conv spec: no promise; the layer's ``lipschitz_upper_bound()`` is a
    verified bound (about 1 + 1e-6 for float32 weights) on the parameters actually used."""
    return ConvSpec(
        name="sll",
        factory=factory,
        description="SLL: SDP-based 1-Lipschitz residual layer x - 2W T^-1 relu(W^T x + b) (Araujo et al., ICLR 2023)",
        params=(
            Param(name="kernel", type=int, default=0, min=1, max=MAX_KERNEL, odd=True, auto=0,
                  help="filter size of the residual branch (odd); 0: the architecture's"),
            Param(name="inner_factor", type=int, default=1, min=1, max=MAX_INNER_FACTOR,
                  help="hidden units per channel of the residual branch"),
            Param(name="hidden", type=int, default=0, min=1, max=MAX_HIDDEN, auto=0,
                  help="hidden channels of the residual branch as a count (0: inner_factor "
                       "times the channels; the SLL authors' networks use 5)"),
            Param(name="q_init", type=str, default="ones", choices=Q_INITS,
                  help="ones: log_q = 0 (q = 1); normal: log_q ~ N(0, 1), the SLL authors'"),
        ),
        promises=(),
    )


def network_specs() -> list[ArchSpec]:
    """``sll-small`` .. ``sll-xlarge``: the SLL authors' networks (:mod:`lipcli_sll.network`),
    their sizes as the parameters' defaults."""
    specs = []
    for size, (depth, dense, width, dense_hidden) in SIZES.items():
        specs.append(ArchSpec(
            name=f"sll-{size}",
            factory=SLLNetwork,
            slots=("conv", "head"),  # SLL layers carry their own ReLU; the pool is the authors' sum pool
            description=f"the SLL authors' {size} network: {depth} convolutions of width {width}, "
                        f"sum pool, {dense} SLL dense layers (use --conv sll:hidden=5,q_init=normal --head lln)",
            params=(
                Param(name="depth", type=int, default=depth, min=0, max=MAX_DEPTH, help="convolutions"),
                Param(name="dense", type=int, default=dense, min=0, max=MAX_DENSE, help="SLL dense layers"),
                Param(name="width", type=int, default=width, min=1, max=MAX_WIDTH, help="channels"),
                Param(name="dense_hidden", type=int, default=dense_hidden, min=1, max=MAX_DENSE_HIDDEN,
                      help="hidden units of each dense layer"),
                Param(name="q_init", type=str, default="normal", choices=Q_INITS,
                      help="log_q of the dense layers: normal (the authors'), ones"),
            ),
        ))
    return specs


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [sll_spec()]


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return network_specs()


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))


@hookimpl
def lip_importers() -> list[ImporterSpec]:
    return [ImporterSpec(name="sll", factory=SLLImporter, source=SOURCE, description=DESCRIPTION)]
