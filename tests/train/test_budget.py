"""``lip train --time-budget``: durations parse (bad ones are one usage line), the step time is
measured first and fixes the epochs and the schedule, the model file records the plan and the
epochs run, the budget stops a run, and a resumed run keeps the first plan and counts the
training time already spent."""

from __future__ import annotations

import json

import pytest

from lipcli.testing import read_model_metadata, run_lip
from lipcli.train.budget import budget_exhausted, parse_duration
from lipcli.train import INTERRUPT_ENV, TrainConfig, read_checkpoint

TINY = ["train", "--dataset", "digits", "--width", "2", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--no-lipschitz-estimate", "-q"]


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("10m", 600), ("2h", 7200), ("1h30m", 5400),
                                           ("1.5h", 5400), ("45", 45), ("1d", 86400), (" 2H ", 7200)])
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "2x", "h", "10m5", "-1h", "400d", "1h 30q"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_bad_budget_is_one_usage_line(tmp_path):
    r = run_lip([*TINY, "--time-budget", "ten minutes", "-o", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2 and "time-budget" in r.stderr and "Traceback" not in r.stderr


def test_exhausted_only_with_a_budget():
    assert not budget_exhausted(TrainConfig(), 1e9)
    cfg = TrainConfig(time_budget="1m")
    assert not budget_exhausted(cfg, 59.0) and budget_exhausted(cfg, 60.0)


def test_budget_fixes_the_epochs_and_the_model_file_records_the_plan(tmp_path):
    out = tmp_path / "m.safetensors"
    r = run_lip([*TINY, "--time-budget", "3s", "--epochs", "1", "--schedule", "onecycle", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    training = read_model_metadata(out)["training"]
    plan = training["config"]["budget"]
    assert plan["budget_s"] == 3.0 and plan["epoch_s"] > 0 and plan["steps_timed"] >= 2
    assert plan["epochs"] == max(1, int(3.0 / plan["epoch_s"])) == training["config"]["epochs"]
    record = training["time_budget"]
    assert record["time_budget"] == "3s" and record["epochs_run"] == training["epochs"]
    assert record["stopped_on_budget"] == (training["epochs"] < plan["epochs"])
    assert record["train_time_s"] >= 3.0 or not record["stopped_on_budget"]


def test_the_warmup_keeps_its_share_of_the_schedule(tmp_path):
    out = tmp_path / "m.safetensors"
    r = run_lip([*TINY, "--time-budget", "2s", "--epochs", "800", "--warmup-epochs", "20", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    config = read_model_metadata(out)["training"]["config"]
    epochs = config["budget"]["epochs"]
    assert config["warmup_epochs"] == pytest.approx(epochs * 20 / 800) == config["budget"]["warmup_epochs"]


def test_resume_keeps_the_plan_and_counts_the_time_spent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "b" / "model.safetensors"
    r = run_lip([*TINY, "--time-budget", "1h", "-o", str(out)], env={INTERRUPT_ENV: "1:0"})
    assert r.exit_code == 130
    _, ck = read_checkpoint(tmp_path / "b" / "model-run" / "checkpoint.safetensors")
    planned = ck["config"]["epochs"]
    assert ck["config"]["budget"]["epochs"] == planned and ck["epoch"] == 1
    r = run_lip(["train", "--resume", "b/model-run", "--time-budget", "2h", "-q"])
    assert r.exit_code == 2 and "time-budget" in r.stderr  # the budget cannot change on resume
    # spend the budget: resume with the checkpoint's training time past it (honest accounting)
    path = tmp_path / "b" / "model-run" / "checkpoint.safetensors"
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        header = dict(fh.metadata())
    meta = json.loads(header["lipcli.checkpoint"]) if "lipcli.checkpoint" in header else None
    if meta is None:
        pytest.skip("checkpoint metadata layout unknown")
    meta["elapsed_s"] = 3600.0
    header["lipcli.checkpoint"] = json.dumps(meta)
    save_file(tensors, str(path), metadata=header)
    r = run_lip(["train", "--resume", "b/model-run", "-q", "--json"])
    assert r.exit_code == 0, r.stderr
    training = read_model_metadata(out)["training"]
    assert training["epochs"] == 1 and training["config"]["epochs"] == planned
    assert training["time_budget"]["stopped_on_budget"] is True


def test_the_measurement_runs_the_runs_own_step(tmp_path, monkeypatch):
    """The step timed is the run's (here AdamW; an SGD stand-in mis-timed a manifold optimiser
    twofold), on a copy: the run's own training is unchanged."""
    import torch
    from safetensors.torch import load_file

    import lipcli
    from lipcli.train.budget import WARMUP_STEPS

    calls = []
    adamw_step = torch.optim.AdamW.step

    def counting_step(self, *args, **kwargs):
        calls.append(self)  # held: no two optimisers share an id
        return adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counting_step)
    settings = dict(dataset="digits", width=2, batch_size=32, limit_train=64, limit_test=32,
                    lipschitz_estimate=False, optimizer="adamw", lr=1e-3, lr_gamma=1.0)  # a rate that ignores the epochs
    summary = lipcli.train(time_budget="2s", out=tmp_path / "m.safetensors", **settings)
    plan = read_model_metadata(tmp_path / "m.safetensors")["training"]["config"]["budget"]
    measured = WARMUP_STEPS + plan["steps_timed"]
    assert len(calls) == measured + summary.epochs * plan["steps_per_epoch"]
    assert all(o is calls[0] for o in calls[:measured]) and calls[measured] is not calls[0]  # a fresh one, then the run's
    # the copy left the run alone: the same epochs without a budget give the same weights
    lipcli.train(epochs=summary.epochs, out=tmp_path / "n.safetensors", **settings)
    a, b = load_file(tmp_path / "m.safetensors"), load_file(tmp_path / "n.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
