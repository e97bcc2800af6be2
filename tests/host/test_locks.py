"""One writer per run (lipcli.host.locks) and what a resumed or finishing run may replace.

Real processes throughout where the behaviour is about processes: a second ``lip train``
while the first holds its locks (the first is frozen with SIGSTOP so that the timing cannot
matter), a run killed with SIGKILL (its stale lock is taken over), a real SIGINT after the
last epoch, and a usage error under torchrun.  Training runs are tiny (LipConvnet-5, width 4,
32 digits).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.locks import LockedError, check_run_unlocked, output_lock_path, run_dir_lock_path, run_locks
from lipcli.host.modelfile import read_metadata
from lipcli.train import INTERRUPT_ENV, read_checkpoint

runner = CliRunner()
TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "16", "--limit-train", "32",
        "--limit-test", "16", "--device", "cpu", "-q", "--no-lipschitz-estimate"]


@pytest.fixture(autouse=True)
def _few_power_steps(tmp_path):
    """Every run here reads a settings file with 3 power steps per refresh (fast)."""
    (tmp_path / "tiny.toml").write_text("power_iter_steps = 3\n")
    TINY.extend(["--config", str(tmp_path / "tiny.toml")])
    yield
    del TINY[-2:]


def lip(args: list[str], cwd: Path, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "lipcli", *args], cwd=cwd, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out waiting for " + ", ".join(map(str, paths))
        time.sleep(0.02)


def holder(directory: Path, out: Path) -> subprocess.Popen:
    """A process that holds the run locks of ``directory``/``out`` until killed."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom lipcli.host.locks import run_locks\n"
            f"with run_locks(Path({str(directory)!r}), Path({str(out)!r})):\n"
            "    print('held', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


# --------------------------------------------------------------------------------------------
# the lock itself
# --------------------------------------------------------------------------------------------
def test_lock_names_the_holder_and_a_killed_holders_lock_is_taken_over(tmp_path):
    out = tmp_path / "m.safetensors"
    proc = holder(tmp_path, out)
    try:
        with pytest.raises(LockedError) as exc:
            check_run_unlocked(tmp_path, out)
        assert exc.value.holder == proc.pid and f"process {proc.pid}" in str(exc.value)
        with pytest.raises(LockedError):
            with run_locks(tmp_path, out):
                pass
    finally:
        proc.kill()
        proc.wait()
    assert run_dir_lock_path(tmp_path).exists()  # left behind by SIGKILL: stale
    check_run_unlocked(tmp_path, out)
    with run_locks(tmp_path, out) as held:
        assert run_dir_lock_path(tmp_path).read_text().split() == [str(os.getpid())]
        assert len(held) == 2
    assert not run_dir_lock_path(tmp_path).exists() and not output_lock_path(out).exists()


# --------------------------------------------------------------------------------------------
# two lip train runs: the second is refused, the first is untouched
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_second_run_on_the_same_output_or_run_directory_is_refused(tmp_path):
    first = lip(["train", *TINY, "--epochs", "2", "--out", "m.safetensors", "--run-dir", "ra"],
                tmp_path)
    wait_for([tmp_path / "ra" / ".lipcli.lock", tmp_path / "ra" / "checkpoint.safetensors"], first)
    os.kill(first.pid, signal.SIGSTOP)  # hold it inside its run, whatever the timing
    try:
        same_out = lip(["train", *TINY, "--epochs", "1", "--out", "m.safetensors", "--run-dir", "rb"],
                       tmp_path)
        same_dir = lip(["train", *TINY, "--epochs", "1", "--out", "other.safetensors",
                        "--run-dir", "ra", "--overwrite"], tmp_path)
        resume = lip(["train", "--resume", "ra"], tmp_path)
        results = [finish(p) for p in (same_out, same_dir, resume)]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    for code, _, err in results:
        assert code == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"(process {first.pid}:" in lines[0], err
        assert "in use by another lipcli process" in lines[0]
    code, _, err = finish(first)
    assert code == 0, err
    log = (tmp_path / "ra" / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in log] == [1, 2]  # one run's epochs only
    assert read_metadata(tmp_path / "m.safetensors")["training"]["run_dir"] == "ra"
    assert not (tmp_path / "rb").exists() and not (tmp_path / "other.safetensors").exists()
    assert not (tmp_path / "ra" / ".lipcli.lock").exists()  # released


@pytest.mark.slow
def test_the_stale_lock_of_a_killed_run_is_taken_over_by_resume(tmp_path):
    first = lip(["train", *TINY, "--epochs", "2", "--out", "m.safetensors"], tmp_path)
    run = tmp_path / "m-run"
    wait_for([run / ".lipcli.lock", run / "checkpoint.safetensors"], first)
    first.kill()
    first.wait()
    assert (run / ".lipcli.lock").exists()
    code, _, err = finish(lip(["train", "--resume", "m-run"], tmp_path))
    assert code == 0, err
    assert read_checkpoint(run / "checkpoint.safetensors")[1]["status"] == "complete"


# --------------------------------------------------------------------------------------------
# resume never replaces a file without --overwrite, nor anything that is not a model file
# --------------------------------------------------------------------------------------------
def _train(args, env=None):
    return runner.invoke(app, ["train", *args], env=env)


