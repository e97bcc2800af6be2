"""load_recipes: recipes written as TOML data, with one source per value, a shared origin,
``base`` recipes, and one clear error naming the file and the recipe."""

from __future__ import annotations

import pytest

from lipcli.sdk.recipe_files import load_recipes

HEAD = 'repo = "o/r"\ncommit = "' + "e" * 40 + '"\npaper = "P"\n\n'
GOOD = HEAD + '''[recipes.a]
version = "1"
description = "a recipe"
values.lr = { value = 0.5, path = "train.py", key = "--lr, line 3", note = "per step" }
values.milestones = { value = [0.5, 0.75], path = "train.py", key = "line 9" }

[[recipes.a.reported]]
dataset = "cifar10"
clean = 80.0
certified = { "36/255" = 70.0 }
source = "Table 1"

[recipes.b]
base = "a"
version = "2"
description = "a with more epochs"
pending = ["something lipcli lacks"]
values.epochs = { value = 9, path = "cfg.yaml", key = "epochs", note = "" }
'''


def test_values_sources_reported_and_base(tmp_path):
    path = tmp_path / "recipes.toml"
    path.write_text(GOOD)
    a, b = load_recipes(path)
    assert (a.label, a.paper, a.values) == ("a@1", "P", {"lr": 0.5, "milestones": [0.5, 0.75]})
    assert a.sources["lr"].text() == "o/r@eeeeeee:train.py (--lr, line 3); per step"
    assert a.reported[0].certified == {"36/255": 70.0}
    assert b.values == {"lr": 0.5, "milestones": [0.5, 0.75], "epochs": 9}
    assert b.reported == a.reported and b.pending == ("something lipcli lacks",)


@pytest.mark.parametrize(("body", "words"), [
    ('[recipes.x]\nversion = "1"\ndescription = "d"\nvalues.lr = { value = 1.0, path = "p" }\n', "recipe 'x'"),
    ('[recipes.x]\nversion = "1"\ndescription = "d"\nvalues.lr = { value = 1.0, path = "p", key = "k", line = 3 }\n',
     "unknown: ['line']"),
    ('[recipes.x]\ndescription = "d"\n', "recipe 'x'"),
    ('[recipes.x]\nbase = "later"\nversion = "1"\ndescription = "d"\n', "recipe 'x'"),
    ("", "no [recipes.NAME] tables"),
])
def test_a_malformed_file_names_the_file_and_the_recipe(tmp_path, body, words):
    path = tmp_path / "recipes.toml"
    path.write_text(HEAD + body)
    with pytest.raises(ValueError) as info:
        load_recipes(path)
    assert str(path) in str(info.value) and words in str(info.value)
