"""The recipes ``lot`` and ``lot-residual`` are the table of the authors' values
(``recipes.tsv``, written from AI-secure/Layerwise-Orthogonal-Training) and resolve to
installed components; the residual recipe differs only by its pending residual form."""

from pathlib import Path

from lipcli.testing import check_recipes
from lipcli_lot.plugin import lip_recipes


def test_the_recipes_are_the_authors_table_and_resolve():
    check_recipes(lip_recipes(), Path(__file__).with_name("recipes.tsv"))


def test_the_residual_recipe_adds_only_the_pending_residual_form():
    plain, residual = lip_recipes()
    assert residual.values == plain.values and residual.sources == plain.sources
    assert "--residual" in residual.pending[0] and set(plain.pending) < set(residual.pending)
