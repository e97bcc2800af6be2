"""The recipes ``lot`` and ``lot-residual`` are the table of the authors' values
(``recipes.tsv``, written from AI-secure/Layerwise-Orthogonal-Training) and resolve to
installed components; the residual recipe differs from ``lot`` only in its network, the
authors' LipResNet (``lipresnet-<n>``) with residuals in it."""

from pathlib import Path

from lipcli.testing import check_recipes
from lipcli_lot.plugin import lip_recipes


def test_the_recipes_are_the_authors_table_and_resolve():
    check_recipes(lip_recipes(), Path(__file__).with_name("recipes.tsv"))


def test_the_residual_recipe_differs_only_in_its_residual_network():
    plain, residual = lip_recipes()
    differ = {key for key in plain.values if plain.values[key] != residual.values[key]}
    assert differ == {"arch"} and set(residual.values) == set(plain.values)
    name = residual.values["arch"].split(":")[0]
    # LipResNet-n has residuals from 3 blocks per stage on (n >= 15); below it is LipConvnet-n
    assert name.startswith("lipresnet-") and int(name.split("-")[1]) >= 15
