"""The recipes ``lot`` and ``lot-residual``: LOT's CIFAR-10 training (Xu et al., NeurIPS 2022;
``AI-secure/Layerwise-Orthogonal-Training`` ``train_robust.py``), each value with its line."""

from __future__ import annotations

from lipcli.sdk.specs import RecipeSource, RecipeSpec

REPO = "AI-secure/Layerwise-Orthogonal-Training"
COMMIT = "65f7ea4508d7ec9921d219cdd469ac8a2d48b817"
PAPER = "Xu et al., LOT: Layer-wise Orthogonal Training on Improving l2 Certified Robustness, NeurIPS 2022"


def _at(path: str, key: str, note: str = "") -> RecipeSource:
    return RecipeSource(repo=REPO, commit=COMMIT, path=path, key=key, note=note)


def _script(key: str, note: str = "") -> RecipeSource:
    return _at("train_robust.py", key, note)


def _lot(residual: bool) -> RecipeSpec:
    sources = {
        "arch": _script("--block-size 1, --init-channels 32; lines 40, 43", "LipConvnet-5"),
        "conv": _script("--conv-layer lot, line 38", "10 Newton-Schulz iterations (lot_ortho_conv.py lines 15-16)"),
        "activation": _script("--activation, line 41"),
        "head": _at("README.md", "--lln, line 17"),
        "loss": _script("--gamma 0: plain cross-entropy, lines 30, 189"),
        "dataset": _script("--dataset, line 51"),
        "epochs": _script("--epochs, line 25"),
        "batch_size": _script("--batch-size, line 24"),
        "optimizer": _script("torch.optim.SGD, line 146"),
        "lr": _script("--lr-max, line 27"),
        "momentum": _script("--momentum, line 29"),
        "weight_decay": _script("weight_decay=0. for layers other than SOC, lines 146-147"),
        "schedule": _script("MultiStepLR, line 156"),
        "lr_milestones": _script("lr_steps // 2, 3 * lr_steps // 4; lines 156-157"),
        "lr_gamma": _script("gamma=0.1, line 157"),
        "grad_clip": _script("no gradient clipping in the training loop, lines 178-200"),
        "amp": _at("README.md", "--opt-level O0, lines 11, 16", "LOT needs full precision"),
        "seed": _script("--seed, line 57"),
        "augment": _at("utils.py", "RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 29-30"),
    }
    values = {
        "arch": "lipconvnet-5:width=32", "conv": "lot:iterations=10", "activation": "maxmin",
        "head": "lln", "loss": "ce", "dataset": "cifar10", "epochs": 200, "batch_size": 256,
        "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, "schedule": "step",
        "lr_milestones": [0.5, 0.75], "lr_gamma": 0.1, "grad_clip": 0.0, "amp": False, "seed": 0,
        "augment": True,
    }
    pending = ["the paper's reported accuracy (not stated in the authors' repository)"]
    if residual:
        pending.insert(0, "the residual form: --residual, a LipResNet of convex-combination residual "
                          "blocks (train_robust.py lines 46, 61-64; lip_convnets.py lines 84-178)")
    return RecipeSpec(
        name="lot-residual" if residual else "lot", version="1", paper=PAPER,
        description=("LOT " + ("with its residual form (--residual) " if residual else "")
                     + "on CIFAR-10: LipConvnet-5 of LOT layers, LLN, SGD 200 epochs"),
        values=values, sources=sources, pending=tuple(pending),
    )


def lot_recipe() -> RecipeSpec:
    return _lot(residual=False)


def lot_residual_recipe() -> RecipeSpec:
    return _lot(residual=True)
