"""Optimisers and schedules of lip train: --optimizer, --lookahead, --schedule, --warmup-epochs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.modelfile import read_metadata
from lipcli.train import INTERRUPT_ENV, Lookahead, TrainConfig, make_optimizer, make_schedule
from lipcli.train.optim import build_optimization

runner = CliRunner()


def lrs(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def sgd(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_step_without_warmup_is_the_recipes_multisteplr():
    opt = sgd()
    sched = make_schedule(opt, schedule="step", total_steps=8, warmup_steps=0, milestones=[0.5, 0.75], gamma=0.1)
    assert type(sched) is torch.optim.lr_scheduler.MultiStepLR
    assert lrs(sched, opt, 8) == pytest.approx([1, 1, 1, 1, 0.1, 0.1, 0.01, 0.01])


def test_warmup_and_cosine_values():
    opt = sgd()
    sched = make_schedule(opt, schedule="step", total_steps=8, warmup_steps=2, milestones=[0.5, 0.75], gamma=0.1)
    assert lrs(sched, opt, 8) == pytest.approx([0.5, 1, 1, 1, 0.1, 0.1, 0.01, 0.01])
    opt = sgd()
    sched = make_schedule(opt, schedule="cosine", total_steps=10, warmup_steps=2, milestones=[0.5], gamma=0.1)
    values = lrs(sched, opt, 10)
    expected = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * (t - 2) / 8)) for t in range(2, 10)]
    assert values == pytest.approx(expected)


@pytest.mark.parametrize("total", [37, 100])
def test_triangular_is_slls_interp_scheduler_as_their_loop_steps_it(total):
    """Lipschitz-SLL-Networks' loop: the optimiser starts at ``lr``, and after step ``t``
    ``scheduler.step(t)`` sets ``np.interp(t, [0, 2T//5, 4T//5, T], [0, lr, lr/20, 0])``."""
    import numpy as np

    lr = 0.01
    want = [lr]
    for t in range(total - 1):
        want.append(float(np.interp([t], [0, total * 2 // 5, total * 4 // 5, total], [0, lr, lr / 20, 0])[0]))
    opt = sgd(lr)
    sched = make_schedule(opt, schedule="triangular", total_steps=total, warmup_steps=0, milestones=[0.5], gamma=0.1)
    assert lrs(sched, opt, total) == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", ["adamw", "nadam"])
def test_betas_reach_adam(name):
    model = torch.nn.Linear(3, 2)
    groups = [{"params": list(model.parameters()), "weight_decay": 0.0, "names": ["w", "b"]}]
    assert make_optimizer(name, groups, lr=0.01, momentum=0.9, betas=[0.5, 0.9]).defaults["betas"] == (0.5, 0.9)
    assert make_optimizer(name, groups, lr=0.01, momentum=0.9).defaults["betas"] == (0.9, 0.999)


def test_betas_setting_is_checked_and_parsed():
    from lipcli.sdk.errors import LipUsageError
    from lipcli.train.errors import TrainUsageError

    assert TrainConfig().updated({"betas": "0.5,0.9"}).betas == [0.5, 0.9]
    assert TrainConfig().updated({"betas": [0.5, 0.9]}).betas == [0.5, 0.9]
    for bad in ("0.5", "1,0.9", "0.5,-0.1", "0.1,0.2,0.3"):
        with pytest.raises(TrainUsageError, match="betas"):
            TrainConfig().updated({"betas": bad}).validate()
    for bad in ("a,b", True, [True, 0.9]):
        with pytest.raises(LipUsageError, match="betas"):
            TrainConfig().updated({"betas": bad})


@pytest.mark.parametrize("name, cls", [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW),
                                       ("nadam", torch.optim.NAdam)])
def test_optimizers_keep_the_weight_decay_groups(name, cls):
    model = torch.nn.Linear(3, 2)
    groups = [{"params": [model.weight], "weight_decay": 0.1, "names": ["weight"]},
              {"params": [model.bias], "weight_decay": 0.0, "names": ["bias"]}]
    opt = make_optimizer(name, groups, lr=0.01, momentum=0.9)
    assert isinstance(opt, cls) and [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    if name == "nadam":
        assert opt.defaults["decoupled_weight_decay"]


def test_lookahead_matches_the_definition():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    ref = torch.nn.Parameter(w.detach().clone())
    target = torch.randn(4)
    la = Lookahead(torch.optim.SGD([w], lr=0.1), k=3, alpha=0.5)
    plain = torch.optim.SGD([ref], lr=0.1)
    slow = ref.detach().clone()
    for step in range(1, 8):
        for p, opt in ((w, la), (ref, plain)):
            opt.zero_grad()
            ((p - target) ** 2).sum().backward()
            opt.step()
        if step % 3 == 0:  # phi <- phi + alpha (theta - phi); theta <- phi
            with torch.no_grad():
                slow += 0.5 * (ref - slow)
                ref.copy_(slow)
        assert torch.allclose(w, ref, atol=1e-7), step
    state = la.state_dict()
    other = Lookahead(torch.optim.SGD([torch.nn.Parameter(torch.zeros(4))], lr=0.1), k=3, alpha=0.5)
    other.load_state_dict(state)
    assert other.count == 7 and torch.equal(other.slow[0], la.slow[0])


def test_build_optimization_resolves_the_config():
    model = torch.nn.Linear(3, 2)
    cfg = TrainConfig(optimizer="adamw", lookahead=5, schedule="cosine", warmup_epochs=1.0, epochs=4).resolved()
    assert cfg.lr == 1e-3
    _, opt, sched = build_optimization(cfg, model, steps_per_epoch=10)
    assert isinstance(opt, Lookahead) and isinstance(opt.base, torch.optim.AdamW)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 10)  # first warm-up step


TINY = ["--dataset", "digits", "--width", "4", "--limit-train", "48", "--limit-test", "16",
        "--batch-size", "16"]


def _tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text('power_iter_steps = 2\nlipschitz_estimate = false\ndevice = "cpu"\n')
    return path


def test_resume_with_adamw_lookahead_cosine_is_bit_identical_and_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*TINY, "--epochs", "2", "--config", str(_tiny_config(tmp_path)), "--optimizer", "adamw",
            "--lookahead", "2", "--schedule", "cosine", "--warmup-epochs", "0.5"]
    r = runner.invoke(app, ["train", *args, "--out", "a/model.safetensors"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["train", *args, "--out", "b/model.safetensors"], env={INTERRUPT_ENV: "1:1"})
    assert r.exit_code == 130
    r = runner.invoke(app, ["train", "--resume", "b/model-run"])
    assert r.exit_code == 0, r.output
    from safetensors.torch import load_file

    a, b = load_file("a/model.safetensors"), load_file("b/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    meta = read_metadata("a/model.safetensors")["training"]
    opt = meta["optimization"]
    assert opt["optimizer"] == "adamw" and opt["class"] == "AdamW" and opt["lr"] == 1e-3
    assert opt["lookahead"] == {"k": 2, "alpha": 0.5} and opt["schedule"] == "cosine"
    assert opt["warmup_epochs"] == 0.5 and opt["momentum"] is None and opt["betas"] == [0.9, 0.999]
    assert meta["config"]["lr"] == 1e-3
    log = [json.loads(x) for x in (tmp_path / "a" / "model-run" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # cosine ends at 0


def test_default_optimization_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["train", *TINY, "--epochs", "1", "--config", str(_tiny_config(tmp_path)),
                            "--out", "m.safetensors"])
    assert r.exit_code == 0, r.output
    opt = read_metadata("m.safetensors")["training"]["optimization"]
    assert opt == {"optimizer": "sgd", "class": "SGD", "lr": 0.1, "momentum": 0.9, "betas": None,
                   "weight_decay": 5e-4, "lookahead": None, "schedule": "step", "warmup_epochs": 0.0,
                   "lr_milestones": [0.5, 0.75], "lr_gamma": 0.1}


def test_optimizers_are_components_and_a_plugin_can_add_one(tmp_path, monkeypatch):
    from lipcli.host.plugins import get_registry
    from lipcli.sdk.hookspecs import hookimpl
    from lipcli.sdk.specs import OptimizerSpec
    from lipcli.testing import registered

    assert {"sgd", "adamw", "nadam"} <= set(get_registry().names("optimizer"))
    calls = []

    class Plugin:
        @staticmethod
        @hookimpl
        def lip_optimizers():
            def factory(context, *, scale=1.0):
                calls.append((context.lr, scale, sorted(n for g in context.groups for n in g["names"])))
                return context.euclidean("adamw", context.groups)
            from lipcli.sdk.specs import Param
            return [OptimizerSpec(name="t-scaled", factory=factory, description="test", default_lr=0.02,
                                  params=(Param(name="scale", type=float, default=1.0, min=0.0, max=9.0,
                                                help="x"),))]

    with registered(("t-optim-plugin", Plugin)):
        cfg = TrainConfig(optimizer="t-scaled:scale=2").resolved()
        assert cfg.lr == 0.02
        _, opt, _ = build_optimization(cfg, torch.nn.Linear(3, 2), steps_per_epoch=2)
        assert isinstance(opt, torch.optim.AdamW) and calls == [(0.02, 2.0, ["bias", "weight"])]
        with pytest.raises(Exception, match="must be one of sgd, adamw, nadam"):
            TrainConfig(optimizer="nope").validate()
