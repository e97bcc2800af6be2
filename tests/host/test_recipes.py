"""Recipes resolve against the installed components: an unknown recipe, another version or a
recipe naming a component (or parameter) that is not installed is one line, at resolve time."""

from __future__ import annotations

import pytest

from lipcli.host import plugins
from lipcli.host.recipes import overrides, problems, resolve_recipe, split_label
from lipcli.sdk.errors import LipUsageError, UnknownComponentError
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import RecipeSource, RecipeSpec

SRC = RecipeSource(repo="o/r", commit="c" * 40, path="cfg.yaml", key="k")


def _recipe(name: str, **values) -> RecipeSpec:
    return RecipeSpec(name=name, version="2", paper="P", description="test recipe", values=values,
                      sources={k: SRC for k in values})


class BrokenRecipes:
    @hookimpl
    def lip_recipes(self):
        return [_recipe("t-missing-arch", arch="no-such-arch", lr=0.1),
                _recipe("t-bad-param", arch="lipconvnet-5:depth=3", conv="soc-fast"),
                _recipe("t-good", arch="lipconvnet-5:width=8", loss="ce", lr=0.5)]


@pytest.fixture(scope="module")
def registry():
    host = plugins.create_host(autoload=False)
    host.register(BrokenRecipes(), "broken-recipes")
    return host.registry()


def test_a_good_recipe_resolves_with_or_without_its_version(registry):
    assert resolve_recipe(registry, "t-good").values["lr"] == 0.5
    assert resolve_recipe(registry, " t-good@2 ").name == "t-good"
    assert problems(registry, registry.get("recipe", "t-good")) == []


def test_the_builtin_recipe_resolves(registry):
    assert resolve_recipe(registry, "lipconvnet").values["arch"] == "lipconvnet-10"


@pytest.mark.parametrize(("text", "error", "words"), [
    ("no-such-recipe", UnknownComponentError, "unknown recipe 'no-such-recipe'; valid names: "),
    ("t-good@3", LipUsageError, "recipe 't-good' is installed at version 2, not 3"),
    ("t-good@", LipUsageError, "bad recipe 't-good@'"),
    ("t-missing-arch", LipUsageError, "recipe t-missing-arch@2 (distribution (in-process)) cannot be used "
                                      "here: arch 'no-such-arch': unknown arch 'no-such-arch'"),
    ("t-bad-param", LipUsageError, "cannot be used here: arch 'lipconvnet-5:depth=3': arch 'lipconvnet-5' "
                                   "has no parameter 'depth'"),
])
def test_refusals_are_one_line_naming_the_value(registry, text, error, words):
    with pytest.raises(error) as info:
        resolve_recipe(registry, text)
    message = str(info.value)
    assert words in message and "\n" not in message


def test_the_unknown_recipe_message_lists_the_installed_ones(registry):
    with pytest.raises(UnknownComponentError) as info:
        resolve_recipe(registry, "nope")
    assert "lipconvnet" in str(info.value) and "t-good" in str(info.value)


def test_split_label():
    assert split_label("a@1") == ("a", "1") and split_label("a") == ("a", None)
    with pytest.raises(LipUsageError):
        split_label("@1")


def test_overrides_are_the_given_settings_that_differ_from_the_recipe(registry):
    spec = registry.get("recipe", "t-good")
    final = {"arch": "lipconvnet-5:width=8", "loss": "ce", "lr": 0.25, "epochs": 2, "seed": 0}
    got = overrides(spec, final, {"lr", "epochs", "loss"})
    assert got == {"epochs": {"recipe": None, "value": 2}, "lr": {"recipe": 0.5, "value": 0.25}}
