"""Out of memory is a runtime error (issue 34): an allocation failure in training or
certification ends with one line naming the step and the settings that sized it, exit 1, no
"internal error"; a training run stays resumable.  A run whose memory estimate exceeds what is
available is refused before anything is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import lipcli.certify.driver as certify_driver
import lipcli.train as T
import lipcli.train.memory as memory
from lipcli._util.memory import available_memory, cpu_available
from lipcli.cli import app
from lipcli.sdk.errors import OutOfMemory, is_allocation_failure, memory_step
from lipcli.train import read_checkpoint

runner = CliRunner()
CPU_OOM = ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes. "
           "Error code 12 (Cannot allocate memory)")
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--no-lipschitz-estimate", "--device", "cpu", "-q"]


def one_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "internal error" not in lines[0] and "Traceback" not in result.output
    return lines[0]


def fail_at(monkeypatch, owner, name: str, call: int, exc: BaseException) -> None:
    """Make the ``call``-th call of ``owner.name`` raise ``exc``."""
    original, calls = getattr(owner, name), {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise exc
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


# ---- the pieces ---------------------------------------------------------------------------
@pytest.mark.parametrize("exc, expected", [
    (MemoryError(), True),
    (RuntimeError(CPU_OOM), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("out of memory"), False),
])
def test_allocation_failures_are_recognised(exc, expected):
    assert is_allocation_failure(exc) is expected


def test_memory_step_names_the_step_and_its_settings():
    with pytest.raises(OutOfMemory) as info:
        with memory_step("feature extraction", "{batch_size}"):
            raise RuntimeError(CPU_OOM)
    assert info.value.settings == ("batch_size",) and info.value.exit_code == 1
    assert str(info.value).startswith("out of memory in the feature extraction (its memory grows with batch_size)")
    assert "--batch-size" in info.value.render(lambda n: "--" + n.replace("_", "-"))
    with pytest.raises(ValueError):  # other errors pass unchanged
        with memory_step("x", "{batch_size}"):
            raise ValueError("bad")


def test_available_memory_on_this_machine_is_positive():
    available, how = cpu_available()
    if available is None:
        pytest.skip(how)
    assert available > 0 and how
    assert available_memory(torch.device("cpu")) == cpu_available() or available_memory(torch.device("cpu"))[0] > 0


# ---- training -------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError(CPU_OOM), torch.OutOfMemoryError("CUDA out of memory")])
def test_out_of_memory_in_a_training_step_is_one_line_and_the_run_resumes(tmp_path, monkeypatch, exc):
    monkeypatch.chdir(tmp_path)
    fail_at(monkeypatch, T.TrainStep, "forward", 3, exc)  # epoch 2, step 1 (2 steps per epoch)
    line = one_line(runner.invoke(app, ["train", *TINY, "--epochs", "2", "--out", "m.safetensors"]))
    assert line.startswith("error: out of memory in the training step 1 of epoch 2 (its memory grows "
                           "with --batch-size, --width and the parameters of --conv"), line
    assert "the checkpoint after epoch 1 is kept in m-run" in line and "`lip train --resume m-run`" in line
    assert not Path("m.safetensors").exists()
    assert sorted(p.name for p in Path("m-run").iterdir() if ".tmp" in p.name or p.name.startswith(".")) == []
    _, meta = read_checkpoint(Path("m-run/checkpoint.safetensors"))
    assert meta["epoch"] == 1 and meta["status"] == "running"
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["train", "--resume", "m-run", "-q"])
    assert r.exit_code == 0, r.output
    _, meta = read_checkpoint(Path("m-run/checkpoint.safetensors"))
    assert meta["status"] == "complete" and meta["epoch"] == 2 and Path("m.safetensors").is_file()


def test_out_of_memory_in_the_test_evaluation_resumes_with_a_lower_eval_batch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import lipcli.train.run as run_module

    fail_at(monkeypatch, run_module, "evaluate", 1, MemoryError())
    line = one_line(runner.invoke(app, ["train", *TINY, "--epochs", "1", "--out", "m.safetensors"]))
    assert line.startswith("error: out of memory in the test evaluation of the trained model (its memory "
                           "grows with --eval-batch-size"), line
    assert "`lip train --resume m-run --eval-batch-size N`" in line
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["train", "--resume", "m-run", "--eval-batch-size", "8", "-q"])
    assert r.exit_code == 0, r.output
    _, meta = read_checkpoint(Path("m-run/checkpoint.safetensors"))
    assert meta["status"] == "complete" and meta["config"]["eval_batch_size"] == 8


# ---- the estimate before a run ------------------------------------------------------------
def test_a_run_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_memory", lambda device: (2**20, "MemAvailable + SwapFree"))
    line = one_line(runner.invoke(app, ["train", *TINY, "--epochs", "1", "--out", "m.safetensors"]))
    assert line.startswith("error: the run does not fit in memory: one training step needs "), line
    assert "but 1 MiB available (MemAvailable + SwapFree)" in line and "--batch-size" in line
    assert not Path("m-run").exists() and not Path("m.safetensors").exists()


def test_the_estimate_grows_with_the_batch_and_is_measured_on_a_copy():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 16 * 16, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    small = memory.estimate_step(model, (1, 16, 16), 4, "sgd", 0.9, torch.device("cpu"), None)
    large = memory.estimate_step(model, (1, 16, 16), 400, "sgd", 0.9, torch.device("cpu"), None)
    weights = sum(p.numel() * 4 for p in model.parameters()) * 3  # weight, gradient, momentum
    assert small.weights == large.weights == weights
    # per image: the conv's input (saved by the conv) and the ReLU's output (saved by the ReLU and
    # the linear layer, one storage)
    assert 8 * 16 * 16 * 4 <= small.per_image <= 3 * (1 + 8) * 16 * 16 * 4
    assert large.total - small.total == 396 * small.per_image
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # measured on a copy
    stopped = memory.estimate_step(model, (1, 16, 16), 4, "sgd", 0.9, torch.device("cpu"), weights + 1000)
    assert stopped.exceeded and stopped.measured  # the activations of one image pass 1000 bytes
    unmeasured = memory.estimate_step(model, (1, 16, 16), 4, "sgd", 0.9, torch.device("cpu"), weights)
    assert not unmeasured.measured and unmeasured.total == weights


# ---- certification ----------------------------------------------------------------------------
@pytest.mark.parametrize("owner, name, step, setting", [
    (certify_driver, "extract_features", "feature extraction", "--batch-size"),
    (certify_driver, "certify_features", "certificate", "--batch-size"),
    (certify_driver, "lowered_network", "eval lowering build", "--dense-max-mib"),
])
def test_out_of_memory_in_certification_is_one_line_and_leaves_the_file(tiny_model_file, tmp_path, monkeypatch,
                                                                       owner, name, step, setting):
    path = shutil.copy(tiny_model_file, tmp_path / "m.safetensors")
    before = Path(path).read_bytes()
    fail_at(monkeypatch, owner, name, 1, RuntimeError(CPU_OOM))
    line = one_line(runner.invoke(app, ["certify", str(path), "--radii", "36", "--limit", "8", "-q",
                                        "--device", "cpu"]))
    assert line.startswith(f"error: out of memory in the {step} (its memory grows with {setting}"), line
    assert "the model file is unchanged" in line
    assert Path(path).read_bytes() == before
    monkeypatch.undo()
    r = runner.invoke(app, ["certify", str(path), "--radii", "36", "--limit", "8", "-q", "--device", "cpu"])
    assert r.exit_code == 0, r.output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ulimit -v")
def test_a_real_address_space_limit_gives_one_line(tmp_path):
    """A real process under ``ulimit -v``: refused by the estimate or stopped by the failing step,
    one line and exit 1 either way."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"}
    probe = subprocess.run([sys.executable, "-c", "import torch, torchvision, lipcli.train.driver, lipcli.cli.train_cmd; "
                            "print(int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]))"],
                           env=env, capture_output=True, text=True, timeout=300)
    base_kib = int(probe.stdout.strip())  # the address space of torch and lipcli, loaded
    cmd = [sys.executable, "-m", "lipcli", "train", *TINY, "--epochs", "1", "--width", "16",
           "--batch-size", "2048", "--limit-train", "2048", "--out", "m.safetensors"]
    proc = subprocess.run(["bash", "-c", f'ulimit -v {base_kib + 400 * 1024}; exec "$@"', "_", *cmd],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(("error: the run does not fit in memory", "error: out of memory in the ")), lines[0]
    assert "--width" in lines[0], lines[0]
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ulimit -v")
def test_a_limit_too_small_to_load_torch_is_one_line_before_anything(tmp_path):
    """Under ``ulimit -v`` below what torch needs, importing it aborts in native code (two C++
    lines, exit 134): the command is refused first, one line, exit 1, nothing written;
    ``--help`` still works."""
    from lipcli.cli.common import MIN_ADDRESS_SPACE

    limit_kib = MIN_ADDRESS_SPACE // 1024 - 200 * 1024
    cmd = [sys.executable, "-m", "lipcli", "train", *TINY, "--epochs", "1", "--out", "m.safetensors"]
    errors = {}
    for args, code in ((cmd, 1), ([*cmd[:3], "--help"], 0)):
        proc = subprocess.run(["bash", "-c", f'ulimit -v {limit_kib}; exec "$@"', "_", *args],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == code, proc.stderr
        errors[code] = proc.stderr.strip().splitlines()
    assert len(errors[1]) == 1 and errors[1][0].startswith("error: the address-space limit (ulimit -v) is "), errors
    assert list(tmp_path.iterdir()) == []


def test_out_of_memory_in_the_lipschitz_report_is_one_line(tiny_model_file, tmp_path, monkeypatch):
    import lipcli.lipschitz.report as report

    path = shutil.copy(tiny_model_file, tmp_path / "m.safetensors")
    fail_at(monkeypatch, report, "lipschitz_report", 1, MemoryError())
    line = one_line(runner.invoke(app, ["lipschitz", str(path), "--write", "-q"]))
    assert line.startswith("error: out of memory in the Lipschitz report (its memory grows with the "
                           "model's width); run it where more memory is free, or with --no-estimate"), line
