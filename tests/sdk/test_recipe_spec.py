"""RecipeSpec: a recipe is a component kind with its own hook; every value has one source."""

from __future__ import annotations

import pytest

from lipcli.sdk import hookspecs
from lipcli.sdk.specs import SPEC_KINDS, Param, RecipeResult, RecipeSource, RecipeSpec

SRC = RecipeSource(repo="owner/repo", commit="a" * 40, path="train.py", key="--lr, line 3")


def make(**changes) -> RecipeSpec:
    fields = dict(name="t-recipe", version="1", paper="A paper", description="a test recipe",
                  values={"lr": 0.1, "epochs": 3}, sources={"lr": SRC, "epochs": SRC})
    fields.update(changes)
    return RecipeSpec(**fields)


def test_recipe_is_a_kind_with_its_own_hook():
    assert SPEC_KINDS["recipe"] is RecipeSpec
    assert hookspecs.HOOK_KINDS["lip_recipes"] == "recipe"


def test_factory_returns_a_copy_of_the_values_and_the_label_names_the_version():
    spec = make()
    first = spec.factory()
    first["lr"] = 99.0
    assert spec.factory() == {"lr": 0.1, "epochs": 3}
    assert spec.label == "t-recipe@1"


@pytest.mark.parametrize(("changes", "error", "words"), [
    ({"sources": {"lr": SRC}}, ValueError, "epochs"),  # a value without its source
    ({"sources": {"lr": SRC, "epochs": SRC, "seed": SRC}}, ValueError, "seed"),  # a source without a value
    ({"version": " "}, ValueError, "version"),
    ({"version": "1@2"}, ValueError, "version"),
    ({"paper": ""}, ValueError, "paper"),
    ({"params": (Param(name="x", type=int, default=1),)}, ValueError, "not params"),
    ({"values": {"lr": object(), "epochs": 3}}, TypeError, "'lr'"),
    ({"values": {"lr": [0.5, None], "epochs": 3}}, TypeError, "'lr'"),
])
def test_a_malformed_recipe_is_refused_naming_what(changes, error, words):
    with pytest.raises(error, match=words):
        make(**changes)


def test_lists_of_scalars_are_values():
    assert make(values={"lr": 0.1, "epochs": [0.5, 0.75]}).values["epochs"] == [0.5, 0.75]


def test_source_text_names_repository_commit_file_and_key():
    assert SRC.text() == "owner/repo@aaaaaaa:train.py (--lr, line 3)"
    noted = RecipeSource(repo="o/r", commit="b" * 40, path="c.yaml", key="k", note="why")
    assert noted.text() == "o/r@bbbbbbb:c.yaml (k); why"
    result = RecipeResult(dataset="cifar10", clean=80.0, certified={"36/255": 70.0}, source="Table 1")
    assert make(reported=(result,)).reported[0].certified["36/255"] == 70.0
