"""``lip certify --limit N`` and ``lip train --limit-test N`` evaluate the same points: a seeded
subset stratified by class (issue 26 item 11; certify took the first N points, which on an
image folder sorted by class are mostly one class)."""

from __future__ import annotations

import csv
import json
from collections import Counter

from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.data.loaders import load_data, resolve_dataset, stratified_indices

from conftest import save_tiny_model, write_imagefolder

runner = CliRunner()
CLASSES = ("a", "b", "c")


def test_stratified_indices_share_classes_and_are_seeded():
    labels = [0] * 50 + [1] * 30 + [2] * 20
    chosen = stratified_indices(labels, 10)
    assert Counter(labels[i] for i in chosen) == {0: 5, 1: 3, 2: 2}
    assert chosen == sorted(set(chosen)) == stratified_indices(labels, 10)
    assert chosen != stratified_indices(labels, 10, seed=1)
    assert stratified_indices(labels, 7) != list(range(7))
    assert len(stratified_indices(labels, 2)) == 2 and stratified_indices(labels, 200) == list(range(100))


def test_certify_limit_is_the_subset_lip_train_tests_on(tmp_path):
    root = write_imagefolder(tmp_path / "data", classes=CLASSES, test_per_class=4)
    dataset = {"name": "imagefolder", "params": {}, "num_classes": 3, "classes": list(CLASSES),
               "root": str(root)}
    model = save_tiny_model(tmp_path / "m.safetensors", dataset=dataset, num_classes=3)
    csv_path = tmp_path / "ps.csv"
    res = runner.invoke(app, ["certify", str(model), "--limit", "6", "--radii", "36", "--no-write",
                              "--per-sample", str(csv_path), "-q", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(csv_path.open()))
    assert Counter(r["label"] for r in rows) == {"0": 2, "1": 2, "2": 2}  # not the first 6: a, a, a, a, b, b
    assert any("class-stratified" in note for note in json.loads(res.stdout)["notes"])
    picked = [int(r["index"]) for r in rows]
    for seed in (0, 7):  # lip train --limit-test 6 with any --seed
        bundle = load_data(resolve_dataset("imagefolder"), str(root), augment=False, limit_test=6, seed=seed)
        assert list(bundle.test.indices) == picked


def test_help_says_so():
    for args, option in ((["certify", "--help"], "--limit"), (["train", "--help"], "--limit-test")):
        text = " ".join(runner.invoke(app, args, terminal_width=200).stdout.split())
        assert "stratified by class" in text.split(option, 1)[1][:300]
