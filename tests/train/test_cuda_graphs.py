"""lipcli.train.cuda_graphs: the graphed training step's bookkeeping (on CPU, with a backend that
emulates capture and replay), the fallbacks, ``lip train --cuda-graphs``, and (``cuda``
marker) the real CUDA graph against the eager step."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from lipcli.bench import build_model, recipe_optimizer, synthetic_batch
from lipcli.cli import app
from lipcli.train.cuda_graphs import GraphedStep, check_graph_mode, graph_unsupported_reason
from lipcli.host.modelfile import read_metadata
from lipcli.train import TrainConfig


class EmulatedGraph:
    """Emulates a CUDA graph on CPU: ``capture`` records the function and returns outputs
    of the right shapes WITHOUT changing any state (it runs the function once and puts the
    model's state and the optimiser state back); ``replay`` runs the recorded function
    again with the gradients zeroed (a graph overwrites them) and copies its results into
    the static outputs."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 fail: bool = False) -> None:
        self.model, self.optimizer, self.fail = model, optimizer, fail
        self.fn = None
        self.static = None
        self.captures = self.replays = self.warmups = 0

    def run_warmup(self, fn):
        self.warmups += 1
        return fn()

    def capture(self, fn):
        self.captures += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing\nmore")
        saved_model = {k: v.clone() for k, v in self.model.state_dict().items()}
        state = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
                 for k, s in self.optimizer.state.items()}
        self.fn = fn
        self.static = fn()
        self.model.load_state_dict(saved_model)  # in place: parameters and power vectors
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))  # a graph leaves them unwritten
        for k, s in state.items():
            for n, v in s.items():
                if torch.is_tensor(v):
                    self.optimizer.state[k][n].copy_(v)
        return self.static

    def replay(self):
        self.replays += 1
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.zero_()
        out = self.fn()
        for s, o in zip(self.static, out):
            s.copy_(o)

    def release(self):
        self.fn = self.static = None


def _step(model, optimizer):
    def step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        return loss.detach(), logits.detach()

    return step


def _batches(n_full: int, batch: int = 8, last: int = 3):
    gen = torch.Generator().manual_seed(3)
    out = [synthetic_batch(batch, 10, gen, torch.device("cpu")) for _ in range(n_full)]
    out.append(synthetic_batch(last, 10, gen, torch.device("cpu")))
    return out


def _train(graphed: bool, fail: bool = False):
    model = build_model("lipconvnet-5", conv="soc-fast", width=4, seed=0).train()
    optimizer = recipe_optimizer(model)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[4], gamma=0.1)
    step = _step(model, optimizer)
    backend = EmulatedGraph(model, optimizer, fail=fail)
    runner = GraphedStep(step, optimizer, "cpu", warmup=2, capture_backend=backend) if graphed else None
    losses = []
    for x, y in _batches(7):
        if runner is not None:
            loss, _ = runner(x, y)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss, _ = step(x, y)
        losses.append(float(loss))
        scheduler.step()
    return model, optimizer, losses, backend, runner


def test_graphed_step_gives_the_eager_steps_values_with_lr_changes_and_a_partial_batch():
    eager_model, eager_opt, eager_losses, _, _ = _train(graphed=False)
    model, opt, losses, backend, runner = _train(graphed=True)
    # 2 warm-up steps, 1 capture, 5 replays of the full batch (the capture step replays at once)
    assert (backend.warmups, backend.captures, backend.replays) == (2, 1, 5)
    assert runner.summary() == {"captured": True, "replays": 5, "eager_steps": 3, "reason": None}
    assert losses == eager_losses
    for a, b in zip(model.parameters(), eager_model.parameters()):
        assert torch.equal(a, b)
    # the optimiser keeps float learning rates (checkpoints unchanged); the schedule reached
    # the graph (the lr fell at step 4, before the last replays)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in eager_opt.param_groups]
    assert all(isinstance(g["lr"], float) for g in opt.param_groups)
    assert all(float(t) == pytest.approx(0.01) for _, t, _ in runner._lr)


