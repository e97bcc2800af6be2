"""User input through the CLI: rejected component values, existing outputs, resume options,
conflicting settings, and ``lip lipschitz --write`` keeping what it did not recompute.

Training runs are tiny (LipConvnet-5 at width 4 on 64 digits, one epoch, 3 power steps).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.host import plugins
from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError
from lipcli.lipschitz.bound import BOUND_LABEL, ESTIMATE_LABEL
from lipcli.lipschitz.report import merge_stored_record
from lipcli.host.modelfile import read_metadata
from lipcli.host.models import ComponentParameterError, create_model
from lipcli.train import INTERRUPT_ENV, read_checkpoint
from lipcli.testing import registered

from conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--epochs", "1"]


def tiny_config(tmp_path: Path, **extra) -> Path:
    settings = {"power_iter_steps": 3, "lipschitz_estimate": False, "device": "cpu", **extra}
    path = tmp_path / "tiny.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return path


def train(args: list[str], env: dict[str, str] | None = None):
    return runner.invoke(app, ["train", *args], env=env)


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and "internal error" not in result.stderr
    return lines[0]


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


# --------------------------------------------------------------------------------------------
# 1. a factory rejecting the values the user gave is a usage error naming the component
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--conv", "soc-fast:train_terms=1"], "error: conv 'soc-fast' rejected train_terms=1: train_terms must be in 2..64, got 1"),
        (["--head", "mlp:hidden=-1"], "error: head 'mlp' rejected hidden=-1: hidden must be in 1..32768, got -1"),
        (["--arch", "lipconvnet-5:width=0"], "error: arch 'lipconvnet-5' rejected width=0: width must be in 1..256, got 0"),
        (["--width", "257"], "error: arch 'lipconvnet-5' rejected width=257: width must be in 1..256, got 257"),
        (["--batch-size", "65537"], "error: --batch-size must be in 1..65536, got 65537"),
        (["--width", "3"], "error: --width 3: MaxMin needs an even number of channels, got 3"),
        (["--arch", "lipconvnet-5:width=3"],
         "error: arch 'lipconvnet-5' with width=3: activation 'maxmin': MaxMin needs an even number"),
        (["--arch", "lipconvnet-5:width=6", "--width", "4"],
         "error: conflicting widths: --arch lipconvnet-5:width=6 sets width 6 but --width is 4"),
    ],
)
def test_rejected_component_values_are_usage_errors(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    before = files_under(tmp_path)
    r = train(["--dataset", "digits", "--limit-train", "32", "--limit-test", "16", *args,
               "--out", "x/m.safetensors"])
    assert r.exit_code == 2, r.output
    assert one_error_line(r).startswith(message), r.stderr
    assert files_under(tmp_path) == before


def test_third_party_pool_rejecting_a_value_is_a_usage_error(tmp_path, monkeypatch):
    """The real polygon plugin (installed, or registered in-process from its source tree)."""
    monkeypatch.chdir(tmp_path)
    src = str(ROOT / "plugins" / "lipcli-polygon-pool" / "src")
    sys.path.insert(0, src)
    try:
        module = importlib.import_module("lipcli_polygon_pool.plugin")
    finally:
        sys.path.remove(src)
    plugins.reset()
    try:
        with registered(("polygon-in-process", module)):
            r = train(["--dataset", "digits", "--width", "4", "--pool", "polygon:radius=0",
                       "--out", "x/m.safetensors"])
            assert r.exit_code == 2, r.output
            line = one_error_line(r)
            assert line.startswith("error: pool 'polygon' rejected radius=0: radius must be in (0.01, 10000], got 0.0"), line
            r = train(["--dataset", "digits", "--width", "4", "--pool", "polygon:vertices=2"])
            assert r.exit_code == 2 and one_error_line(r).startswith("error: pool 'polygon' rejected vertices=2: vertices")
    finally:
        plugins.reset()
    assert not (tmp_path / "x").exists()


def test_python_api_reports_the_component_and_stays_a_value_error():
    with pytest.raises(ComponentParameterError) as exc:
        create_model("lipconvnet-5", width=3)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, LipUsageError)
    assert exc.value.kind == "activation" and exc.value.context[2] == {"width": 3}
    with pytest.raises(ValueError, match="conv 'soc-fast' rejected train_terms=1"):
        create_model("lipconvnet-5", width=4, conv="soc-fast:train_terms=1")


def test_a_bug_in_a_factory_is_still_an_internal_error(monkeypatch):
    import lipcli.builtins.activations as A

    def broken(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(A.MaxMin, "__init__", broken)
    with pytest.raises(RuntimeError, match="boom"):
        create_model("lipconvnet-5", width=4)


# --------------------------------------------------------------------------------------------
# 2. existing outputs are replaced only with --overwrite; 4. the same width twice is fine
# --------------------------------------------------------------------------------------------
def test_existing_model_file_and_finished_run_need_overwrite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    args = [*TINY, "--config", str(cfg), "--arch", "lipconvnet-5:width=4"]  # width given twice, equal
    r = train([*args, "--out", "m.safetensors"])
    assert r.exit_code == 0, r.output
    model_bytes = Path("m.safetensors").read_bytes()
    log = Path("m-run/train_log.jsonl").read_text()
    assert log.strip()

    r = train([*args, "--out", "m.safetensors"])
    assert r.exit_code == 2
    line = one_error_line(r)
    assert "m.safetensors already exists" in line and "--overwrite" in line
    assert Path("m.safetensors").read_bytes() == model_bytes
    assert Path("m-run/train_log.jsonl").read_text() == log

    # the model file moved away: the finished run directory is still protected
    Path("m.safetensors").rename("kept.safetensors")
    r = train([*args, "--out", "m.safetensors"])
    assert r.exit_code == 2
    line = one_error_line(r)
    assert "m-run holds a finished run" in line and "--overwrite" in line
    assert Path("m-run/train_log.jsonl").read_text() == log
    r = train([*args, "--run-dir", "m-run"])
    assert r.exit_code == 2 and "--overwrite" in one_error_line(r)

    r = train([*args, "--out", "m.safetensors", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert len(Path("m-run/train_log.jsonl").read_text().splitlines()) == 1
    _, ck = read_checkpoint(Path("m-run/checkpoint.safetensors"))
    assert ck["status"] == "complete"

    help_text = runner.invoke(app, ["train", "--help"]).stdout
    assert "--overwrite" in help_text


# --------------------------------------------------------------------------------------------
# 3. --resume accepts an option repeated with its stored value
# --------------------------------------------------------------------------------------------
def test_resume_accepts_unchanged_settings_and_refuses_changed_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path)
    r = train([*TINY, "--config", str(cfg), "--head", "mlp:hidden=16", "--out", "r/m.safetensors"],
              env={INTERRUPT_ENV: "0:1"})
    assert r.exit_code == 130, r.output
    r = train(["--resume", "r/m-run", "--epochs", "2"])
    assert r.exit_code == 2
    line = one_error_line(r)
    assert "cannot change --epochs (stored: 1)" in line
    Path("taken.safetensors").write_bytes(b"not mine")
    r = train(["--resume", "r/m-run", "--out", "taken.safetensors"])
    assert r.exit_code == 2 and "taken.safetensors already exists" in one_error_line(r)
    assert Path("taken.safetensors").read_bytes() == b"not mine"
    r = train(["--resume", "r/m-run", *TINY, "--head", "mlp: hidden = 16", "--lr", "0.1",
               "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["epochs"] == 1
    assert read_metadata("r/m.safetensors")["training"]["resumed_from_epochs"] == [0]


# --------------------------------------------------------------------------------------------
# 5. lip lipschitz --no-estimate --write keeps the stored estimate of the same weights
# --------------------------------------------------------------------------------------------
def test_lipschitz_write_without_estimate_keeps_the_stored_estimate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(tmp_path, lipschitz_estimate=True)
    r = train([*TINY, "--config", str(cfg), "--out", "e.safetensors"])
    assert r.exit_code == 0, r.output
    before = read_metadata("e.safetensors")["lipschitz"]
    assert before["estimate"] > 0 and before["estimate_iters"] == 50

    r = runner.invoke(app, ["lipschitz", "e.safetensors", "--no-estimate", "--write"])
    assert r.exit_code == 0, r.output
    assert "kept the file's estimate" in r.stdout
    after = read_metadata("e.safetensors")["lipschitz"]
    assert after["estimate"] == before["estimate"] and after["estimate_iters"] == 50
    assert [row["estimate"] for row in after["layers"]] == [row["estimate"] for row in before["layers"]]
    assert after["upper_bound"] == pytest.approx(before["upper_bound"], rel=1e-12)
    assert after["estimate_label"] == ESTIMATE_LABEL and after["upper_bound_label"] == BOUND_LABEL
    assert after["carried_over"] == ["estimate"]
    assert after["weights_sha256"] == before["weights_sha256"]

    # a stored estimate of other weights is dropped, not relabelled as this model's
    fresh = {k: v for k, v in after.items() if k != "carried_over"}
    fresh.update(estimate=None, estimate_iters=None, layers=[dict(r, estimate=None) for r in after["layers"]])
    stale = dict(before, weights_sha256="0" * 64)
    merged = merge_stored_record(fresh, stale)
    assert merged["estimate"] is None and "carried_over" not in merged
    # a freshly computed estimate always wins over the stored one
    assert merge_stored_record(dict(before, estimate=1.5), dict(before, estimate=9.0))["estimate"] == 1.5


def test_command_line_width_wins_over_the_settings_file(tmp_path, monkeypatch):
    """``--config`` promises "options given here win": a width on the command line, in
    either form, replaces the file's width in either form (no conflict error)."""
    import lipcli.train as T

    seen = {}

    def capture(cfg, **kwargs):
        seen["cfg"] = cfg
        return {}

    monkeypatch.setattr(T, "train", capture)
    runner = CliRunner()
    for file_text, args, arch, width in (
        ('arch = "lipconvnet-5:width=6"\n', ["--width", "4"], "lipconvnet-5", 4),
        ("width = 6\n", ["--arch", "lipconvnet-5:width=8"], "lipconvnet-5:width=8", None),
        ('arch = "lipconvnet-10:width=6"\nwidth = 6\n', ["--width", "4"], "lipconvnet-10", 4),
        ("width = 6\n", [], "lipconvnet-5", 6),  # nothing on the command line: the file's
    ):
        conf = tmp_path / "c.toml"
        conf.write_text('dataset = "digits"\n' + file_text)
        r = runner.invoke(app, ["train", "--config", str(conf), *args])
        assert r.exit_code == 0, r.output
        assert seen["cfg"].arch == arch and seen["cfg"].width == width, (file_text, args, seen)


