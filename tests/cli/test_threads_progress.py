"""``--threads`` on every command that computes (set at the command's start, in the CLI only;
default: torch's own, with OMP_WAIT_POLICY=PASSIVE) and the attack progress bar
with an ETA (issue 26 item 10: attacks ran for minutes with a bar that jumped 0 -> done)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app

from conftest import save_tiny_model

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("thr") / "tiny.safetensors",
                           dataset={"name": "digits", "params": {}, "num_classes": 10})


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("command", [["train"], ["certify"], ["lipschitz"], ["export"],
                                     ["bench", "train"], ["bench", "certify"], ["bench", "profile"]])
def test_every_computing_command_has_threads(command):
    r = runner.invoke(app, [*command, "--help"])
    assert r.exit_code == 0 and "--threads N" in r.stdout and "OMP_NUM_THREADS" in r.stdout, r.stdout


def test_threads_sets_torch_threads_and_rejects_zero(tiny, restore_threads):
    torch.set_num_threads(2)
    r = runner.invoke(app, ["lipschitz", str(tiny), "--threads", "1", "-q", "--json"])
    assert r.exit_code == 0, r.output
    assert torch.get_num_threads() == 1
    bad = runner.invoke(app, ["certify", str(tiny), "--threads", "0"])
    assert bad.exit_code == 2 and "--threads" in bad.output and "Traceback" not in bad.output


def test_default_keeps_torchs_thread_count_and_sets_a_passive_wait_policy(tiny, restore_threads, monkeypatch):
    """Without --threads the thread count is torch's own (results stay bit-identical to runs
    without the option); OMP_WAIT_POLICY defaults to PASSIVE, an explicit value is kept."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    torch.set_num_threads(1)
    r = runner.invoke(app, ["lipschitz", str(tiny), "-q", "--json"])
    assert r.exit_code == 0, r.output
    assert torch.get_num_threads() == 1 and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert runner.invoke(app, ["lipschitz", str(tiny), "-q", "--json", "--threads", "2"]).exit_code == 0
    assert torch.get_num_threads() == 2 and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_attack_progress_bar_moves_within_a_batch_and_shows_an_eta(tiny):
    """A real process whose stderr is a terminal: the attack bar counts PGD steps of single
    points (8 points, one batch, 120 steps x 2 restarts), so it shows intermediate counts and
    a time-remaining column while the one batch runs."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "lipcli", "certify", str(tiny), "--radii", "1",
                             "--limit", "8", "--attack", "--attack-steps", "120", "--attack-restarts", "2",
                             "--no-write", "--threads", "1"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, cwd=ROOT, env=env)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", " ", b"".join(chunks).decode("utf-8", "replace"))
    counts = {(int(a), int(b)) for a, b in re.findall(r"attack eps=1\S*\s.*?(\d+)/(\d+)", text)}
    assert counts, text[-2000:]
    total = max(b for _, b in counts)
    assert total % 240 == 0 and total > 0  # PGD steps x restarts per point
    assert any(0 < done < total for done, _ in counts), sorted(counts)  # moved within the batch
    assert re.search(r"attack eps=1.*\d:\d\d:\d\d\s+\d:\d\d:\d\d", text), text[-2000:]  # elapsed, remaining
