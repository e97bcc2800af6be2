"""The recipes ``bronet`` and ``bronet-lipconvnet`` are the table of the authors' values
(``recipes.tsv``, written from ntuaislab/BRONet) and resolve to installed components: they name
``liresnet`` (lipcli-liresnet) and ``la`` (lipcli-logit-annealing) besides ``bro``."""

from pathlib import Path

import pytest

from lipcli.testing import check_recipes
from lipcli_bro.plugin import lip_recipes


def test_the_recipes_are_the_authors_table_and_resolve():
    pytest.importorskip("lipcli_liresnet")
    pytest.importorskip("lipcli_logit_annealing")
    check_recipes(lip_recipes(), Path(__file__).with_name("recipes.tsv"))