def test_resume_does_not_replace_a_model_written_meanwhile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _train([*TINY, "--epochs", "2", "--seed", "2", "--out", "a.safetensors"],
               env={INTERRUPT_ENV: "1:0"})
    assert r.exit_code == 130, r.output
    r = _train([*TINY, "--epochs", "1", "--seed", "9", "--out", "a.safetensors", "--run-dir", "other"])
    assert r.exit_code == 0, r.output
    seed9 = Path("a.safetensors").read_bytes()
    r = _train(["--resume", "a-run"])
    assert r.exit_code == 2, r.output
    assert "a.safetensors already exists; pass --overwrite" in r.stderr
    assert "--resume a-run --out OTHER" in r.stderr
    assert Path("a.safetensors").read_bytes() == seed9
    r = _train(["--resume", "a-run", "--out", "b.safetensors"])  # the way out
    assert r.exit_code == 0, r.output
    assert Path("a.safetensors").read_bytes() == seed9
    assert read_metadata("b.safetensors")["training"]["resumed_from_epochs"] == [1]


def _set_checkpoint_out(run: Path, out: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save

    path = run / "checkpoint.safetensors"
    with safe_open(str(path), "pt") as fh:
        meta = dict(fh.metadata())
        tensors = {k: fh.get_tensor(k).clone() for k in fh.keys()}
    ck = json.loads(meta["lipcli.checkpoint"])
    ck["out"] = out
    meta["lipcli.checkpoint"] = json.dumps(ck)
    tmp = run / "edited.tmp"
    tmp.write_bytes(save(tensors, metadata=meta))
    os.replace(tmp, path)


def test_a_checkpoint_cannot_point_the_final_write_at_a_foreign_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _train([*TINY, "--epochs", "2", "--out", "a.safetensors"], env={INTERRUPT_ENV: "1:0"})
    assert r.exit_code == 130, r.output
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    _set_checkpoint_out(tmp_path / "a-run", str(notes))
    for extra in ([], ["--overwrite"]):
        r = _train(["--resume", "a-run", *extra])
        assert r.exit_code == 2, r.output
        assert notes.read_text() == "precious\n"
    assert "is not a lipcli model file; lip train never replaces it" in r.stderr
    _set_checkpoint_out(tmp_path / "a-run", "")
    r = _train(["--resume", "a-run"])
    assert r.exit_code == 1 and "records an invalid output path" in r.stderr


def test_new_run_overwrite_replaces_only_model_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("x.safetensors").write_bytes(b"not a model")
    r = _train([*TINY, "--epochs", "1", "--out", "x.safetensors", "--overwrite"])
    assert r.exit_code == 2 and "not a lipcli model file" in r.stderr
    assert Path("x.safetensors").read_bytes() == b"not a model"


# --------------------------------------------------------------------------------------------
# the final write: a full disk keeps the run and says how to recover
# --------------------------------------------------------------------------------------------
def test_full_disk_at_the_final_write_says_how_to_recover(tmp_path, monkeypatch):
    import lipcli.host.modelfile as modelfile

    monkeypatch.chdir(tmp_path)
    real = modelfile.atomic_write_bytes

    def full(path, data):
        if Path(path).name == "m.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(modelfile, "atomic_write_bytes", full)
    r = _train([*TINY, "--epochs", "1", "--out", "m.safetensors"])
    assert r.exit_code == 1, r.output
    line = r.stderr.strip()
    assert "No space left on device" in line and "the trained run is kept in m-run" in line
    assert "lip train --resume m-run --out OTHER.safetensors" in line
    assert not Path("m.safetensors").exists()
    monkeypatch.setattr(modelfile, "atomic_write_bytes", real)
    r = _train(["--resume", "m-run", "--out", "elsewhere.safetensors"])
    assert r.exit_code == 0, r.output
    assert read_metadata("elsewhere.safetensors")["training"]["epochs"] == 1


# --------------------------------------------------------------------------------------------
# signals and torchrun
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hook", [pytest.param("end", marks=pytest.mark.slow), "end-term"],
                         ids=["sigint", "sigterm"])
def test_a_signal_after_the_last_epoch_prints_the_resume_hint(tmp_path, hook):
    """A real SIGINT (Ctrl-C) or SIGTERM (``kill``, ``timeout``, a scheduler; its default action
    left the lock files): the locks are released, the checkpoint kept with the resume line, no
    model file written."""
    code, _, err = finish(lip(["train", *TINY, "--epochs", "1", "--out", "m.safetensors"], tmp_path,
                              env={INTERRUPT_ENV: hook}))
    assert code == 130, err
    assert err.strip().splitlines() == [
        "error: interrupted after the last epoch; the checkpoint after epoch 1 is in m-run; "
        "resume with: lip train --resume m-run"
    ]
    assert not (tmp_path / "m.safetensors").exists()
    assert not (tmp_path / "m-run" / ".lipcli.lock").exists() and not output_lock_path(tmp_path / "m.safetensors").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed next to this interpreter")
def test_a_usage_error_under_torchrun_is_printed_once(tmp_path):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.Popen(
        [torchrun, "--nproc-per-node", "2", "-m", "lipcli", "train", *TINY, "--epochs", "1",
         "--batch-size", "3", "--out", "m.safetensors"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    code, out, err = finish(proc)
    assert code != 0
    ours = [line for line in (out + err).splitlines() if line.startswith("error: ")]
    assert ours == ["error: --batch-size 3 is the global batch; it must be divisible by the 2 "
                    "processes"]
    assert not (tmp_path / "m-run").exists()
