"""``lip train --nproc-per-node N`` (lipcli.train.launch, lipcli.train.check_train): the whole
run is validated in the launching process before any worker starts; workers are the same
command line without the option; a failing worker is one line and the worker's exit code,
never torchrun's traceback; Ctrl-C stops the workers with the resume hint.

Real processes for the launches (2 gloo workers on CPU, LipConvnet-5 width 4, 32 digits)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.cli.train_cmd import command_line_args
from lipcli.host.modelfile import read_metadata
from lipcli.sdk.errors import LipUsageError
from lipcli.train import LaunchResult, TrainConfig, check_train

runner = CliRunner()
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "16", "--limit-train", "32",
        "--limit-test", "16", "--device", "cpu", "-q", "--no-lipschitz-estimate", "--epochs", "1"]


@pytest.fixture
def tiny(tmp_path):
    """TINY plus a settings file with 3 power steps per refresh (fast)."""
    (tmp_path / "tiny.toml").write_text("power_iter_steps = 3\n")
    return [*TINY, "--config", str(tmp_path / "tiny.toml")]


def lip(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.Popen([sys.executable, "-m", "lipcli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def assert_one_clean_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "ChildFailedError" not in err
    return lines[0]


# --------------------------------------------------------------------------------------------
# pieces
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("codes", "sig", "expected"), [
    ({}, None, 0),
    ({0: 1, 1: 1}, None, 1),
    ({0: 2, 1: 2}, None, 2),
    ({1: 1, 0: 2}, None, 2),   # a usage error wins
    ({0: 130, 1: 130}, None, 130),
    ({1: -9}, None, 1),        # killed by a signal
    ({}, signal.SIGINT, 130),  # this process got Ctrl-C
    ({}, signal.SIGTERM, 143),
])
def test_the_launch_exit_code(codes, sig, expected):
    result = LaunchResult(processes=2, exit_codes=codes, signal=None if sig is None else int(sig))
    assert result.exit_code == expected
    assert result.ok == (expected == 0)


def test_the_reported_error_is_the_first_written_as_rank_0s_when_the_same():
    from lipcli.train.launch import WorkerError

    same = [WorkerError(1, 1, "loss became NaN", 1.0), WorkerError(0, 1, "loss became NaN", 1.5)]
    assert LaunchResult(2, {0: 1, 1: 1}, errors=same).message.rank == 0
    cause = [WorkerError(1, 2, "process 1 has no GPU", 1.0), WorkerError(0, 1, "internal error: gloo", 2.0)]
    result = LaunchResult(2, {0: 1, 1: 2}, errors=cause)
    assert result.message.rank == 1 and result.exit_code == 2  # the cause and its code


def test_outside_a_launched_worker_nothing_is_reported(monkeypatch, tmp_path):
    from lipcli.train.launch import report_to_launcher

    monkeypatch.delenv("LIPCLI_LAUNCH_ERRORS", raising=False)
    report_to_launcher("x", 1)  # returns (a launched worker would end here)
    monkeypatch.setenv("LIPCLI_LAUNCH_ERRORS", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    report_to_launcher("x", 1)
    assert list(tmp_path.iterdir()) == []


def test_killed_workers_are_named_by_their_signal():
    assert LaunchResult(2, {0: 1, 1: -9}).killed == {1: "SIGKILL"}


def _parse(args: list[str]) -> typer.Context:
    command = typer.main.get_command(app).commands["train"]
    return command.make_context("train", list(args))


def test_the_workers_command_line_parses_back_to_the_same_options(tmp_path):
    given = ["--arch", "lipconvnet-5:width=4", "-o", str(tmp_path / "a b.safetensors"), "--lr", "1e-05",
             "--no-augment", "--amp", "--nproc-per-node", "3", "--extra-ratio", "0.25", "--json",
             "--loss", "margin-offset:offset=-0.5", "-q", "--seed", "7"]
    ctx = _parse(given)
    args = command_line_args(ctx, exclude={"nproc_per_node"})
    again = _parse(args)
    assert "--nproc-per-node" not in " ".join(args)
    expected = dict(ctx.params, nproc_per_node=1)
    assert again.params == expected
    # only what was given: everything else keeps its default in the workers too
    assert {name for name in again.params if again.get_parameter_source(name).name == "COMMANDLINE"} == {
        "arch", "out", "lr", "augment", "amp", "extra_ratio", "json_out", "loss", "quiet", "seed"}


def test_check_train_validates_for_every_process_and_writes_nothing(tmp_path):
    with pytest.raises(LipUsageError, match="divisible by the 2 processes"):
        check_train(TrainConfig(dataset="digits", batch_size=3, device="cpu"), processes=2,
                    out=str(tmp_path / "m.safetensors"))
    paths = check_train(TrainConfig(dataset="digits", width=4, batch_size=4, device="cpu", limit_train=8),
                        processes=2, out=str(tmp_path / "m.safetensors"))
    assert paths.out == tmp_path / "m.safetensors" and paths.run_dir == tmp_path / "m-run"
    assert list(tmp_path.iterdir()) == []


def test_a_bad_option_is_refused_before_any_worker_starts(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr("lipcli.train.launch.launch_workers", lambda *a: started.append(a))
    r = runner.invoke(app, ["train", "--nproc-per-node", "2", *tiny, "--batch-size", "3", "--out", "m.safetensors"])
    assert r.exit_code == 2 and started == []
    assert r.stderr.strip() == "error: --batch-size 3 is the global batch; it must be divisible by the 2 processes"
    # a hint to continue a run names this command line
    (tmp_path / "m-run").mkdir()
    (tmp_path / "m-run" / "checkpoint.safetensors").write_bytes(b"not a checkpoint")
    r = runner.invoke(app, ["train", "--nproc-per-node", "2", *tiny, "--out", "m.safetensors"])
    assert r.exit_code == 2 and started == []
    assert "`lip train --nproc-per-node 2 --resume m-run`" in r.stderr
    r = runner.invoke(app, ["train", "--nproc-per-node", "0", *tiny])
    assert r.exit_code == 2 and "--nproc-per-node" in r.output


def test_more_processes_than_cores_are_refused_before_anything_starts(tiny, tmp_path, monkeypatch):
    """``--nproc-per-node`` above the CPU cores this process may use: one line naming the
    option and its range, exit 2, before the run is even checked; ``--oversubscribe`` lets
    it through (and is not passed on to the workers)."""
    monkeypatch.chdir(tmp_path)
    started, checked = [], []
    monkeypatch.setattr("lipcli.train.launch.usable_cpus", lambda: 2)
    monkeypatch.setattr("lipcli.train.launch.launch_workers",
                        lambda n, args: started.append((n, args)) or LaunchResult(processes=n))
    monkeypatch.setattr("lipcli.train.check_train", lambda *a, **k: checked.append(k) or check_train(*a, **k))
    r = runner.invoke(app, ["train", "--nproc-per-node", "4", *tiny, "--out", "m.safetensors"])
    assert r.exit_code == 2 and started == [] and checked == []
    assert r.stderr.strip() == ("error: --nproc-per-node 4 is more than the 2 CPU core(s) this process may "
                                "use (range 1..2; --oversubscribe allows more)")
    r = runner.invoke(app, ["train", "--nproc-per-node", "2", *tiny, "--out", "m.safetensors"])
    assert r.exit_code == 0 and [n for n, _ in started] == [2], r.output
    r = runner.invoke(app, ["train", "--nproc-per-node", "4", "--oversubscribe", *tiny, "--out", "m.safetensors"])
    assert r.exit_code == 0 and [n for n, _ in started] == [2, 4] and len(checked) == 2, r.output
    assert "--oversubscribe" not in started[-1][1] and "--nproc-per-node" not in " ".join(started[-1][1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]  # the workers would write


def test_the_process_limit_is_the_cuda_devices_of_a_cuda_run(monkeypatch, tmp_path):
    import torch

    from lipcli.cli.train_cmd import _device_setting
    from lipcli.train.launch import check_process_count, usable_cpus

    assert usable_cpus() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert usable_cpus() == 5
    check_process_count(5, "cpu")
    with pytest.raises(LipUsageError, match=r"^nproc_per_node 6 is more than the 5 CPU core\(s\) .*\(range 1\.\.5; "):
        check_process_count(6, "cpu")
    check_process_count(6, "cpu", oversubscribe=True)
    monkeypatch.setattr("lipcli._util.devices.resolve_device", lambda name: torch.device(name))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_process_count(2, "cuda")
    for oversubscribe in (False, True):  # each process takes a GPU of its own
        with pytest.raises(LipUsageError, match=r"^nproc_per_node 3 is more than the 2 CUDA device\(s\) .*"
                                                r"\(range 1\.\.2\)$"):
            check_process_count(3, "cuda", oversubscribe)
    check_process_count(5, "cuda:1")  # one device named for every process: the cores count
    # the device of a run to resume: given, else the run directory's config.json, else auto
    (tmp_path / "config.json").write_text(json.dumps({"device": "cuda"}))
    assert _device_setting([], {"resume": str(tmp_path), "resume_overrides": {"device": "cpu"}}) == "cpu"
    assert _device_setting([], {"resume": str(tmp_path), "resume_overrides": {}}) == "cuda"
    assert _device_setting([], {"resume": str(tmp_path / "gone"), "resume_overrides": {}}) == "auto"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_64_processes_on_one_core_is_one_line_and_starts_nothing(tiny, tmp_path):
    """A real ``lip train --nproc-per-node 64`` limited to one CPU core: exit 2, one line,
    nothing written (no worker ever started)."""
    core = min(os.sched_getaffinity(0))
    proc = lip(["train", "--nproc-per-node", "64", *tiny, "--out", "m.safetensors"], tmp_path,
               preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    code, out, err = finish(proc, timeout=300)
    assert code == 2 and out == ""
    assert assert_one_clean_line(err) == ("error: --nproc-per-node 64 is more than the 1 CPU core(s) this "
                                          "process may use (range 1..1; --oversubscribe allows more)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]


def test_nproc_per_node_is_refused_under_torchrun(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    r = runner.invoke(app, ["train", "--nproc-per-node", "2", *tiny])
    assert r.exit_code == 2 and "under torchrun leave it out" in r.stderr


def test_a_usage_error_is_one_line_without_a_traceback(tiny, tmp_path):
    code, out, err = finish(lip(["train", "--nproc-per-node", "2", *tiny, "--arch", "bogus",
                                 "--out", "m.safetensors"], tmp_path))
    assert code == 2 and out == ""
    assert assert_one_clean_line(err).startswith("error: unknown arch 'bogus'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]


# --------------------------------------------------------------------------------------------
# two real gloo workers
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_write_one_model(tiny, tmp_path):
    code, out, err = finish(lip(["train", "--nproc-per-node", "2", *tiny, "--out", "m.safetensors",
                                 "--json"], tmp_path))
    assert code == 0, err
    assert json.loads(out)["world_size"] == 2
    meta = read_metadata(tmp_path / "m.safetensors")
    assert meta["training"]["world_size"] == 2 and meta["training"]["backend"] == "gloo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-run", "m.safetensors", "tiny.toml"]
    assert "Traceback" not in err and "error" not in err


@pytest.mark.slow
def test_a_runtime_error_in_the_workers_is_one_line_and_exit_1(tiny, tmp_path):
    """The loss diverges in every worker (learning rate and weight decay at their ceilings, 1000
    and 10: the weights grow 1e4-fold a step): rank 0 says so, once."""
    with (tmp_path / "tiny.toml").open("a") as fh:
        fh.write("weight_decay = 10\n")
    code, out, err = finish(lip(["train", "--nproc-per-node", "2", *tiny, "--lr", "1000", "--batch-size", "2",
                                 "--out", "m.safetensors"], tmp_path))
    assert code == 1 and out == ""
    assert assert_one_clean_line(err).startswith("error: training diverged at epoch 1 step ")
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_with_the_resume_hint(tiny, tmp_path):
    args = [a if a != "32" else "640" for a in tiny]  # a longer epoch (20 steps per worker)
    args[args.index("--epochs") + 1] = "20"
    proc = lip(["train", "--nproc-per-node", "2", *args, "--out", "m.safetensors"], tmp_path)
    log = tmp_path / "m-run" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not log.exists():  # the first epoch is done: a checkpoint to resume from
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130
    line = assert_one_clean_line(err)
    assert line.startswith("error: interrupted ")
    assert line.endswith("resume with: lip train --nproc-per-node 2 --resume m-run")
    assert not (tmp_path / "m-run" / ".lipcli.lock").exists()
