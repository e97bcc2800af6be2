"""The recipe ``liresnet``: the authors' CIFAR-10 configuration (``hukkai/liresnet``
``configs/cifar10.yaml`` and ``train.py``), each value with the line it was read from."""

from __future__ import annotations

from lipcli.sdk.specs import RecipeResult, RecipeSource, RecipeSpec

REPO = "hukkai/liresnet"
COMMIT = "0c0611a7fae0b299d671b7ccb3cd6aef703bf3d6"
PAPER = ("Hu et al., Unlocking Deterministic Robustness Certification on ImageNet, NeurIPS 2023; "
         "Hu et al., Effectively Leveraging Capacity for Improved Deterministic Robustness "
         "Certification, ICLR 2024")


def _at(path: str, key: str, note: str = "") -> RecipeSource:
    return RecipeSource(repo=REPO, commit=COMMIT, path=path, key=key, note=note)


def _config(key: str, note: str = "") -> RecipeSource:
    return _at("configs/cifar10.yaml", key, note)


def liresnet_recipe() -> RecipeSpec:
    sources = {
        "arch": _config("model.depth, model.width; lines 2-3",
                        "dense=8: LiResMLP(depth=8) in models/model.py line 188"),
        "activation": _config("model.act_name MinMax, line 6"),
        "head": _config("model.use_lln, line 4"),
        "loss": _config("gloro.loss_type emma_loss, gloro.eps; lines 25-28",
                        "the eps schedule (min_eps/max_eps, lines 26-27) is pending"),
        "dataset": _config("dataset.name, line 20"),
        "epochs": _config("training.epochs, line 10"),
        "batch_size": _config("training.batch_size, line 9"),
        "warmup_epochs": _config("training.warmup_epochs, line 11"),
        "lr": _config("training.lr, line 12"),
        "weight_decay": _config("training.weight_decay, line 13"),
        "grad_clip": _config("training.grad_clip, grad_clip_val; lines 14-15"),
        "optimizer": _config("training.nadam, line 16"),
        "lookahead": _config("training.lookahead, line 17",
                             "timm.optim.Lookahead's defaults: k=6, alpha=0.5 (train.py line 103)"),
        "schedule": _at("tools/scheduler.py", "_cosine_get_lr, lines 29-32",
                        "linear warm-up, then cosine (floor 1e-5 of lr)"),
        "augment": _at("tools/dataset/cifar.py", "RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 8-9"),
    }
    values = {
        "arch": "liresnet:depth=12,width=512,dense=8", "activation": "maxmin", "head": "lln",
        "loss": "emma:eps=0.1411764705882353", "dataset": "cifar10", "epochs": 800,
        "batch_size": 256, "warmup_epochs": 20.0, "lr": 0.001, "weight_decay": 0.0,
        "grad_clip": 3.0, "optimizer": "nadam", "lookahead": 6, "schedule": "cosine",
        "augment": True,
    }
    return RecipeSpec(
        name="liresnet", version="1", paper=PAPER,
        description="LiResNet on CIFAR-10 as its authors train it: depth 12, width 512, EMMA, "
                    "NAdam + Lookahead, 800 epochs",
        values=values, sources=sources,
        reported=(RecipeResult(dataset="cifar10", clean=87.0,
                               certified={"36/255": 78.1, "72/255": 66.6, "108/255": 53.5},
                               source="hukkai/liresnet README.md, Main Results (with generated data)"),),
        pending=(
            "EMMA eps schedule: 0.1x to 3x of 36/255 over the first half of training "
            "(configs/cifar10.yaml lines 26-27, train.py lines 115-119)",
            "the block's per-channel scale gamma, depth^-1/2 scale and batch centring "
            "(models/blocks.py)",
            "the authors' stem (5x5 stride 2), neck (4x4 to 2048) and 8 dense layers of width 2048 "
            "(models/model.py lines 11-36, 181-191); lipcli's are 3x3 and 16*width",
            "RandAugment (tools/dataset/cifar.py line 10)",
            "generated (DDPM) images, 3 per real image in each batch (train.py lines 78-82): "
            "lipcli's --extra-data FILE takes them where a file is at hand",
        ),
    )
