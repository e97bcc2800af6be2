"""The recipe ``liresnet`` is the table of the authors' values (``recipes.tsv``, written from
hukkai/liresnet's configs/cifar10.yaml and train.py) and resolves to installed components."""

from pathlib import Path

from lipcli.testing import check_recipes
from lipcli_liresnet.plugin import lip_recipes


def test_the_recipe_is_the_authors_table_and_resolves():
    check_recipes(lip_recipes(), Path(__file__).with_name("recipes.tsv"))
