"""The recipes of BRONet (Lai et al., ICML 2025; ``ntuaislab/BRONet``): ``bronet``, the BRO
backbone with Logit Annealing on CIFAR-10 (``bronet/configs/benchmark_reproduce/cifar10.yaml``),
and ``bronet-lipconvnet``, the paper's LipConvNet-10-32 with BRO layers (``lipconvnet/``)."""

from __future__ import annotations

import math

from lipcli.sdk.specs import RecipeSource, RecipeSpec

REPO = "ntuaislab/BRONet"
COMMIT = "9d59c9bd15e8361685a7a30c0ff8f6bb9ec05ca0"
PAPER = ("Lai et al., Enhancing Certified Robustness via Block Reflector Orthogonal Layers and "
         "Logit Annealing Loss, ICML 2025")
CONFIG = "bronet/configs/benchmark_reproduce/cifar10.yaml"
MAIN = "lipconvnet/main.py"


def _at(path: str, key: str, note: str = "") -> RecipeSource:
    return RecipeSource(repo=REPO, commit=COMMIT, path=path, key=key, note=note)


def bronet_recipe() -> RecipeSpec:
    sources = {
        "arch": _at(CONFIG, "model.depth, width, backbone_type, linear_num; lines 2-3, 8, 17",
                    "backbone_type bro: each block is the --conv layer (block=conv)"),
        "conv": _at(CONFIG, "model.backbone_weight_rank_ratio, line 10"),
        "activation": _at(CONFIG, "model.act_name MinMax, line 6"),
        "head": _at(CONFIG, "model.use_lln, line 4"),
        "loss": _at(CONFIG, "loss.loss_type, eps, gamma, temperature, offset; lines 41-47",
                    "the eps schedule (min/max_eps_ratio, lines 42-43) is pending"),
        "dataset": _at(CONFIG, "dataset.name, line 34"),
        "epochs": _at(CONFIG, "training.epochs, line 21"),
        "batch_size": _at(CONFIG, "training.batch_size, line 20"),
        "warmup_epochs": _at(CONFIG, "training.warmup_epochs, line 22"),
        "lr": _at(CONFIG, "training.lr, line 23"),
        "weight_decay": _at(CONFIG, "training.weight_decay, line 24",
                            "the authors' torch NAdam couples it to every parameter (train.py line 139); "
                            "lipcli's nadam decays conv filters and the LLN weight, decoupled"),
        "grad_clip": _at(CONFIG, "training.grad_clip, grad_clip_val; lines 25-26"),
        "optimizer": _at(CONFIG, "training.nadam, line 27"),
        "lookahead": _at(CONFIG, "training.lookahead, line 31",
                         "timm.optim.Lookahead's defaults: k=6, alpha=0.5 (bronet/train.py line 158)"),
        "schedule": _at("bronet/tools/scheduler.py", "_cosine_get_lr, lines 29-32"),
        "augment": _at("bronet/tools/dataset/cifar.py", "RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 8-9"),
    }
    values = {
        "arch": "liresnet:depth=12,width=512,block=conv,dense=8", "conv": "bro:rank_ratio=0.5",
        "activation": "maxmin", "head": "lln",
        "loss": "la:eps=0.1411764705882353,gamma=5.0,temperature=0.75,offset=2.0",
        "dataset": "cifar10", "epochs": 800, "batch_size": 256, "warmup_epochs": 20.0, "lr": 0.001,
        "weight_decay": 4e-5, "grad_clip": 3.0, "optimizer": "nadam", "lookahead": 6,
        "schedule": "cosine", "augment": True,
    }
    return RecipeSpec(
        name="bronet", version="1", paper=PAPER,
        description="BRONet-L on CIFAR-10: BRO backbone (depth 12, width 512), Logit Annealing, "
                    "NAdam + Lookahead, 800 epochs",
        values=values, sources=sources,
        pending=(
            "LA eps schedule: 0.1x to 3x of 36/255 over the first half of training "
            f"({CONFIG} lines 42-43, bronet/train.py lines 174-176)",
            f"backbone centring (model.backbone_centering, {CONFIG} line 9)",
            f"the authors' stem (5x5, line 7), Cholesky neck and 8 dense layers of width 2048 "
            f"(lines 12-17); lipcli's are 3x3 and 16*width",
            "RandAugment (bronet/tools/dataset/cifar.py line 10)",
            "the paper's reported accuracy (not stated in the authors' repository)",
        ),
    )


def bronet_lipconvnet_recipe() -> RecipeSpec:
    sources = {
        "arch": _at(MAIN, "--block-size 2, --init-channels 32; lines 43-45",
                    "LipConvNet-10-32 (lipconvnet/README.md)"),
        "conv": _at(MAIN, "--conv-layer bro, --bro-rank; lines 40-41"),
        "activation": _at(MAIN, "--activation, line 44"),
        "head": _at("lipconvnet/trainer/trainer.py", "LLN forced for CIFAR-100, lines 80-82"),
        "loss": _at(MAIN, "--loss la, --temperature, --offset, --la_beta; lines 30-36",
                    "offset x sqrt(2) (lipconvnet/utils/misc.py line 93); no EMMA term (eps=0)"),
        "dataset": _at(MAIN, "--dataset, line 53"),
        "epochs": _at(MAIN, "--epochs, line 17"),
        "batch_size": _at(MAIN, "--batch-size, line 16"),
        "optimizer": _at(MAIN, "--optimizer, line 28"),
        "lr": _at(MAIN, "--lr-max, line 19"),
        "momentum": _at(MAIN, "--momentum, line 21"),
        "weight_decay": _at(MAIN, "--weight-decay, line 20"),
        "schedule": _at("lipconvnet/utils/misc.py", "MultiStepLR (lr-scheduler default), line 104"),
        "lr_milestones": _at("lipconvnet/utils/misc.py", "lr_steps // 2, 3 * lr_steps // 4; line 104"),
        "lr_gamma": _at("lipconvnet/utils/misc.py", "gamma=0.1, line 104"),
        "seed": _at(MAIN, "--seed, line 59"),
        "augment": _at("lipconvnet/utils/data.py", "RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 292-293"),
    }
    values = {
        "arch": "lipconvnet-10:width=32", "conv": "bro:rank_ratio=0.125", "activation": "maxmin",
        "head": "lln",
        "loss": f"la:eps=0.0,gamma=5.0,temperature=0.75,offset={2.0 * math.sqrt(2.0)!r}",
        "dataset": "cifar100", "epochs": 200, "batch_size": 512, "optimizer": "sgd", "lr": 0.1,
        "momentum": 0.9, "weight_decay": 3e-4, "schedule": "step", "lr_milestones": [0.5, 0.75],
        "lr_gamma": 0.1, "seed": 3407, "augment": True,
    }
    return RecipeSpec(
        name="bronet-lipconvnet", version="1", paper=PAPER,
        description="the BRONet paper's LipConvNet-10-32 with BRO layers and Logit Annealing on "
                    "CIFAR-100 (lipconvnet/run.sh)",
        values=values, sources=sources,
        pending=(
            f"LA loss factor la_alpha 0.25 ({MAIN} line 37)",
            "BRO rank rule for channel-changing layers: min(in*stride^2, out) (lipconvnet/models/layers/bro.py)",
            "BRO zero-pad-and-crop border (1-Lipschitz, not orthogonal) (lipconvnet/models/layers/bro.py)",
            "the paper's reported accuracy (not stated in the authors' repository)",
        ),
    )
