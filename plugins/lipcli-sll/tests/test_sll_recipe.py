"""The recipe ``sll-small`` is the table of the authors' values (``recipes.tsv``, written from
araujoalexandre/Lipschitz-SLL-Networks) and resolves to installed components: it names
the authors' network ``sll-small`` and ``sll`` (this distribution) and ``la``
(lipcli-logit-annealing)."""

from pathlib import Path

import pytest

from lipcli.testing import check_recipes
from lipcli_sll.plugin import lip_recipes


def test_the_recipe_is_the_authors_table_and_resolves():
    pytest.importorskip("lipcli_logit_annealing")
    check_recipes(lip_recipes(), Path(__file__).with_name("recipes.tsv"))
