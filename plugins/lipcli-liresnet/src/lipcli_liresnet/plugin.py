"""The lipcli plugin module of lipcli-liresnet (entry point ``liresnet``): the architecture
``liresnet``, the training loss ``emma`` (both Hu et al., NeurIPS 2023), the authors'
CIFAR-10 recipe ``liresnet`` and the importer ``liresnet`` of their checkpoints."""

from __future__ import annotations

from pathlib import Path

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.losses import eps_schedule_params
from lipcli.sdk.recipe_files import load_recipes
from lipcli.sdk.specs import ArchSpec, ImporterSpec, LossSpec, Param, RecipeSpec

from .emma import DEFAULT_EPS, emma_factory
from .importer import DESCRIPTION, SOURCE, LiResNetImporter
from .network import BLOCKS, FEATURES, LAYERS, MAX_DENSE, MAX_DEPTH, MAX_WIDTH, NECKS, STEM_KERNELS, LiResNet


def liresnet_slots(params: dict, head: object) -> tuple[str, ...]:
    """The layer kinds a ``liresnet`` network takes from the user: the ``--conv`` where some
    layer is one (``layers=conv``, or ``block=conv`` unless ``layers=free``), the ``--pool``
    where the features end in it (``features=head`` and a head that asks for pooled features)."""
    layers, block = params.get("layers", "conv"), params.get("block", "residual")
    conv = layers == "conv" or (block == "conv" and layers != "free")
    pool = params.get("features", "head") == "head" and getattr(head, "features", "pool") == "pool"
    return ("conv",) * conv + ("activation",) + ("pool",) * pool + ("head",)


def liresnet_spec() -> ArchSpec:
    return ArchSpec(
        name="liresnet",
        factory=LiResNet,
        slots=liresnet_slots,
        description="LiResNet/BRONet-shaped residual network: stem, constant-width backbone, "
                    "neck, dense layers, head",
        params=(
            Param(name="depth", type=int, default=12, min=1, max=MAX_DEPTH, help="backbone blocks"),
            Param(name="width", type=int, default=128, min=1, max=MAX_WIDTH, help="backbone channels"),
            Param(name="block", type=str, default="residual", choices=BLOCKS,
                  help="residual: x + W*x with a free 3x3 W (LiResNet); conv: the --conv layer"),
            Param(name="dense", type=int, default=8, min=0, max=MAX_DENSE,
                  help="dense layers (of width dense_width)"),
            Param(name="gamma", type=bool, default=False,
                  help="residual blocks: learnable per-channel scale of the branch (authors: true)"),
            Param(name="depth_scale", type=bool, default=False,
                  help="residual blocks: branch times depth^-1/2 (authors: true)"),
            Param(name="centering", type=bool, default=False,
                  help="residual blocks: subtract the branch's batch mean in training, its running "
                       "mean in evaluation (authors: true)"),
            Param(name="stem_kernel", type=int, default=3, choices=STEM_KERNELS,
                  help="kernel of the stride-2 stem convolution (authors: 5)"),
            Param(name="neck", type=str, default="conv", choices=NECKS,
                  help="conv: two 3x3 stride-2 convolutions; patch: 4x4 stride-4 convolution + "
                       "dense layer (authors)"),
            Param(name="dense_width", type=int, default=0, min=0, max=16 * MAX_WIDTH,
                  help="width of the dense layers (0: 16*width; authors: 2048)"),
            Param(name="features", type=str, default="head", choices=FEATURES,
                  help="head: pool or activation as the head asks; act: activation after every "
                       "dense layer, head on all of them (authors)"),
            Param(name="layers", type=str, default="conv", choices=LAYERS,
                  help="conv: stem, neck and dense layers are the --conv component; free: free "
                       "filters with a proven norm bound each (lip import --from liresnet); "
                       "cholesky: the authors' trained types, free stem, Cholesky neck and "
                       "quasi-residual Cholesky dense layers (needs neck=patch)"),
        ),
    )


def emma_spec() -> LossSpec:
    return LossSpec(
        name="emma",
        factory=emma_factory,
        description="EMMA (Hu et al. 2023): cross-entropy with each logit raised by its "
                    "clipped certified-radius margin",
        params=(
            Param(name="eps", type=float, default=DEFAULT_EPS, min=0.0, min_open=True, max=64.0,
                  help="target l2 radius in input space (default 36/255)"),
            Param(name="min_ratio", type=float, default=0.01, min=0.0, min_open=True, max=1.0,
                  help="smallest fraction of eps a margin is raised by (in (0, 1])"),
            *eps_schedule_params(),
        ),
    )


@hookimpl
def lip_architectures() -> list[ArchSpec]:
    return [liresnet_spec()]


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [emma_spec()]


@hookimpl
def lip_recipes() -> list[RecipeSpec]:
    return load_recipes(Path(__file__).with_name("recipes.toml"))


@hookimpl
def lip_importers() -> list[ImporterSpec]:
    return [ImporterSpec(name="liresnet", factory=LiResNetImporter, source=SOURCE, description=DESCRIPTION)]