def test_failed_capture_falls_back_to_eager_with_a_one_line_reason():
    eager_model, _, eager_losses, _, _ = _train(graphed=False)
    model, opt, losses, backend, runner = _train(graphed=True, fail=True)
    assert runner.reason == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert not runner.active and runner.summary()["replays"] == 0 and backend.captures == 1
    assert losses == eager_losses
    for a, b in zip(model.parameters(), eager_model.parameters()):
        assert torch.equal(a, b)
    assert all(isinstance(g["lr"], float) for g in opt.param_groups)


def test_unsupported_configurations_are_named():
    model = torch.nn.Linear(3, 2)
    fused = torch.optim.SGD(model.parameters(), lr=0.1, fused=True) if torch.cuda.is_available() else None
    assert "CUDA device" in graph_unsupported_reason("cpu")
    if not torch.cuda.is_available():
        assert "CUDA" in graph_unsupported_reason("cuda")
    else:
        assert "several processes" in graph_unsupported_reason("cuda", fused, distributed=True)
        assert "float16" in graph_unsupported_reason("cuda", fused, grad_scaler=True)
        plain = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
        assert "not the fused one" in graph_unsupported_reason("cuda", plain)
        assert graph_unsupported_reason("cuda", fused) is None
    assert check_graph_mode(" ON ") == "on"
    with pytest.raises(ValueError, match="auto, on, off"):
        check_graph_mode("yes")


TINY = ["--dataset", "digits", "--arch", "lipconvnet-5", "--width", "4", "--limit-train", "40",
        "--limit-test", "16", "--batch-size", "16", "--device", "cpu", "--no-lipschitz-estimate"]


def test_lip_train_cuda_graphs_on_cpu_falls_back_with_one_line_and_same_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text("power_iter_steps = 3\n")
    runner = CliRunner()
    common = [*TINY, "--epochs", "1", "--config", "tiny.toml"]
    on = runner.invoke(app, ["train", *common, "--cuda-graphs", "on", "--out", "on/m.safetensors"])
    assert on.exit_code == 0, on.output
    lines = [ln for ln in on.stderr.splitlines() if "cuda graphs" in ln]
    assert lines == ["cuda graphs: not used: CUDA graphs need a CUDA device (training on cpu)"]
    off = runner.invoke(app, ["train", *common, "--cuda-graphs", "off", "--out", "off/m.safetensors"])
    auto = runner.invoke(app, ["train", *common, "--out", "auto/m.safetensors"])
    assert off.exit_code == 0 and auto.exit_code == 0
    assert "cuda graphs" not in off.stderr and "cuda graphs" not in auto.stderr
    from safetensors.torch import load_file

    a, b = load_file("on/m.safetensors"), load_file("off/m.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    meta = read_metadata("on/m.safetensors")["training"]
    assert meta["config"]["cuda_graphs"] == "on"
    assert meta["cuda_graphs"] == {"mode": "on", "captured": False,
                                   "reason": "CUDA graphs need a CUDA device (training on cpu)"}
    bad = runner.invoke(app, ["train", *common, "--cuda-graphs", "maybe", "--out", "x/m.safetensors"])
    assert bad.exit_code == 2 and "--cuda-graphs must be one of auto, on, off" in bad.stderr
    assert json.loads(json.dumps(TrainConfig().to_json()))["cuda_graphs"] == "auto"


@pytest.mark.cuda
def test_cuda_graph_step_matches_the_eager_step_on_the_gpu():
    """Same weights after 8 steps (6 replays, then a partial batch eagerly), up to the
    reordering of floating-point sums that cuDNN/cuBLAS may choose between launches."""
    dev = torch.device("cuda")
    results = []
    for graphed in (False, True):
        model = build_model("lipconvnet-5", conv="soc-fast", width=16, seed=0).to(dev).train()
        optimizer = recipe_optimizer(model)
        step = _step(model, optimizer)
        runner = GraphedStep(step, optimizer, dev) if graphed else None
        gen = torch.Generator().manual_seed(0)
        batches = [synthetic_batch(64, 10, gen, dev) for _ in range(8)] + [synthetic_batch(24, 10, gen, dev)]
        for x, y in batches:
            if runner is None:
                optimizer.zero_grad(set_to_none=True)
                step(x, y)
            else:
                runner(x, y)
        if runner is not None:
            assert runner.summary()["captured"] and runner.replays == 6, runner.summary()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    eager, graph = results
    assert ((graph - eager).norm() / eager.norm()).item() < 1e-5
