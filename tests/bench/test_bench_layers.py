"""``lip bench layers``: one row per convolution in the study's network, ``--json`` the same
rows, a plot, bad input one line."""

from __future__ import annotations

import json

import pytest

from lipcli.testing import run_lip

pytest.importorskip("lipcli_compared")
ARGS = ["bench", "layers", "--width", "4", "--steps", "1", "--warmup", "0", "--batch-size", "4"]


def test_rows_json_and_plot(tmp_path):
    plot = tmp_path / "layers.png"
    results = tmp_path / "scores.json"
    results.write_text(json.dumps({"cpl": 0.5, "aol": 0.4}))
    r = run_lip([*ARGS, "--conv", "cpl,aol", "--json", "--plot", str(plot), "--results", str(results)])
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["benchmark"] == "layers" and report["arch"] == "convnet-xs"
    rows = {row["conv"]: row for row in report["rows"]}
    assert set(rows) == {"cpl", "aol"}
    for row in rows.values():
        assert row["error"] is None and row["parameters"] > 0
        assert row["train_step_ms"] > 0 and row["inference_ms"] > 0
        assert 1.0 <= row["lipschitz_bound"] < 1.01
    assert rows["cpl"]["distribution"] == "lipcli-cpl"
    assert plot.stat().st_size > 1000


def test_table_lists_every_requested_conv():
    r = run_lip([*ARGS, "--conv", "cpl,sandwich", "-q"])
    assert r.exit_code == 0, r.stderr
    assert "cpl" in r.stdout and "sandwich" in r.stdout and "params" in r.stdout


def test_unknown_conv_is_one_line():
    r = run_lip([*ARGS, "--conv", "nope"])
    assert r.exit_code == 2 and "nope" in r.stderr and "Traceback" not in r.stderr


def test_network_comes_from_the_recipe_and_options_replace_it():
    r = run_lip([*ARGS, "--conv", "aol", "--recipe", "lipconvnet", "--head", "lln", "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    # the arch from the paper's recipe, the head given
    assert (report["arch"], report["head"]) == ("lipconvnet-10", "lln")


def test_unknown_recipe_is_one_line():
    r = run_lip([*ARGS, "--conv", "aol", "--recipe", "nope"])
    assert r.exit_code == 2 and "--recipe nope" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
