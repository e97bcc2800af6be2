"""An epoch is logged only once its checkpoint is saved: a run that dies while saving (here
the save raises, as an allocation failure under a memory limit would) leaves no log line for
the unsaved epoch, and no lock held."""

from __future__ import annotations

import json

import pytest

from lipcli.testing import run_lip


def test_no_log_line_for_an_epoch_whose_checkpoint_was_not_saved(tmp_path, monkeypatch):
    import lipcli.train.run as run_module

    calls = {"n": 0}
    real = run_module.write_checkpoint

    def failing(path, tensors, meta):
        calls["n"] += 1
        if calls["n"] >= 2:  # the first epoch is saved, the second is not
            raise MemoryError("simulated")
        real(path, tensors, meta)

    monkeypatch.setattr(run_module, "write_checkpoint", failing)
    (tmp_path / "s.toml").write_text('power_iter_steps = 3\nlipschitz_estimate = false\ndevice = "cpu"\n')
    out = tmp_path / "m.safetensors"
    result = run_lip(["train", "--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
                      "--limit-test", "32", "--epochs", "3", "--config", str(tmp_path / "s.toml"), "--out", str(out)])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1 and "out of memory" in errors[0], result.output
    assert "Traceback" not in result.output
    from lipcli.train import read_checkpoint

    _tensors, meta = read_checkpoint(tmp_path / "m-run" / "checkpoint.safetensors")
    log = (tmp_path / "m-run" / "train_log.jsonl")
    lines = log.read_text().splitlines() if log.exists() else []
    assert len(lines) == int(meta["epoch"]) < 3, (lines, meta["epoch"])
    assert not any(p.name.endswith(".lipcli.lock") for p in tmp_path.rglob(".*lipcli.lock"))
