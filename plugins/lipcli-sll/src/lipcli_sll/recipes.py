"""The recipe ``sll-small``: the SLL small network's CIFAR-10 training (Araujo et al., ICLR 2023;
``araujoalexandre/Lipschitz-SLL-Networks`` ``main.py``), each value with its line."""

from __future__ import annotations

import math

from lipcli.sdk.specs import RecipeSource, RecipeSpec

REPO = "araujoalexandre/Lipschitz-SLL-Networks"
COMMIT = "87865dbf74f07b443b595ea777edbb1d4596faf0"
PAPER = "Araujo et al., A Unified Algebraic Perspective on Lipschitz Neural Networks, ICLR 2023"


def _at(path: str, key: str, note: str = "") -> RecipeSource:
    return RecipeSource(repo=REPO, commit=COMMIT, path=path, key=key, note=note)


def sll_small_recipe() -> RecipeSpec:
    sources = {
        "arch": _at("main.py", "--model-name small: n_conv 20, n_dense 7, w 45; lines 85-86",
                    "nearest lipcli network: liresnet with SLL blocks (the authors' shape is pending)"),
        "conv": _at("core/models/layers.py", "SDPBasedLipschitzConvLayer, lines 16-49"),
        "head": _at("core/models/model.py", "LinearNormalized, line 57"),
        "loss": _at("core/utils.py", "LossXent (--loss xent, --offset, --temperature; main.py lines 39-42), "
                    "lines 113-120", "offset cross-entropy: la with gamma=0 and no EMMA term"),
        "dataset": _at("main.py", "--dataset, line 34"),
        "epochs": _at("main.py", "--epochs, line 38"),
        "batch_size": _at("main.py", "--batch_size, line 55", "per GPU (core/trainer.py lines 122-126)"),
        "optimizer": _at("main.py", "--optimizer adam, --wd 0; lines 43, 48",
                         "Adam and AdamW agree when the weight decay is 0"),
        "lr": _at("main.py", "--lr, line 45"),
        "weight_decay": _at("main.py", "--wd, line 48"),
        "grad_clip": _at("main.py", "--gradient_clip_by_norm None, line 53"),
        "augment": _at("core/data/readers.py", "RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 66-67"),
    }
    values = {
        "arch": "liresnet:block=conv,depth=20,width=45,dense=7", "conv": "sll", "head": "lln",
        "loss": f"la:gamma=0.0,eps=0.0,temperature=0.25,offset={math.sqrt(2.0) * 3 / 2!r}",
        "dataset": "cifar10", "epochs": 1000, "batch_size": 64, "optimizer": "adamw", "lr": 0.01,
        "weight_decay": 0.0, "grad_clip": 0.0, "augment": True,
    }
    return RecipeSpec(
        name="sll-small", version="1", paper=PAPER,
        description="SLL small on CIFAR-10: 20 SLL convolutions at width 45, 7 dense SLL layers, "
                    "offset cross-entropy, Adam 1000 epochs",
        values=values, sources=sources,
        pending=(
            "Adam betas (0.5, 0.9) (main.py lines 46-47)",
            "the triangular learning-rate schedule: 0 -> lr at 40 %, lr/20 at 80 %, 0 at the end "
            "(--scheduler interp, main.py line 44; core/utils.py TriangularLRScheduler)",
            "random q initialisation (core/models/layers.py line 28)",
            "hidden channels 5 per convolution and 2048 per dense layer "
            "(main.py lines 69-70, 86): inner_factor cannot express them",
            "the authors' network shape: zero channel padding stem, no stride, 4x4 average-pool "
            "neck, no activation between layers (core/models/model.py lines 38-57)",
            "reflect padding and colour jitter in the augmentation (core/data/readers.py lines 66-68)",
            "the paper's reported accuracy (not stated in the authors' repository)",
        ),
    )
