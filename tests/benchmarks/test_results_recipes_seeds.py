"""benchmarks/results_recipes_seeds.py: which commands each recipe's two configs run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import results_recipes_seeds as rrs  # noqa: E402

VALUES = {"liresnet": {"arch": "liresnet:depth=12,width=512", "activation": "maxmin", "head": "lln",
                       "loss": "emma:eps=0.1", "optimizer": "nadam", "lr": 0.001, "epochs": 800,
                       "warmup_epochs": 20.0, "dataset": "cifar10"},
          "lot": {"arch": "lipconvnet-5:width=32", "conv": "lot:iterations=10", "epochs": 200,
                  "optimizer": "sgd"}}


def _opts(args: list[str]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2]))


def test_recipe_config_changes_only_the_budget():
    runs = rrs.configs(VALUES, epochs=30)
    recipe = _opts(runs["liresnet@recipe"])
    # the recipe's own values apply; only epochs, width and the warm-up (scaled 30/800) are given
    assert recipe == {"--recipe": "liresnet", "--epochs": "30", "--width": "128",
                      "--warmup-epochs": "0.75"}
    assert _opts(runs["lot@recipe"]) == {"--recipe": "lot", "--epochs": "30"}


def test_defaults_config_keeps_the_network_and_drops_the_training_settings():
    runs = rrs.configs(VALUES, epochs=30)
    defaults = _opts(runs["liresnet@defaults"])
    # the scaled width replaces the one inside the arch (lip train refuses two widths)
    assert defaults == {"--epochs": "30", "--arch": "liresnet:depth=12,width=128",
                        "--activation": "maxmin", "--head": "lln"}
    assert not {"--optimizer", "--lr", "--loss", "--recipe"} & set(defaults)
    assert _opts(runs["lot@defaults"])["--conv"] == "lot:iterations=10"


def test_reference_config_and_only_installed_recipes():
    runs = rrs.configs(VALUES, epochs=7)
    assert _opts(runs["lc5@defaults"]) == {"--arch": "lipconvnet-5", "--width": "8", "--epochs": "7"}
    assert set(runs) == {"lc5@defaults", "liresnet@recipe", "liresnet@defaults", "lot@recipe",
                         "lot@defaults"}


def test_widths_override_reaches_recipe_and_defaults():
    runs = rrs.configs(VALUES, epochs=1, widths=dict.fromkeys(rrs.WIDTHS, 8))
    assert _opts(runs["liresnet@recipe"])["--width"] == "8"
    assert _opts(runs["liresnet@defaults"])["--arch"] == "liresnet:depth=12,width=8"
    assert _opts(runs["lot@defaults"])["--arch"] == "lipconvnet-5:width=8"


def test_widths_option_replaces_only_the_named_recipes():
    widths = rrs.parse_widths("liresnet=16,lot=8")
    assert widths["liresnet"] == 16 and widths["lot"] == 8
    assert {k: v for k, v in widths.items() if k not in ("liresnet", "lot")} == \
        {k: v for k, v in rrs.WIDTHS.items() if k not in ("liresnet", "lot")}
    assert _opts(rrs.configs(VALUES, 30, widths)["lot@recipe"])["--width"] == "8"
    _refused(rrs.parse_widths, ("nosuch=8", "lot=x", "lot"), "RECIPE=WIDTH")


def test_arch_set_reaches_both_configs_with_one_width():
    arch_set = rrs.parse_arch_set("liresnet:dense_width=256,depth=6")
    runs = rrs.configs(VALUES, 30, dict(rrs.WIDTHS, liresnet=16), arch_set)
    recipe, defaults = _opts(runs["liresnet@recipe"]), _opts(runs["liresnet@defaults"])
    assert recipe["--arch"] == defaults["--arch"] == "liresnet:depth=6,width=16,dense_width=256"
    assert "--width" not in recipe and "--width" not in defaults  # lip train refuses two widths
    assert recipe["--recipe"] == "liresnet" and recipe["--warmup-epochs"] == "0.75"
    assert rrs.set_params("lipconvnet-10", {"hidden": "8"}) == "lipconvnet-10:hidden=8"
    _refused(rrs.parse_arch_set, ("nosuch:a=1", "liresnet:", "liresnet:a="), "RECIPE:KEY=VALUE")


def _refused(parse, bad_values, message: str) -> None:
    """Each bad value stops the runner with one message naming the expected form."""
    for bad in bad_values:
        with pytest.raises(SystemExit, match=message):
            parse(bad)
