"""The built-in recipe ``lipconvnet`` against the authors' training script
(singlasahil14/improved_l2_robustness at 65dd5f2): each value and the file and line it was
read from, and it resolves to built-in components only."""

from __future__ import annotations

from lipcli.builtins.lipconvnet.plugin import lip_recipes
from lipcli.builtins.lipconvnet.recipes import COMMIT, REPO
from lipcli.testing import check_recipe, plugin_registry, recipe_table

S, U = "train_robust.py", "utils.py"
TABLE = [
    ("arch", "lipconvnet-10", S, "--num-layers, line 48"),
    ("conv", "soc-fast", S, "--conv-layer soc + --fast-train, lines 41-43"),
    ("activation", "maxmin", S, "--activation, line 46"),
    ("pool", "projection", S, "--pooling lip1, line 47"),
    ("head", "mlp:hidden=4096", S, "--last-layer crc_full + --num-hidden, lines 45-50"),
    ("loss", "crc-lip", S, "--last-layer crc_full, --beta; lines 212-220"),
    ("dataset", "cifar10", S, "--dataset, line 55"),
    ("epochs", 200, S, "--epochs, line 27"),
    ("batch_size", 128, S, "--batch-size, line 25"),
    ("optimizer", "sgd", S, "torch.optim.SGD, line 160"),
    ("lr", 0.1, S, "--lr-max, line 29"),
    ("momentum", 0.9, S, "--momentum, line 31"),
    ("weight_decay", 5e-4, S, "--weight-decay, line 30"),
    ("schedule", "step", S, "MultiStepLR, line 175"),
    ("lr_milestones", [0.5, 0.75], S, "milestones lr_steps // 2, 3 * lr_steps // 4, lines 175-176"),
    ("lr_gamma", 0.1, S, "gamma=0.1, line 176"),
    ("warmup_epochs", 0.0, S, "no warm-up in the training loop, lines 199-235"),
    ("grad_clip", 1.0, S, "--clip-norm, line 32"),
    ("augment", True, U, "RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 37-38"),
    ("seed", 0, S, "--seed, line 63"),
]


def test_values_and_their_sources_are_the_authors():
    (spec,) = lip_recipes()
    assert recipe_table(spec) == TABLE
    assert {(s.repo, s.commit) for s in spec.sources.values()} == {(REPO, COMMIT)}
    (reported,) = spec.reported
    assert (reported.clean, reported.certified) == (79.57, {"36/255": 66.75, "72/255": 53.17, "108/255": 38.60})


def test_it_resolves_to_builtin_components():
    (spec,) = lip_recipes()
    settings = check_recipe(spec, plugin_registry())  # built-ins only: no plugin needed
    assert settings["lr_milestones"] == [0.5, 0.75] and settings["head"] == "mlp:hidden=4096"
