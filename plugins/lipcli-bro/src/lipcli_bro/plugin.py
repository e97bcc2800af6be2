"""The lipcli plugin module (entry point ``bro`` in the ``lipcli`` group).

Provides one convolution component, ``bro``: ``lip train --conv bro`` (parameters inline,
e.g. ``--conv bro:rank_ratio=0.25``), the authors' LipConvNet as the architectures
``bronet-lipconvnet-<n>`` (:mod:`lipcli_bro.lipconvnet`) and their backbone network as
``bronet`` (:mod:`lipcli_bro.bronet`), the importers ``bronet-lipconvnet``
(:mod:`lipcli_bro.importer`) and ``bronet`` (:mod:`lipcli_bro.bronet_importer`), and the
BRONet paper's recipes ``bronet`` and ``bronet-lipconvnet`` (``recipes.toml`` beside this module).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ORTHOGONAL, ArchSpec, ConvSpec, ImporterSpec, Param, RecipeSpec

from .backbone import QuasiResidualBRO
from .border import BORDERS, RANK_RULES
from .bro import FACTORS, INITS, BROConv
from .bronet import MAX_DENSE_WIDTH, MAX_DEPTH, BRONet
from .bronet import MAX_WIDTH as BRONET_MAX_WIDTH
from .bronet_importer import DESCRIPTION as BRONET_DESCRIPTION
from .bronet_importer import BRONetImporter
from .importer import DESCRIPTION, SOURCE, BRONetLipConvNetImporter
from .lipconvnet import DEPTHS, MAX_WIDTH, BRONetLipConvNet

#: the largest rank a ``bro`` layer is given (each layer also refuses one above its channels)
MAX_RANK = 4096


def bro_factory(in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                quasi_residual_scale: float | None = None, **params: object) -> BROConv:
    """:class:`BROConv`, refusing a ``rank`` above the layer's ``c = max(in·s², out)`` (a
    ``ValueError``: the host reports it as the choice's usage error); with
    ``quasi_residual_scale`` (the ``bronet`` arch's ``quasi_residual``) the BRONet backbone's
    :class:`~lipcli_bro.backbone.QuasiResidualBRO` with that scale."""
    channels = max(in_channels * stride * stride, out_channels)
    rank = params.get("rank", 0)
    if isinstance(rank, int) and rank > channels:
        raise ValueError(f"rank must be at most the layer's channels c = max(in*stride^2, out) = "
                         f"{channels}, got {rank}")
    if quasi_residual_scale is not None:
        return QuasiResidualBRO(in_channels, out_channels, kernel_size, stride, scale=quasi_residual_scale,
                                **params)
    return BROConv(in_channels, out_channels, kernel_size, stride, **params)  # type: ignore[arg-type]


def bro_spec() -> ConvSpec:
    """The ``bro`` conv spec: orthogonal (semi-orthogonal for ``in ≠ out``) in exact
    arithmetic with ``border="circular"``, 1-Lipschitz with ``border="zero"`` (a crop of an
    orthogonal map of the zero-padded input: the promise is then ``"1-lipschitz"``, not
    ``"orthogonal"``); ``lipschitz_upper_bound()`` is a verified bound for the float matrices
    used, in both forms."""
    return ConvSpec(
        name="bro",
        factory=bro_factory,
        description="BRO: block reflector orthogonal convolution in the Fourier domain (Lai et al., ICML 2025)",
        params=(
            Param(name="rank", type=int, default=0, min=1, max=MAX_RANK, auto=0,
                  help="rank r of the low-rank filter V (0: rank_ratio times the channels)"),
            Param(name="rank_ratio", type=float, default=0.5, min=0.0, min_open=True, max=1.0,
                  help="r = floor(rank_ratio * c), c = max(in*stride^2, out), when rank is 0"),
            Param(name="init", type=str, default="identity", choices=INITS,
                  help="identity: centre tap of V is [I; 0] (the authors' default); random"),
            Param(name="factor", type=str, default="auto", choices=FACTORS,
                  help="basis of range V: qr (Householder), cholesky (Cholesky QR, unchecked), auto "
                       "(training: Cholesky QR, on CPU checked with a fallback to qr; eval: qr)"),
            Param(name="rank_rule", type=str, default="ratio", choices=RANK_RULES,
                  help="ratio: r = floor(rank_ratio * c); lipconvnet: the BRONet authors' LipConvNet "
                       "rule, r = min(in*stride^2, out) where they differ (use with rank_ratio=0.125)"),
            Param(name="border", type=str, default="circular", choices=BORDERS,
                  help="circular: orthogonal on the torus; zero: the authors' zero pad and crop "
                       "(1-Lipschitz, not orthogonal)"),
            Param(name="ridge", type=float, default=0.0, min=0.0, max=1.0, max_open=True,
                  help="the authors' LipConvNet solve with V^H V + ridge*mean(diag)*I (their 1e-5): "
                       "a contraction, not orthogonal; 0: the exact reflector"),
        ),
        promises=(ORTHOGONAL,),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [bro_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return [
        ArchSpec(
            name=f"bronet-lipconvnet-{n}",
            factory=partial(BRONetLipConvNet, depth=n),
            slots=NO_POOL,
            description=f"the BRONet authors' LipConvNet-{n} (lipconvnet/): {n} convolutions, stride-2 "
                        "convolutions C -> 2C without pooling (use --conv bro:rank_rule=lipconvnet,border=zero,"
                        "ridge=1e-5 --head lln)",
            params=(Param(name="width", type=int, default=32, min=1, max=MAX_WIDTH,
                          help="channels of the first layer (the authors' --init-channels)"),
                    Param(name="kernel", type=int, default=3, min=1, max=7,
                          help="odd kernel of the stride-2 convolutions of layers 1-4 (the authors' --kernel)")),
        )
        for n in DEPTHS
    ] + [bronet_arch_spec()]


#: the layer kinds both networks take from the user (they downsample with strided layers, no pool)
NO_POOL = ("conv", "activation", "head")
#: the ``bronet`` arch's integer parameters: name, default (the authors' CIFAR-10 shapes), range, help
_BRONET_PARAMS = (
    ("depth", 12, 0, MAX_DEPTH, "backbone blocks (--conv layers)"),
    ("width", 512, 2, BRONET_MAX_WIDTH, "backbone channels w"),
    ("stem_kernel", 5, 1, 15, "odd kernel of the stride-2 stem"),
    ("neck_patch", 4, 1, 16, "patch (kernel = stride) of the neck conv"),
    ("dense", 8, 0, MAX_DEPTH, "Cholesky dense layers after the neck"),
    ("dense_width", 2048, 2, MAX_DENSE_WIDTH, "width D of the dense layers"),
)


def bronet_arch_spec() -> ArchSpec:
    """The BRONet authors' backbone network (:mod:`lipcli_bro.bronet`); defaults: their
    CIFAR-10 configuration's shapes."""
    return ArchSpec(
        name="bronet",
        factory=BRONet,
        slots=NO_POOL,
        description="the BRONet authors' backbone network (bronet/): free stride-2 stem, depth x (--conv + act), "
                    "Cholesky patch neck and dense layers (use --conv bro:border=zero,ridge=1e-7 --head lln)",
        params=tuple(Param(name=name, type=int, default=default, min=low, max=high, help=text)
                     for name, default, low, high, text in _BRONET_PARAMS) + (
            Param(name="quasi_residual", type=bool, default=False,
                  help="BRO filter V = I + gamma*W*depth^-1/2 (the authors' backbone; needs --conv bro)"),
            Param(name="dense_quasi_residual", type=bool, default=False,
                  help="Cholesky dense layers orthogonalise X = I + gamma*W*dense^-1/2 (the authors' LiResMLP)"),
            Param(name="centering", type=bool, default=False,
                  help="batch centring after each backbone BRO layer, running mean in eval (the authors'; "
                       "1-Lipschitz in both modes)")),
    )


@hookimpl
def lip_importers() -> list[ImporterSpec]:
    return [ImporterSpec(name="bronet-lipconvnet", factory=BRONetLipConvNetImporter, source=SOURCE,
                         description=DESCRIPTION),
            ImporterSpec(name="bronet", factory=BRONetImporter, source=SOURCE, description=BRONET_DESCRIPTION)]