def test_interrupt_message_comes_from_one_rank_only(monkeypatch):
    """Under torchrun every rank sees Ctrl-C; only rank 0's error carries the message, the
    others exit with the same code silently."""
    import lipcli.train as T
    from lipcli.train.errors import TrainingInterrupted

    def interrupted(silent):
        def run(cfg, **kwargs):
            exc = TrainingInterrupted("interrupted during epoch 2; resume with: torchrun ...")
            exc.silent = silent
            raise exc
        return run

    runner = CliRunner()
    monkeypatch.setattr(T, "train", interrupted(False))
    r = runner.invoke(app, ["train", "--dataset", "digits"])
    assert r.exit_code == 130 and "resume with" in one_error_line(r)
    monkeypatch.setattr(T, "train", interrupted(True))
    r = runner.invoke(app, ["train", "--dataset", "digits"])
    assert r.exit_code == 130 and r.stderr == "" and r.stdout == ""


def test_a_directory_given_as_model_is_a_usage_error(tmp_path):
    runner = CliRunner()
    for args in (["certify", str(tmp_path)], ["lipschitz", str(tmp_path)],
                 ["bench", "certify", str(tmp_path)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "is a directory, not a model file" in one_error_line(r)


def test_device_option_is_validated_the_same_way_everywhere(tmp_path, monkeypatch):
    """One parser for --device (lip train, certify, lipschitz, bench): names torch accepts
    but lipcli cannot run on (meta, mps) are usage errors too, with the same message."""
    from lipcli._util.devices import check_device_name, resolve_device
    from lipcli.train.distributed import DistContext

    assert str(resolve_device("CPU")) == "cpu"
    assert [check_device_name(n) for n in ("auto", " CPU", "cuda", "cuda:3")] == [
        "auto", "cpu", "cuda", "cuda:3"]
    for bad in ("meta", "mps", "cuda:x", "cuda:", "cuda:-1", "cuda:01", "cuda:257",
                "cuda:99999999999999999999",
                "tpu", ""):
        with pytest.raises(LipUsageError, match="use cpu, cuda, cuda:N or auto"):
            check_device_name(bad)
    assert DistContext.from_env().resolve_device("cpu") == torch.device("cpu")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in (["bench", "certify", "--device", "meta", "--width", "4"],
                 ["bench", "certify", "--device", "cuda:01", "--width", "4"],
                 ["bench", "train", "--device", "mps", "--archs", "5"],
                 ["train", "--dataset", "digits", "--device", "mps", "--epochs", "1"],
                 ["lipschitz", str(save_tiny_model(tmp_path / "m.safetensors", dataset=None)),
                  "--device", "meta"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "--device" in one_error_line(r)
    with pytest.raises(LipUsageError, match="unknown device 'meta'"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(LipUsageError, match="CUDA is not available"):
            DistContext.from_env().resolve_device("cuda")


@pytest.mark.parametrize("args, message", [
    (["certify", "{model}", "--batch-size", "65537"], "--batch-size must be in 1..65536"),
    (["certify", "{model}", "--attack", "--attack-steps", "10001"], "--attack-steps must be in 1..10000"),
    (["certify", "{model}", "--attack", "--attack-restarts", "1001"], "--attack-restarts must be in 1..1000"),
    (["certify", "{model}", "--lipschitz-iters", "100001"], "--lipschitz-iters must be in 1..100000"),
    (["lipschitz", "{model}", "--iters", "100001"], "--iters must be in 1..100000"),
    (["bench", "certify", "--width", "257"], "width must be in 1..256"),
    (["bench", "certify", "--n", "1000001"], "--n must be in 1..1000000"),
    (["bench", "certify", "--refresh-steps", "1001"], "--refresh-steps must be in 0..1000"),
    (["bench", "train", "--batch-size", "65537", "--archs", "5"], "--batch-size must be in 1..65536"),
    (["bench", "train", "--steps", "100001", "--archs", "5"], "--steps must be in 1..100000"),
])
def test_sized_settings_of_the_commands_have_a_range(tmp_path, monkeypatch, capsys, args, message):
    """What sizes memory or time is refused above its limit, in one line, before any work
    (through ``lip``'s entry point, which also reports option-parsing errors in one line)."""
    from lipcli.cli import main

    model = save_tiny_model(tmp_path / "m.safetensors", dataset=None)
    before = model.read_bytes()
    monkeypatch.setattr(sys, "argv", ["lip", *(a.format(model=model) for a in args)])
    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert model.read_bytes() == before
