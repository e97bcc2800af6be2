"""Training that cannot silently diverge: a non-finite gradient is never applied, the run stops
with one line (epoch, step, what to do), exit 1, and the last finite checkpoint resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import lipcli.train as T
from lipcli.cli import app
from lipcli.train import TrainingDiverged, read_checkpoint
from lipcli.train.guard import DivergenceGuard, grads_finite, load_keeping_lr
from lipcli.train.optim import make_schedule

runner = CliRunner()
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--no-lipschitz-estimate", "--device", "cpu", "--config", "tiny.toml", "-q"]


@pytest.fixture(autouse=True)
def tiny_toml(tmp_path):
    (tmp_path / "tiny.toml").write_text("power_iter_steps = 3\n")


def train(args: list[str]):
    return runner.invoke(app, ["train", *TINY, *args])


def weights_finite(run_dir: Path) -> tuple[int, bool]:
    tensors, meta = read_checkpoint(run_dir / "checkpoint.safetensors")
    return meta["epoch"], all(bool(torch.isfinite(v).all()) for k, v in tensors.items()
                              if k.startswith("model.") and v.is_floating_point())


def test_a_huge_learning_rate_stops_with_one_line_and_resumes_at_a_lower_one(tmp_path, monkeypatch):
    """(lr 1e6 only makes the loss huge: the network is 1-Lipschitz; 1e30 makes it NaN.)"""
    monkeypatch.chdir(tmp_path)
    r = train(["--epochs", "2", "--lr", "1e30", "--out", "m.safetensors"])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.stderr
    line = lines[0]
    assert line.startswith("error: training diverged at epoch 1 step "), line
    assert "(after epoch 0) is kept in m-run" in line and "lip train --resume m-run --lr LR" in line
    assert not Path("m.safetensors").exists()
    assert weights_finite(Path("m-run")) == (0, True)
    # the kept checkpoint resumes at a sane learning rate and finishes
    r = runner.invoke(app, ["train", "--resume", "m-run", "--lr", "0.01", "--json"])
    assert r.exit_code == 0, r.output
    assert Path("m.safetensors").is_file()
    _, meta = read_checkpoint(Path("m-run/checkpoint.safetensors"))
    assert meta["status"] == "complete" and meta["config"]["lr"] == 0.01
    assert weights_finite(Path("m-run")) == (2, True)
    assert [rec["lr"] for rec in meta["history"]][0] <= 0.01


def test_a_diverging_process_prints_one_line_and_exits_1(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "lipcli", "train", *TINY, "--epochs", "1", "--lr", "1e30",
                           "--out", "m.safetensors"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training diverged at epoch 1 step "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert weights_finite(tmp_path / "m-run") == (0, True)


def test_a_nan_gradient_with_a_finite_loss_is_never_applied_nor_checkpointed(tmp_path, monkeypatch):
    """Step 2 (the last of epoch 1) gets NaN gradients from a finite loss: the run stops before
    the optimiser applies them, so the epoch-1 checkpoint is never written with NaN weights."""
    monkeypatch.chdir(tmp_path)
    original, calls = T.TrainStep.forward, {"n": 0}

    def poisoned(self, images, labels):
        loss, logits, parts = original(self, images, labels)
        calls["n"] += 1
        if calls["n"] == 2:  # the loss stays finite, every gradient is NaN
            loss.register_hook(lambda g: g * float("nan"))
        return loss, logits, parts

    monkeypatch.setattr(T.TrainStep, "forward", poisoned)
    r = train(["--epochs", "2", "--out", "n/model.safetensors"])
    assert r.exit_code == 1, r.output
    line = r.stderr.strip().splitlines()[-1]
    assert "diverged at epoch 1 step 2 (loss " in line and "gradient not finite" in line, line
    assert "nan" not in line.split("(loss ")[1].split(",")[0]  # the loss itself was finite
    assert weights_finite(Path("n/model-run")) == (0, True)


# --------------------------------------------------------------------------------------------
# the pieces
# --------------------------------------------------------------------------------------------
def fake_run(epoch: int = 0, step: int = 0) -> SimpleNamespace:
    ctx = SimpleNamespace(world_size=1, local_world_size=1, launcher=None, is_main=True,
                          all_reduce_sum=lambda t: t)
    return SimpleNamespace(
        state=SimpleNamespace(epoch=epoch, step=step), loaders=SimpleNamespace(steps_per_epoch=4),
        settings=SimpleNamespace(paths=SimpleNamespace(run_dir=Path("r")), ctx=ctx),
        optim=SimpleNamespace(scheduler=SimpleNamespace(get_last_lr=lambda: [0.1])))


@pytest.mark.parametrize("bad, finite", [(None, True), (1e30, True), (float("nan"), False),
                                         (float("inf"), False), (-float("inf"), False)])
def test_grads_finite(bad, finite):
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    params[0].grad = torch.ones(3)
    if bad is not None:
        params[1].grad = torch.tensor([0.0, bad])
    assert bool(grads_finite(params)) is finite


def test_the_host_guard_stops_before_the_optimiser_step():
    layer = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in layer.parameters()]
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    guard = DivergenceGuard(torch.device("cpu"), check_grads=True, host=True)
    loss = layer(torch.ones(1, 2)).sum()
    loss.backward()
    guard.before_step(list(layer.parameters()), loss, fake_run(epoch=1, step=6))  # finite: passes
    layer.weight.grad[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match=r"at epoch 2 step 3 \(loss [-0-9.e]+, gradient not finite"):
        guard.before_step(list(layer.parameters()), loss, fake_run(epoch=1, step=6))
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters()))
    assert not opt.state  # the optimiser never stepped
    # with clipping, the clip's total norm decides (no second reduction): a NaN norm stops it
    params = list(layer.parameters())
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    with pytest.raises(TrainingDiverged, match="gradient not finite"):
        guard.before_step(params, loss, fake_run(epoch=1, step=6), norm=norm)
    guard.before_step(params, loss, fake_run(epoch=1, step=6), norm=torch.tensor(3.0))  # finite: passes


def test_the_device_guard_flags_and_reports_at_the_next_read():
    guard = DivergenceGuard(torch.device("cpu"), check_grads=True, host=False)
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    guard.before_step([p], torch.tensor(1.0), fake_run())
    guard.read(torch.tensor(3.0), fake_run().settings.ctx, fake_run())  # all finite: no error
    p.grad = torch.tensor([1.0, float("inf")])
    guard.before_step([p], torch.tensor(1.0), fake_run())  # no host read: only the flag
    p.grad = torch.ones(2)
    guard.before_step([p], torch.tensor(1.0), fake_run())  # a later finite step does not clear it
    with pytest.raises(TrainingDiverged, match="gradient not finite"):
        guard.read(torch.tensor(3.0), fake_run().settings.ctx, fake_run(step=2))
    fresh = DivergenceGuard(torch.device("cpu"), check_grads=False, host=False)
    with pytest.raises(TrainingDiverged, match=r"at epoch 1 step 2 \(loss nan, lr 0.1\)"):
        fresh.read(torch.tensor(float("nan")), fake_run().settings.ctx, fake_run(step=2))


def schedule(lr: float):
    layer = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(layer.parameters(), lr=lr, momentum=0.9)
    return opt, make_schedule(opt, schedule="cosine", total_steps=10, warmup_steps=2,
                              milestones=[0.5], gamma=0.1)


def test_resume_at_another_learning_rate_scales_the_schedule():
    opt, sched = schedule(0.1)
    rates = []
    for _ in range(10):
        opt.step()
        sched.step()
        rates.append(sched.get_last_lr()[0])
    opt, sched = schedule(0.1)
    for _ in range(4):
        opt.step()
        sched.step()
    saved = (opt.state_dict(), sched.state_dict())
    same_opt, same_sched = schedule(0.1)
    load_keeping_lr(same_opt, same_sched, *saved)
    assert same_opt.param_groups[0]["lr"] == rates[3] and same_sched.base_lrs == [0.1]
    low_opt, low_sched = schedule(0.01)
    load_keeping_lr(low_opt, low_sched, *saved)
    assert low_opt.param_groups[0]["lr"] == pytest.approx(rates[3] / 10)
    for rate in rates[4:]:
        low_opt.step()
        low_sched.step()
        assert low_sched.get_last_lr()[0] == pytest.approx(rate / 10)
        assert low_opt.param_groups[0]["lr"] == pytest.approx(rate / 10)
