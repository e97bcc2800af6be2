"""Every installed recipe trains: ``lip train --recipe NAME`` for one epoch on 64 digits at width
4 (the recipe's network otherwise, warm-up off) exits 0 with a finite training loss, a model
file and a finite Lipschitz bound.  Slow (about 3 minutes for all recipes on one CPU core)."""

from __future__ import annotations

import json
import math

import pytest

from lipcli.host.plugins import get_registry
from lipcli.testing import read_model_metadata, run_lip

pytestmark = pytest.mark.slow

TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--epochs", "1", "--warmup-epochs", "0", "--device", "cpu",
        "--no-lipschitz-estimate"]


@pytest.mark.parametrize("name", sorted(get_registry().names("recipe")))
def test_each_recipe_trains_one_epoch_with_a_finite_loss(name, tmp_path):
    model = tmp_path / "m.pt"
    result = run_lip(["train", "--recipe", name, *TINY, "--out", str(model),
                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.stderr
    data = read_model_metadata(model)
    history = data["training"]["history"]
    assert len(history) == 1 and math.isfinite(history[0]["train_loss"]), history
    bound = data["lipschitz"]["upper_bound"]
    assert math.isfinite(bound) and bound > 0
    info = run_lip(["info", str(model), "--json"])
    assert json.loads(info.stdout)["recipe"]["name"].startswith(f"{name}@")
