"""lipcli.testing.check_recipes fails on any difference from the table: a value, its type,
its file or key, a missing or an extra row."""

from __future__ import annotations

import json

import pytest

from lipcli.builtins.lipconvnet.plugin import lip_recipes
from lipcli.testing import check_recipes, plugin_registry, recipe_table


def _write(tmp_path, rows):
    path = tmp_path / "t.tsv"
    path.write_text("# a comment\n" + "".join(
        "\t".join([r[0], r[1], json.dumps(r[2]), r[3], r[4]]) + "\n" for r in rows))
    return path


def test_the_exact_table_passes(tmp_path):
    check_recipes(lip_recipes(), _write(tmp_path, recipe_table(lip_recipes()[0])), plugin_registry())


@pytest.mark.parametrize("change", ["value", "type", "file", "key", "missing", "extra"])
def test_any_difference_fails(tmp_path, change):
    rows = [list(r) for r in recipe_table(lip_recipes()[0])]
    lr = next(r for r in rows if r[1] == "lr")
    if change == "value":
        lr[2] = 0.2
    elif change == "type":
        rows = [r if r[1] != "epochs" else [*r[:2], float(r[2]), *r[3:]] for r in rows]
    elif change == "file":
        lr[3] = lr[3].replace("train_robust.py", "train.py")
    elif change == "key":
        lr[4] = "--lr, line 1"
    elif change == "missing":
        rows.pop()
    else:
        rows.append(list(rows[-1]))
    with pytest.raises(AssertionError):
        check_recipes(lip_recipes(), _write(tmp_path, rows), plugin_registry())
