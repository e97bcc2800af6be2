"""``lip train --recipe NAME``: the recipe's values are the defaults, a flag given changes only
its own value, the model file, ``lip info`` and ``--resume`` keep the recipe and every setting
given over it, ``lip plugins -v`` lists recipes with their values, and bad recipes are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.plugins import get_registry
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import RecipeSource, RecipeSpec
from lipcli.testing import read_model_metadata, registered, run_lip

runner = CliRunner()
RECIPE = "lipconvnet"
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--epochs", "1", "--head", "mlp:hidden=32", "--device", "cpu",
        "--no-lipschitz-estimate"]


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture()
def captured(monkeypatch):
    """The config a ``lip train`` command line would train (the driver is not run)."""
    import lipcli.train as T

    seen = []
    monkeypatch.setattr(T, "train", lambda cfg, **kwargs: seen.append(cfg) or {})

    def config_of(*args: str):
        result = runner.invoke(app, ["train", *args])
        assert result.exit_code == 0, result.output
        return seen[-1]
    return config_of


def test_the_recipe_values_are_the_defaults(captured):
    spec = get_registry().get("recipe", RECIPE)
    cfg = captured("--recipe", RECIPE, "--dataset", "digits")
    for key, value in spec.values.items():
        if key != "dataset":
            assert getattr(cfg, key) == value, key
    assert cfg.recipe == f"{RECIPE}@{spec.version}"
    assert cfg.recipe_overrides == {"dataset": {"recipe": "cifar10", "value": "digits"}}


@pytest.mark.parametrize(("flag", "value", "key", "parsed"), [
    ("--lr", "0.05", "lr", 0.05), ("--epochs", "3", "epochs", 3), ("--optimizer", "nadam", "optimizer", "nadam"),
    ("--pool", "max", "pool", "max"), ("--no-augment", None, "augment", False),
])
def test_overriding_one_flag_changes_only_that_value(captured, flag, value, key, parsed):
    base = captured("--recipe", RECIPE, "--dataset", "digits").to_json()
    over = captured("--recipe", RECIPE, "--dataset", "digits", flag, *([value] if value else [])).to_json()
    assert {k for k in base if base[k] != over[k]} == {key, "recipe_overrides"}
    assert over[key] == parsed
    recipe_value = get_registry().get("recipe", RECIPE).values[key]
    assert over["recipe_overrides"][key] == {"recipe": recipe_value, "value": parsed}


def test_a_settings_file_may_name_the_recipe_and_the_command_line_still_wins(captured, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text(f'recipe = "{RECIPE}@1"\ndataset = "digits"\nlr = 0.02\n')
    cfg = captured("--config", str(conf), "--lr", "0.03")
    assert cfg.recipe == f"{RECIPE}@1" and cfg.lr == 0.03 and cfg.pool == "projection"
    assert cfg.recipe_overrides["lr"] == {"recipe": 0.1, "value": 0.03}


def test_without_a_recipe_nothing_is_recorded(captured):
    cfg = captured("--dataset", "digits")
    assert cfg.recipe is None and cfg.recipe_overrides == {} and cfg.pool == "max"


class MissingComponentRecipe:
    @hookimpl
    def lip_recipes(self):
        source = RecipeSource(repo="o/r", commit="d" * 40, path="cfg.yaml", key="model")
        return [RecipeSpec(name="t-needs-plugin", version="1", paper="P", description="needs a plugin",
                           values={"conv": "no-such-conv"}, sources={"conv": source}),
                RecipeSpec(name="t-warm", version="1", paper="P", description="warms up",
                           values={"warmup_epochs": 5.0, "epochs": 10},
                           sources={"warmup_epochs": source, "epochs": source})]


@pytest.mark.parametrize(("args", "words"), [
    (["--recipe", "no-such-recipe"], "unknown recipe 'no-such-recipe'; valid names: "),
    (["--recipe", f"{RECIPE}@9"], f"recipe '{RECIPE}' is installed at version 1, not 9"),
    (["--recipe", "t-needs-plugin"], "recipe t-needs-plugin@1 (distribution (in-process)) cannot be used "
                                     "here: conv 'no-such-conv': unknown conv 'no-such-conv'"),
    (["--recipe", RECIPE, "--resume", "somewhere"], "--resume keeps the run's recipe and settings; drop --recipe"),
    (["--recipe", "t-warm", "--epochs", "2"], "recipe t-warm@1 warms up for 5 epochs, more than --epochs 2; "
                                              "give --warmup-epochs too"),
])
def test_bad_recipes_are_one_line_exit_2(args, words):
    with registered(("missing-component-recipe", MissingComponentRecipe())):
        result = runner.invoke(app, ["train", "--dataset", "digits", *args])
    assert result.exit_code == 2, result.output
    assert words in one_error_line(result)


def test_plugins_lists_recipes_with_their_values_and_sources():
    text = runner.invoke(app, ["plugins", "-v"], terminal_width=200).stdout
    assert f"recipe {RECIPE}@1: Singla & Feizi" in text
    assert "lipconvnet-10" in text and "train_robust.py (--num-layers, line 48)" in text
    assert "reported on cifar10: clean 79.57%" in text
    data = json.loads(runner.invoke(app, ["plugins", "--json"]).stdout)
    entry = next(r for r in data["components"]["recipes"] if r["name"] == RECIPE)
    assert entry["values"]["optimizer"] == "sgd" and entry["problems"] == []
    assert entry["sources"]["lr"]["key"] == "--lr-max, line 29"


def _check_recorded(model: Path) -> None:
    config = read_model_metadata(model)["training"]["config"]
    assert config["recipe"] == f"{RECIPE}@1"
    assert config["recipe_overrides"]["epochs"] == {"recipe": 200, "value": 1}
    assert config["recipe_overrides"]["head"] == {"recipe": "mlp:hidden=4096", "value": "mlp:hidden=32"}
    spec = get_registry().get("recipe", RECIPE)
    for key in ("optimizer", "lr", "momentum", "weight_decay", "grad_clip", "pool", "conv", "schedule"):
        assert config[key] == spec.values[key], key


def test_a_recipe_run_records_the_recipe_through_resume_and_lip_info(tmp_path):
    model, run_dir = tmp_path / "m.safetensors", tmp_path / "run"
    args = ["train", "--recipe", RECIPE, *TINY, "--out", str(model), "--run-dir", str(run_dir)]
    stopped = runner.invoke(app, args, env={"LIPCLI_TRAIN_INTERRUPT_AT": "0:1"})
    assert stopped.exit_code == 130, stopped.output
    resumed = runner.invoke(app, ["train", "--resume", str(run_dir)])
    assert resumed.exit_code == 0, resumed.output
    _check_recorded(model)
    card = runner.invoke(app, ["info", str(model)], terminal_width=200).stdout
    assert f"recipe: {RECIPE}@1; settings given over it: " in card and "epochs 1 (recipe 200)" in card
    data = json.loads(runner.invoke(app, ["info", str(model), "--json"]).stdout)
    assert data["recipe"]["name"] == f"{RECIPE}@1"
    assert data["recipe"]["overrides"]["epochs"] == {"recipe": 200, "value": 1}


def test_a_recipe_run_in_a_real_process(tmp_path):
    model = tmp_path / "m.safetensors"
    result = run_lip(["train", "--recipe", RECIPE, *TINY, "--out", str(model)], subprocess=True)
    assert result.exit_code == 0, result.stderr
    _check_recorded(model)


def test_models_without_a_recipe_show_none(tiny_model_file):
    data = json.loads(runner.invoke(app, ["info", str(tiny_model_file), "--json"]).stdout)
    assert data["recipe"] is None
    assert "recipe:" not in runner.invoke(app, ["info", str(tiny_model_file)]).stdout
