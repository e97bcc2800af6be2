"""The built-in recipe ``lipconvnet`` against the authors' training script
(singlasahil14/improved_l2_robustness): each value and the file and line it was read from
(``lipconvnet_recipe.tsv``), and it resolves to built-in components only."""

from __future__ import annotations

from pathlib import Path

from lipcli.builtins.lipconvnet.plugin import lip_recipes
from lipcli.testing import check_recipes, plugin_registry


def test_the_recipe_is_the_authors_table_and_resolves_to_builtins():
    check_recipes(lip_recipes(), Path(__file__).with_name("lipconvnet_recipe.tsv"), plugin_registry())


def test_the_reported_accuracy_is_the_papers():
    (spec,) = lip_recipes()
    (reported,) = spec.reported
    assert (reported.dataset, reported.clean) == ("cifar10", 79.57)
    assert reported.certified == {"36/255": 66.75, "72/255": 53.17, "108/255": 38.60}
