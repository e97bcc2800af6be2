"""``lip train`` on CUDA end to end (``cuda`` marker; skipped without a GPU): the digits quick
start (width 4, 2 epochs) trained with CUDA graphs and without gives the same losses up to
floating-point reordering, the graphed run really replays its graph, and ``lip certify
--attack`` finds no PGD counterexample to the graphed model's certificates."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.modelfile import read_metadata


@pytest.mark.cuda
def test_digits_with_and_without_cuda_graphs(tmp_path):
    runner = CliRunner()
    losses = {}
    for mode in ("on", "off"):
        out = tmp_path / mode / "model.safetensors"
        result = runner.invoke(app, [
            "train", "--dataset", "digits", "--arch", "lipconvnet-5", "--width", "4",
            "--epochs", "2", "--device", "cuda", "--cuda-graphs", mode, "--out", str(out),
            "--quiet", "--json"])
        assert result.exit_code == 0, result.output
        training = read_metadata(out)["training"]
        losses[mode] = [h["train_loss"] for h in training["history"]]
        if mode == "on":
            graphs = training["cuda_graphs"]
            assert graphs["captured"] and graphs["replays"] > 0, graphs
    for graphed, eager in zip(losses["on"], losses["off"]):
        assert graphed == pytest.approx(eager, rel=1e-3), losses
    result = runner.invoke(app, [
        "certify", str(tmp_path / "on" / "model.safetensors"), "--radii", "36,72,108",
        "--device", "cuda", "--attack", "--attack-steps", "20", "--attack-restarts", "1",
        "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["violations"] == 0
