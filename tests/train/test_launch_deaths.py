"""``kill -9`` during ``lip train --nproc-per-node 2`` (issue 26 item 7): of one worker, the
launcher names it with the resume command (was "internal error: RuntimeError: [gloo]
Connection reset by peer"); of the launcher, the workers stop instead of training on as
orphans, and rank 0 prints one line with the resume command.  Real processes: 2 gloo
workers on CPU, LipConvnet-5 width 4, digits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "16", "--limit-train", "640",
        "--limit-test", "16", "--device", "cpu", "-q", "--no-lipschitz-estimate", "--epochs", "50"]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(tmp_path: Path, stderr) -> tuple[subprocess.Popen, list[int]]:
    """The launch, once its first epoch is checkpointed; returns it and its 2 workers' ids."""
    (tmp_path / "tiny.toml").write_text("power_iter_steps = 3\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lipcli", "train", "--nproc-per-node", "2", *TINY,
                             "--config", "tiny.toml", "--out", "m.safetensors"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    log = tmp_path / "m-run" / "train_log.jsonl"
    deadline = time.monotonic() + 300
    while not log.exists():
        assert proc.poll() is None, "the launch ended early"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    return proc, workers


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "internal error" not in err and "gloo" not in err, err
    return lines[0]


def _resume_works(tmp_path: Path, monkeypatch) -> None:
    """The hint is right: ``lip train --nproc-per-node 2 --resume m-run`` is accepted (the
    launcher's own validation: a checkpoint to continue, no lock left behind)."""
    from lipcli.train import check_train

    monkeypatch.chdir(tmp_path)
    check_train(resume="m-run", processes=2)


@pytest.mark.slow
def test_kill_9_of_a_worker_names_it_with_the_resume_command(tmp_path, monkeypatch):
    proc, workers = _start(tmp_path, subprocess.PIPE)
    os.kill(max(workers), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    line = _one_line(err)
    assert line.startswith("error: worker ") and "died (signal 9, SIGKILL)" in line, line
    assert line.endswith("; resume with: lip train --nproc-per-node 2 --resume m-run"), line
    assert not any(_alive(w) for w in workers)
    _resume_works(tmp_path, monkeypatch)


@pytest.mark.slow
def test_kill_9_of_the_launcher_stops_the_workers_with_the_resume_command(tmp_path, monkeypatch):
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc, workers = _start(tmp_path, err_file)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(_alive(w) for w in workers):
            if time.monotonic() > deadline:
                for w in workers:  # do not leave them behind, then fail
                    if _alive(w):
                        os.kill(w, signal.SIGKILL)
                pytest.fail("the workers outlived the launcher by 60 s")
            time.sleep(0.1)
    line = _one_line(err_path.read_text())
    assert line.endswith("resume with: lip train --nproc-per-node 2 --resume m-run"), line
    assert not (tmp_path / "m-run" / ".lipcli.lock").exists()
    _resume_works(tmp_path, monkeypatch)


def test_gloo_connection_errors_are_recognised_as_a_lost_process():
    from lipcli.train.distributed import lost_connection

    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                        "[127.0.0.1]:17307: Connection reset by peer")
    assert lost_connection(gloo)
    assert not lost_connection(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
