"""``lip bench train --recipe NAME``: each recipe's network (its arch and layer components,
lipcli's defaults for the others, the benchmark's width) is timed beside LipConvnet-5 with
lipcli's defaults; the JSON report names every row's network; bad input is one line, exit 2.
No timing assertions."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from lipcli.bench.models import count_parameters
from lipcli.bench.recipes import REFERENCE_ARCH, recipe_network, split_recipe_names
from lipcli.cli import app
from lipcli.host.models import DEFAULTS, create_model
from lipcli.host.plugins import get_registry
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.specs import RecipeSource, RecipeSpec

TINY = ["--width", "4", "--batch-size", "2", "--steps", "1", "--warmup", "0", "--device", "cpu",
        "--threads", "1", "--quiet", "--no-memory"]


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _spec(**values) -> RecipeSpec:
    source = RecipeSource(repo="o/n", commit="0" * 40, path="p.py", key="k")
    return RecipeSpec(name="t", version="1", paper="p", description="d", values=values,
                      sources={key: source for key in values})


def test_the_network_is_the_recipes_layers_with_lipclis_defaults_for_the_rest():
    net = recipe_network(_spec(arch="lipconvnet-10:width=32", conv="bro:rank_ratio=0.125", lr=0.1))
    assert net == {**DEFAULTS, "arch": "lipconvnet-10:width=32", "conv": "bro:rank_ratio=0.125"}
    builtin = get_registry().get("recipe", "lipconvnet")
    assert recipe_network(builtin) == {"arch": "lipconvnet-10", "conv": "soc-fast", "activation": "maxmin",
                                       "pool": "projection", "head": "mlp:hidden=4096"}
    with pytest.raises(LipUsageError):
        recipe_network(_spec(lr=0.1))


def test_recipe_names_repeat_or_come_as_a_comma_list():
    assert split_recipe_names(["lot,bronet", " sll-small "]) == ["lot", "bronet", "sll-small"]
    for bad in (["lot,"], [",lot"], ["lot,,bronet"], []):
        with pytest.raises(LipUsageError):
            split_recipe_names(bad)


def test_recipe_rows_beside_lipconvnet5_json_report():
    result = CliRunner().invoke(app, ["bench", "train", *TINY, "--recipe", "lipconvnet", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["benchmark"] == "train-components"
    assert report["settings"]["choices"] == {"recipe": ["lipconvnet@1"]} and report["settings"]["width"] == 4
    rows = report["results"][0]["variants"]
    assert [row["label"] for row in rows] == [REFERENCE_ARCH, "lipconvnet@1"]
    assert rows[0]["components"] == {"arch": REFERENCE_ARCH, **DEFAULTS}
    assert rows[1]["components"]["arch"] == "lipconvnet-10" and rows[1]["components"]["head"] == "mlp:hidden=4096"
    assert rows[0]["relative_to_reference"] == 1.0
    # the recipe's network at the benchmark's width
    model = create_model("lipconvnet-10", conv="soc-fast", pool="projection", head="mlp:hidden=4096", width=4)
    assert rows[1]["parameters"] == count_parameters(model)
    # the recipe's own optimiser timed apart (lipcli's reference row has none)
    assert "optimizer" not in rows[0]
    opt = rows[1]["optimizer"]
    assert opt["name"] == get_registry().get("recipe", "lipconvnet").values.get("optimizer", "sgd")
    assert opt["step_ms"] > 0 and opt["sgd_step_ms"] > 0 and 0 < opt["share"] < 1


def test_a_recipe_can_have_its_own_width():
    result = CliRunner().invoke(app, ["bench", "train", *TINY, "--recipe", "lipconvnet", "--recipe-widths",
                                      "lipconvnet=2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"][0]["variants"]
    assert rows[1]["components"]["width"] == "2" and "width" not in rows[0]["components"]
    for row, width in ((rows[0], 4), (rows[1], 2)):  # the reference keeps --width
        arch = row["components"]["arch"]
        parts = {k: v for k, v in row["components"].items() if k not in ("arch", "width")}
        assert row["parameters"] == count_parameters(create_model(arch, width=width, **parts))


def test_a_manifold_optimiser_is_timed_as_the_recipe_builds_it():
    pytest.importorskip("lipcli_lipnext")
    result = CliRunner().invoke(app, ["bench", "train", *TINY, "--recipe", "lipnext", "--json"])
    assert result.exit_code == 0, result.output
    opt = json.loads(result.stdout)["results"][0]["variants"][1]["optimizer"]
    recipe = get_registry().get("recipe", "lipnext").values["optimizer"]
    assert opt["name"] == recipe and opt["name"].startswith("so-adam")
    assert opt["step_ms"] > 0 and 0 < opt["share"] < 1


@pytest.mark.parametrize("args, words", [
    (["--recipe", "no-such-recipe"], "unknown recipe 'no-such-recipe'"),
    (["--recipe", "lipconvnet,"], "bad --recipe"),
    (["--recipe", "lipconvnet", "--conv", "soc"], "drop --conv/--activation"),
    (["--recipe", "lipconvnet", "--recipe-widths", "lot=8"], "bad --recipe-widths"),
    (["--recipe", "lipconvnet", "--recipe-widths", "lipconvnet=0"], "bad --recipe-widths"),
    (["--recipe-widths", "lipconvnet=8"], "needs --recipe"),
])
def test_bad_recipes_exit_2_with_one_line(args, words):
    result = CliRunner().invoke(app, ["bench", "train", *TINY, *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and words in result.stderr
