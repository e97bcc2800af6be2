"""``lip train`` and lipcli.train: recipe, CRC-Lip losses, checkpoints, resume, DDP, errors.

End-to-end runs are tiny (LipConvnet-5 at width 4 on a few dozen images, 3 power-iteration
steps per refresh via --config) so that the real driver, loaders and model files are used.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError
from lipcli.host.modelfile import read_metadata
from lipcli.host.models import create_model, load_model
from lipcli.host.plugins import get_registry
from lipcli.train import (
    INTERRUPT_ENV, TrainConfig, flatten_state, load_config_file, read_checkpoint, resolve_loss,
    unflatten_state, weight_decay_groups,
)

runner = CliRunner()


def tiny_config(tmp_path: Path, **extra) -> Path:
    """A TOML settings file for fast runs (few power-iteration steps, no estimate)."""
    settings = {"power_iter_steps": 3, "lipschitz_estimate": False, "device": "cpu", **extra}
    lines = []
    for k, v in settings.items():
        lines.append(f"{k} = {json.dumps(v)}")
    path = tmp_path / "tiny.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def invoke(args: list[str], env: dict[str, str] | None = None):
    return runner.invoke(app, ["train", *args], env=env)


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*"))


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
def test_recipe_defaults():
    cfg = TrainConfig()
    assert (cfg.resolved().lr, cfg.momentum, cfg.weight_decay, cfg.epochs, cfg.batch_size, cfg.seed) == (
        0.1, 0.9, 5e-4, 200, 128, 0)
    assert (cfg.optimizer, cfg.schedule, cfg.warmup_epochs, cfg.lookahead, cfg.loss) == (
        "sgd", "step", 0.0, 0, None)
    assert cfg.lr_milestones == [0.5, 0.75] and cfg.lr_gamma == 0.1 and cfg.augment
    assert (cfg.arch, cfg.conv, cfg.activation, cfg.pool, cfg.head, cfg.dataset) == (
        "lipconvnet-5", "soc-fast", "maxmin", "max", "lln", "cifar10")
    assert json.loads(json.dumps(cfg.to_json())) == cfg.to_json()
    reg = get_registry()
    mlp, lln_head = reg.component("head", "mlp"), reg.component("head", "lln")

    def loss_of(config, head, dataset):
        resolved, comp = resolve_loss(config, head, dataset, reg)
        return resolved, comp.name, comp.params

    crc, name, params = loss_of(cfg, mlp, "cifar10")  # the MLP head's loss, the paper's values
    assert name == "crc-lip" and crc.grad_clip == 1.0
    assert params["radius"] == pytest.approx(36 / 255) and params["gamma"] == 0.5
    assert crc.loss.startswith("crc-lip:radius=0.1411") and crc.loss_shortcuts == {}
    assert loss_of(cfg, mlp, "cifar100")[2]["radius"] == 0.2
    assert loss_of(cfg, mlp, "cifar100")[2]["gamma"] == 0.75
    assert loss_of(cfg, mlp, "digits")[2]["gamma"] == 0.5
    lln, name, _ = loss_of(cfg, lln_head, "cifar10")
    assert name == "ce" and lln.grad_clip == 0.0 and lln.loss == "ce"
    # the shortcut settings that crc-lip's spec declares set its parameters (given as settings,
    # as in a settings file); inline parameters win over the recipe
    short, _, params = loss_of(TrainConfig().updated({"attack_radius": 0.1, "curvature-weight": 0}), mlp, "cifar100")
    assert params["radius"] == 0.1 and params["gamma"] == 0.0 and short.loss_shortcuts == {}
    assert loss_of(TrainConfig(loss_shortcuts={"curvature_classes": 3}), mlp, "cifar10")[2]["classes"] == 3
    assert loss_of(TrainConfig(loss="crc-lip:gamma=0.25"), lln_head, "cifar100")[2]["gamma"] == 0.25
    with pytest.raises(LipUsageError, match="attack_radius sets the loss parameter 'radius', which loss 'ce'") as err:
        resolve_loss(TrainConfig(loss_shortcuts={"attack_radius": 0.1}), lln_head, "cifar10", reg)
    # the library names settings, never options; the losses that have the parameter come
    # from the registry, and a front end spells the settings its own way
    assert "--" not in str(err.value) and err.value.settings == ("attack_radius", "loss")
    assert err.value.render(lambda n: f"<{n}>").endswith("choose a loss with it (<loss> crc-lip)")
    with pytest.raises(LipUsageError, match="give it once"):
        resolve_loss(TrainConfig(loss="crc-lip:radius=0.2", loss_shortcuts={"attack_radius": 0.1}), mlp, "cifar10", reg)


def test_loss_shortcuts_come_from_the_loss_specs():
    """The shortcut settings are declared by the loss specs (``Param.shortcut``), never by the
    trainer: older model files' stored configs (the shortcut keys as null) still read, a
    settings-file key reaches ``loss_shortcuts``, an unknown key is still refused, and the
    core modules name no loss parameter."""
    from lipcli.train.config import loss_shortcut_names

    assert {"attack_radius", "curvature_weight", "attack_steps", "curvature_power_steps",
            "curvature_classes"} <= loss_shortcut_names()
    old = {**TrainConfig().to_json(), "attack_radius": None, "curvature_weight": None}
    del old["loss_shortcuts"]
    assert TrainConfig().updated(old).loss_shortcuts == {}
    assert TrainConfig().updated({"attack_radius": 0.1}).loss_shortcuts == {"attack_radius": 0.1}
    assert TrainConfig().updated({"attack_radius": 0.1}).updated({"attack_radius": None}).loss_shortcuts == {}
    with pytest.raises(LipUsageError, match="unknown setting 'attack_radiuss'"):
        TrainConfig().updated({"attack_radiuss": 0.1})
    with pytest.raises(LipUsageError, match="must be a number"):
        TrainConfig().updated({"attack_radius": [1]})
    root = Path(__file__).resolve().parents[2] / "lipcli"
    for module in ("train/config.py", "train/objective.py", "train/__init__.py", "cli/train_cmd.py"):
        text = (root / module).read_text()
        for word in ("crc", "attack_radius", "curvature_weight", "CRC"):
            assert word not in text, (module, word)


def test_config_files(tmp_path):
    (tmp_path / "a.toml").write_text('epochs = 3\nlr = 0.05\n[other]\nx = 1\n')
    (tmp_path / "b.json").write_text(json.dumps({"train": {"batch-size": 64, "lr_milestones": [0.3, 0.6]}}))
    (tmp_path / "c.yaml").write_text("epochs: 2\n")
    (tmp_path / "d.toml").write_text("epochs = \n")
    a = TrainConfig().updated({k: v for k, v in load_config_file(tmp_path / "a.toml").items() if k != "other"})
    assert a.epochs == 3 and a.lr == 0.05
    b = TrainConfig().updated(load_config_file(tmp_path / "b.json"))
    assert b.batch_size == 64 and b.lr_milestones == [0.3, 0.6]
    try:
        import yaml  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(LipUsageError, match="PyYAML is not installed"):
            load_config_file(tmp_path / "c.yaml")
    with pytest.raises(LipUsageError, match="not valid TOML"):
        load_config_file(tmp_path / "d.toml")
    with pytest.raises(LipUsageError, match="unknown setting 'other'"):
        TrainConfig().updated(load_config_file(tmp_path / "a.toml"))
    with pytest.raises(LipUsageError, match="must be an integer"):
        TrainConfig().updated({"epochs": "ten"})
    with pytest.raises(LipUsageError, match="epochs must be in 1..100000"):
        TrainConfig(epochs=-1).validate()


def test_cli_options_override_the_config_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text("epochs = -3\ndataset = \"digits\"\n")
    r = invoke(["--config", str(cfg)])
    assert r.exit_code == 2 and "--epochs must be in 1..100000, got -3" in r.stderr
    r = invoke(["--config", str(cfg), "--epochs", "1", "--arch", "nope"])
    assert r.exit_code == 2 and "unknown arch 'nope'" in r.stderr  # epochs came from the CLI
    assert files_under(tmp_path) == [cfg]


# --------------------------------------------------------------------------------------------
# recipe pieces
# --------------------------------------------------------------------------------------------
def test_weight_decay_only_on_conv_filters_and_lln_weight():
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool="projection")
    decay, no_decay = weight_decay_groups(model, 5e-4)
    assert decay["weight_decay"] == 5e-4 and no_decay["weight_decay"] == 0.0
    assert "head.weight" in decay["names"] and "head.bias" in no_decay["names"]
    assert all(n.endswith("weight") for n in decay["names"])
    assert any(n.endswith("theta") for n in no_decay["names"])
    assert all(p.dim() >= 2 for p in decay["params"])
    assert {id(p) for p in decay["params"] + no_decay["params"]} == {id(p) for p in model.parameters()}
    mlp = create_model("lipconvnet-5", width=4, head="mlp:hidden=16")
    decay, _ = weight_decay_groups(mlp, 5e-4)
    assert not any(n.startswith("head.") for n in decay["names"])  # no decay on the MLP head
    assert any(n.startswith("body.") for n in decay["names"])


def test_recipe_sgd_is_fused_where_available_and_matches_plain_sgd():
    from lipcli.train import recipe_sgd

    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(64, 32, generator=gen), torch.randn(32, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in init] for _ in range(3)]
    results = []
    for make in (
        lambda groups: recipe_sgd(groups, lr=0.1, momentum=0.9),
        lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
    ):
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = make([{"params": [params[0]], "weight_decay": 5e-4},
                    {"params": [params[1]], "weight_decay": 0.0}])
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        results.append((opt, [p.detach() for p in params]))
    (fused_opt, got), (_, want) = results
    assert fused_opt.param_groups[0].get("fused") is True  # CPU float32: fused since torch 2.4
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert not torch.equal(got[0], init[0])


def test_state_flattening_roundtrip_is_exact():
    from collections import Counter

    p = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.randn(3, 2)
    opt.step()
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 2, 5], gamma=0.1)
    tensors: dict[str, torch.Tensor] = {}
    state = {"opt": opt.state_dict(), "sched": sched.state_dict(), "x": (1, float("inf")),
             "c": Counter({3: 2}), "k": {1: "a"}}
    flat = flatten_state(state, "s", tensors)
    back = unflatten_state(json.loads(json.dumps(flat, allow_nan=False)), tensors)
    assert back["x"] == (1, math.inf) and back["c"] == Counter({3: 2}) and back["k"] == {1: "a"}
    assert torch.equal(back["opt"]["state"][0]["momentum_buffer"], opt.state_dict()["state"][0]["momentum_buffer"])
    sched2 = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1], gamma=0.5)
    sched2.load_state_dict(back["sched"])
    assert sched2.milestones == Counter({2: 2, 5: 1})


# --------------------------------------------------------------------------------------------
# end to end
# --------------------------------------------------------------------------------------------
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32"]


def test_one_epoch_writes_a_loadable_model_with_its_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    out = tmp_path / "m" / "model.safetensors"
    r = invoke([*TINY, "--epochs", "1", "--config", str(cfg), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["model"] == str(out) and summary["epochs"] == 1
    # the keys of --json (TrainSummary's fields), in this order
    assert list(summary) == ["model", "run_dir", "dataset", "epochs", "test_accuracy", "val_accuracy",
                             "lipschitz_upper_bound", "lipschitz_estimate", "time_s", "images_per_s",
                             "device", "world_size", "compile", "compile_s"]
    meta = read_metadata(out)
    assert meta["config"]["arch"]["name"] == "lipconvnet-5" and meta["config"]["arch"]["params"]["width"] == 4
    assert meta["dataset"]["name"] == "digits" and meta["dataset"]["sizes"] == {"train": 64, "test": 32}
    assert meta["normalization"]["std"] == [0.3237] * 3
    lip = meta["lipschitz"]
    assert math.isfinite(lip["upper_bound"]) and lip["upper_bound"] >= 1 / 0.3237
    assert lip["upper_bound"] == summary["lipschitz_upper_bound"]
    assert 0 <= meta["results"]["test_accuracy"] <= 1 and meta["results"]["test_examples"] == 32
    training = meta["training"]
    assert training["epochs"] == 1 and training["seed"] == 0 and training["device"] == "cpu"
    assert training["config"]["epochs"] == 1 and training["config"]["power_iter_steps"] == 3
    assert training["lipcli_version"] and training["images_per_s"] > 0
    assert "head.weight" in training["weight_decay_parameters"]
    run = tmp_path / "m" / "model-run"
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["epoch"] == 1 and "train_loss" in log[0]
    assert json.loads((run / "config.json").read_text())["limit_train"] == 64
    _, ck = read_checkpoint(run / "checkpoint.safetensors")
    assert ck["status"] == "complete" and ck["epoch"] == 1
    # the stored accuracy is the accuracy of the stored model on the stored test subset
    model, _ = load_model(out)
    from lipcli.data.loaders import load_data, resolve_dataset

    bundle = load_data(resolve_dataset("digits"), None, augment=False, limit_train=64, limit_test=32)
    xs = torch.stack([bundle.test[i][0] for i in range(32)])
    ys = torch.tensor([bundle.test[i][1] for i in range(32)])
    with torch.no_grad():
        acc = (model(xs).argmax(1) == ys).float().mean().item()
    assert acc == pytest.approx(meta["results"]["test_accuracy"])
    assert model.lipschitz_upper_bound() == pytest.approx(lip["upper_bound"], rel=1e-6)
    assert files_under(tmp_path / "runs") == []  # nothing in the default location


def test_resume_after_interrupt_is_bit_identical(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    args = [*TINY, "--epochs", "2", "--config", str(cfg)]
    r = invoke([*args, "--out", "a/model.safetensors"])
    assert r.exit_code == 0, r.output
    # Ctrl-C in the middle of epoch 2 (0-based epoch 1, before step 1)
    r = invoke([*args, "--out", "b/model.safetensors"], env={INTERRUPT_ENV: "1:1"})
    assert r.exit_code == 130
    err = r.stderr.strip().splitlines()[-1]
    assert "resume with: lip train --resume b/model-run" in err and "after epoch 1" in err
    assert not (tmp_path / "b" / "model.safetensors").exists()
    _, ck = read_checkpoint(tmp_path / "b" / "model-run" / "checkpoint.safetensors")
    assert ck["epoch"] == 1 and ck["status"] == "running"
    # a new run into the unfinished run's directory is refused
    r = invoke([*args, "--out", "b/model.safetensors"])
    assert r.exit_code == 2 and "unfinished run" in r.stderr
    r = invoke(["--resume", "b/model-run", "--momentum", "0.5"])
    assert r.exit_code == 2 and "cannot change --momentum" in r.stderr
    r = invoke(["--resume", "b/model-run", "--json"])
    assert r.exit_code == 0, r.output
    from safetensors.torch import load_file

    a, b = load_file("a/model.safetensors"), load_file("b/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    ma, mb = read_metadata("a/model.safetensors"), read_metadata("b/model.safetensors")
    assert ma["results"]["test_accuracy"] == mb["results"]["test_accuracy"]
    assert mb["training"]["resumed_from_epochs"] == [1]
    la = [json.loads(x) for x in (tmp_path / "a/model-run/train_log.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (tmp_path / "b/model-run/train_log.jsonl").read_text().splitlines()]
    assert [x["train_loss"] for x in la] == [x["train_loss"] for x in lb]
    # MultiStepLR x0.1 at 50 % and 75 % of the 4 iterations, stepped per iteration
    assert [x["lr"] for x in la] == pytest.approx([0.01, 0.001])


def test_crc_mlp_training_on_an_imagefolder_tree(tmp_path, monkeypatch, imagefolder_root):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    r = invoke(["--dataset", "imagefolder", "--data-dir", str(imagefolder_root), "--width", "4",
                "--head", "mlp:hidden=32", "--pool", "projection", "--epochs", "1",
                "--batch-size", "6", "--config", str(cfg), "--out", "crc.safetensors"])
    assert r.exit_code == 0, r.output
    meta = read_metadata("crc.safetensors")
    tc = meta["training"]["config"]
    assert tc["grad_clip"] == 1.0 and tc["loss"].startswith("crc-lip:radius=0.1411")
    loss = meta["training"]["loss"]
    assert loss["name"] == "crc-lip" and loss["distribution"] == "lipcli"
    assert loss["params"]["radius"] == pytest.approx(36 / 255) and loss["params"]["gamma"] == 0.5
    assert meta["dataset"]["classes"] == ["circle", "cross", "square"] and meta["config"]["num_classes"] == 3
    assert meta["training"]["weight_decay_parameters"] and not any(
        n.startswith("head.") for n in meta["training"]["weight_decay_parameters"])
    log = json.loads((tmp_path / "crc-run" / "train_log.jsonl").read_text())
    assert log["train_curvature"] > 0 and math.isfinite(log["train_loss"])
    model, _ = load_model("crc.safetensors")
    assert type(model.head).__name__ == "MLPHead"


def test_cifar10_with_validation_split_and_best_weights(tmp_path, monkeypatch, cifar10_root):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    r = invoke(["--dataset", "cifar10", "--data-dir", str(cifar10_root), "--width", "4",
                "--epochs", "2", "--batch-size", "16", "--val-split", "0.25", "--keep-best",
                "--config", str(cfg), "--run-dir", "run", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["model"] == "run/model.safetensors"
    meta = read_metadata("run/model.safetensors")
    assert meta["dataset"]["sizes"] == {"train": 30, "val": 10, "test": 12}
    assert meta["results"]["selection"] == "best validation accuracy"
    log = [json.loads(x) for x in Path("run/train_log.jsonl").read_text().splitlines()]
    assert all("val_accuracy" in x for x in log)
    best_epoch = max(range(2), key=lambda i: (log[i]["val_accuracy"], -i)) + 1
    assert meta["results"]["selected_epoch"] == best_epoch
    from safetensors.torch import load_file

    best, final = load_file("run/best.safetensors"), load_file("run/model.safetensors")
    assert all(torch.equal(best[k], final[k]) for k in final)


def test_amp_and_loader_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    r = invoke([*TINY, "--epochs", "1", "--config", str(cfg), "--amp", "--workers", "1",
                "--no-augment", "--out", "amp.safetensors"])
    assert r.exit_code == 0, r.output
    meta = read_metadata("amp.safetensors")
    assert meta["training"]["amp_dtype"] == "bfloat16" and meta["training"]["workers"] == 1
    assert meta["training"]["config"]["augment"] is False
    model, _ = load_model("amp.safetensors")
    assert all(t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point())


def test_nan_loss_stops_the_run_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import lipcli.train as T

    original = T.TrainStep.forward
    calls = {"n": 0}

    def poisoned(self, images, labels):
        loss, logits, parts = original(self, images, labels)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] >= 3 else loss), logits, parts

    monkeypatch.setattr(T.TrainStep, "forward", poisoned)
    cfg = tiny_config(tmp_path)
    r = invoke([*TINY, "--epochs", "2", "--config", str(cfg), "--out", "n/model.safetensors"])
    assert r.exit_code == 1
    line = r.stderr.strip().splitlines()[-1]
    assert "diverged at epoch 2 step 1 (loss nan, gradient not finite" in line and "(after epoch 1) is kept" in line
    assert not Path("n/model.safetensors").exists()
    tensors, ck = read_checkpoint(Path("n/model-run/checkpoint.safetensors"))
    assert ck["epoch"] == 1 and all(torch.isfinite(v).all() for k, v in tensors.items() if v.is_floating_point())


# --------------------------------------------------------------------------------------------
# bad arguments: one clear line, non-zero exit, nothing written
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--arch", "lipconvnet-7"], 2, "unknown arch 'lipconvnet-7'; valid names: "),  # plugins' archs sort first
        (["--arch", "lipconvnet-7"], 2, " lipconvnet-5, lipconvnet-10, lipconvnet-15,"),
        (["--pool", "avg"], 2, "unknown pool 'avg'; valid names: max, "),  # and any installed plugin's
        (["--dataset", "mnist"], 2, "unknown dataset 'mnist'; valid names: cifar10, cifar100, digits"),
        (["--conv", "soc-fast:nope=1"], 2, "has no parameter 'nope'"),
        (["--dataset", "cifar10", "--data-dir", "missing-dir"], 2, "missing-dir does not exist"),
        (["--dataset", "cifar10", "--no-download", "-q"], 2, "no-data-root does not exist (dataset 'cifar10')"),
        (["--epochs", "-1"], 2, "--epochs must be in 1..100000, got -1"),
        (["--val-split", "1.5"], 2, "--val-split must be in [0, 1)"),
        (["--keep-best"], 2, "--keep-best needs --val-split"),
        (["--head", "lln", "--attack-radius", "0.1"], 2, "which loss 'ce' (head 'lln'"),
        (["--loss", "focal"], 2, "unknown loss 'focal'; valid names: ce, cr, crc-lip, "),
        (["--loss", "margin-offset:temperature=0"], 2, "temperature must be in (0, 1000]"),
        (["--optimizer", "adam"], 2, "--optimizer must be one of sgd, adamw, nadam"),
        (["--schedule", "linear"], 2, "--schedule must be one of step, cosine"),
        (["--extra-ratio", "0.5"], 2, "--extra-ratio needs --extra-data FILE"),
        (["--device", "tpu"], 2, "--device: unknown device 'tpu'; use cpu, cuda, cuda:N or auto"),
        (["--out", "blocker/model.safetensors"], 2, "blocker is not a directory"),
        (["--run-dir", "blocker/run"], 2, "blocker is not a directory"),
        (["--resume", "nowhere"], 2, "--resume nowhere: not a directory"),
        (["--config", "none.toml"], 2, "config file none.toml does not exist"),
    ],
)
def test_bad_arguments_exit_nonzero_with_one_line_and_write_nothing(tmp_path, monkeypatch, args, code, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blocker").write_text("a file where a directory should be")
    before = files_under(tmp_path)
    defaults = [] if "--dataset" in args else ["--dataset", "digits"]
    r = invoke([*defaults, *args])
    assert r.exit_code == code, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert files_under(tmp_path) == before


def test_unwritable_output_directory(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root can write everywhere")
    monkeypatch.chdir(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = invoke(["--dataset", "digits", "--out", "ro/model.safetensors"])
        assert r.exit_code == 2 and "not writable" in r.stderr
    finally:
        ro.chmod(0o755)


def test_real_lip_subprocess_reports_unknown_components(tmp_path):
    exe = Path(sys.executable).with_name("lip")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lipcli"]
    r = subprocess.run([*cmd, "train", "--arch", "nope", "--dataset", "digits"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        r.stderr.strip().splitlines()[0]] and "unknown arch 'nope'; valid names:" in r.stderr
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------
# several processes
# --------------------------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_torchrun_environment_uses_the_ddp_path_in_process(tmp_path, monkeypatch):
    """Fast DDP smoke: the environment torchrun sets for one process -> gloo group + DDP."""
    monkeypatch.chdir(tmp_path)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                       "TORCHELASTIC_RUN_ID": "smoke"}.items():
        monkeypatch.setenv(key, value)
    cfg = tiny_config(tmp_path)
    r = invoke([*TINY, "--epochs", "1", "--config", str(cfg), "--out", "d/model.safetensors"])
    assert r.exit_code == 0, r.output
    assert "x 1 processes (gloo)" in r.stderr
    import torch.distributed as dist

    assert not dist.is_initialized()  # the driver tears its process group down
    meta = read_metadata("d/model.safetensors")
    assert meta["training"]["backend"] == "gloo" and meta["training"]["world_size"] == 1
    load_model("d/model.safetensors")


@pytest.mark.slow
def test_two_process_gloo_run(tmp_path):
    cfg = tiny_config(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "lipcli", "train", *TINY, "--epochs", "1", "--config", str(cfg),
         "--out", "ddp/model.safetensors", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["world_size"] == 2
    meta = read_metadata(tmp_path / "ddp" / "model.safetensors")
    assert meta["training"]["world_size"] == 2 and meta["training"]["backend"] == "gloo"
    assert meta["results"]["test_examples"] == 32  # shards add up, no repeats
    model, _ = load_model(tmp_path / "ddp" / "model.safetensors")
    assert math.isfinite(model.lipschitz_upper_bound())
    lines = (tmp_path / "ddp" / "model-run" / "train_log.jsonl").read_text().splitlines()
    assert len(lines) == 1  # only rank 0 writes
