"""``lip train --compile`` and ``lip certify --compile`` through real subprocesses on a tiny
digits run, against the eager run: weights, logits and radii equal to float rounding, the
guaranteed bound computed from the stored weights (so identical for the same file), and the
model file's record of how the model was trained.

Compiling on a CPU takes minutes with inductor; the run here uses the ``aot_eager`` backend
(``LIPCLI_COMPILE_BACKEND``: dynamo's tracing and AOTAutograd's forward/backward graphs, the
same graph breaks and guards, without code generation), so it checks lipcli's plumbing; the
inductor figures are in docs/benchmarks.md ("torch.compile on CPU")."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lipcli.compiling import BACKEND_ENV
from lipcli.host.modelfile import read_model_file
from lipcli.host.models import load_model

TINY = ["--dataset", "digits", "--width", "4", "--batch-size", "32", "--limit-train", "64",
        "--limit-test", "32", "--epochs", "1", "--device", "cpu"]
#: float rounding of a float32 network after 2 SGD steps (measured 1.2e-7 on the weights)
WEIGHT_TOL = 1e-5
RADIUS_TOL = 1e-5


def _lip(args: list[str], cwd: Path, backend: str = "aot_eager") -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lip")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lipcli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", BACKEND_ENV: backend}
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


def _radii(path: Path) -> dict[int, float]:
    with open(path, newline="", encoding="utf-8") as fh:
        return {int(row["index"]): float(row["radius"]) for row in csv.DictReader(fh)}


@pytest.mark.slow
def test_compiled_training_and_certification_equal_eager(tmp_path):
    (tmp_path / "tiny.toml").write_text("power_iter_steps = 3\nlipschitz_estimate = false\n")
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        r = _lip(["train", *TINY, "--config", "tiny.toml", "--out", f"{name}.safetensors", "--json", *extra],
                 tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["compile"] == "default" and summary["compile_s"] > 0
    eager, compiled = read_model_file(tmp_path / "eager.safetensors"), read_model_file(tmp_path / "compiled.safetensors")
    assert max(float((eager.tensors[k].double() - compiled.tensors[k].double()).abs().max())
               for k in eager.tensors) <= WEIGHT_TOL
    record = compiled.metadata["training"]["compile"]
    assert record["setting"] is True and record["mode"] == "default"
    assert record["torch_version"] == torch.__version__ and record["compiling_steps"] >= 1
    assert compiled.metadata["training"]["config"]["compile"] is True
    assert compiled.metadata["training"]["history"][0]["compile"] == "default"
    assert eager.metadata["training"]["compile"] == {"setting": "auto", "mode": "off"}  # how it ran
    assert eager.metadata["training"]["config"]["compile"] is None  # not given: per device (CPU: eager)
    # the stored bound is the stored weights' guaranteed bound, as for every model file
    from lipcli.lipschitz.bound import guaranteed_upper_bound

    model, _ = load_model(tmp_path / "compiled.safetensors")
    assert compiled.metadata["lipschitz"]["upper_bound"] == guaranteed_upper_bound(model)[0]

    # certify the same (eager-trained) file eagerly and compiled
    out = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        r = _lip(["certify", "eager.safetensors", "--device", "cpu", "--no-write", "--json", "-q",
                  "--limit", "32", "--batch-size", "32", "--per-sample", f"{name}.csv", *extra], tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        out[name] = json.loads(r.stdout)
    e, c = out["eager"], out["compiled"]
    assert c["lipschitz"]["upper_bound"] == e["lipschitz"]["upper_bound"]  # exactly: stored weights
    assert any("torch.compile" in note for note in c["notes"])
    re, rc = _radii(tmp_path / "eager.csv"), _radii(tmp_path / "compiled.csv")
    assert re.keys() == rc.keys() and max(abs(re[i] - rc[i]) for i in re) <= RADIUS_TOL
    assert [r["certified"] for r in c["radii"]] == [r["certified"] for r in e["radii"]]


def test_compile_settings_are_checked_before_any_work(tmp_path):
    r = _lip(["train", *TINY, "--compile", "--compile-mode", "fastest"], tmp_path)
    assert r.returncode == 2 and "--compile-mode must be one of default, reduce-overhead, max-autotune" in r.stderr
    r = _lip(["train", *TINY, "--compile", "--compile-mode", "reduce-overhead", "--cuda-graphs", "on"], tmp_path)
    assert r.returncode == 2 and "replays CUDA graphs itself; drop --cuda-graphs on" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_compile_settings_round_trip_and_may_change_on_resume():
    from lipcli.sdk.errors import LipUsageError
    from lipcli.train import TrainConfig
    from lipcli.train.driver import RESUME_CHANGEABLE
    from lipcli.train.errors import TrainUsageError

    cfg = TrainConfig().updated({"compile": True, "compile-mode": "max-autotune"})
    assert (cfg.compile, cfg.compile_mode) == (True, "max-autotune")
    assert TrainConfig().updated(cfg.to_json()) == cfg  # as the model file stores it
    assert TrainConfig().updated({"compile": None}).compile is None  # older files: per device
    with pytest.raises(LipUsageError, match="'compile' must be true or false"):
        TrainConfig().updated({"compile": "yes"})
    with pytest.raises(TrainUsageError):
        TrainConfig(compile_mode="fast").validate()
    with pytest.raises(TrainUsageError):
        TrainConfig(compile=True, compile_mode="reduce-overhead", cuda_graphs="on").validate()
    TrainConfig(compile=False, compile_mode="reduce-overhead", cuda_graphs="on").validate()
    assert {"compile", "compile_mode"} <= RESUME_CHANGEABLE  # a faster path may change between segments
