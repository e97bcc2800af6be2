"""The paper's own recipe (Singla & Feizi, NeurIPS 2022): its best CIFAR-10 LipConvnet, each
value read from the authors' training script (``singlasahil14/improved_l2_robustness``)."""

from __future__ import annotations

from lipcli.sdk.specs import RecipeResult, RecipeSource, RecipeSpec

REPO = "singlasahil14/improved_l2_robustness"
COMMIT = "65dd5f244be8a7212b05268541d0abdce909bd81"
PAPER = "Singla & Feizi, Improved techniques for deterministic l2 robustness, NeurIPS 2022"


def _script(key: str, note: str = "") -> RecipeSource:
    return RecipeSource(repo=REPO, commit=COMMIT, path="train_robust.py", key=key, note=note)


def lipconvnet_recipe() -> RecipeSpec:
    """``lipconvnet``: LipConvnet-10, fast SOC, projection pooling, CRC-Lip MLP head."""
    sources = {
        "arch": _script("--num-layers, line 48", "10: the paper's best CIFAR-10 row (default 5)"),
        "conv": _script("--conv-layer soc + --fast-train, lines 41-43"),
        "activation": _script("--activation, line 46"),
        "pool": _script("--pooling lip1, line 47", "lip1 is the projection pool"),
        "head": _script("--last-layer crc_full + --num-hidden, lines 45-50"),
        "loss": _script("--last-layer crc_full, --beta; lines 212-220",
                        "curvature-regularised CE; radius and weight per data set from crc-lip"),
        "dataset": _script("--dataset, line 55"),
        "epochs": _script("--epochs, line 27"),
        "batch_size": _script("--batch-size, line 25"),
        "optimizer": _script("torch.optim.SGD, line 160"),
        "lr": _script("--lr-max, line 29"),
        "momentum": _script("--momentum, line 31"),
        "weight_decay": _script("--weight-decay, line 30", "on the conv filters only (lines 160-163)"),
        "schedule": _script("MultiStepLR, line 175"),
        "lr_milestones": _script("milestones lr_steps // 2, 3 * lr_steps // 4, lines 175-176"),
        "lr_gamma": _script("gamma=0.1, line 176"),
        "warmup_epochs": _script("no warm-up in the training loop, lines 199-235"),
        "grad_clip": _script("--clip-norm, line 32", "applied for crc heads, lines 230-231"),
        "augment": RecipeSource(repo=REPO, commit=COMMIT, path="utils.py",
                                key="RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 37-38"),
        "seed": _script("--seed, line 63"),
    }
    values = {
        "arch": "lipconvnet-10", "conv": "soc-fast", "activation": "maxmin", "pool": "projection",
        "head": "mlp:hidden=4096", "loss": "crc-lip", "dataset": "cifar10", "epochs": 200,
        "batch_size": 128, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4,
        "schedule": "step", "lr_milestones": [0.5, 0.75], "lr_gamma": 0.1, "warmup_epochs": 0.0,
        "grad_clip": 1.0, "augment": True, "seed": 0,
    }
    return RecipeSpec(
        name="lipconvnet", version="1", paper=PAPER,
        description="the paper's best CIFAR-10 LipConvnet: LipConvnet-10, fast SOC, projection "
                    "pool, CRC-Lip MLP head, SGD 200 epochs",
        values=values, sources=sources,
        reported=(RecipeResult(dataset="cifar10", clean=79.57,
                               certified={"36/255": 66.75, "72/255": 53.17, "108/255": 38.60},
                               source="the paper's CIFAR-10 table (docs/spec.md §7)"),),
        pending=("mixed precision: the authors train with apex O2 (fp16 master weights); lipcli's "
                 "--amp is bf16 and off in the recipe",),
    )
