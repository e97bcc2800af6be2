"""The Python API is the CLI's twin: the same settings (a recipe included) give the same typed
results the commands print (``--json``), computed by the same code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lipcli
from lipcli.sdk.errors import LipUsageError

SETTINGS = {"dataset": "digits", "epochs": 1, "width": 4, "limit_train": 96, "limit_test": 48, "batch_size": 32}


def _lip(*args: str, cwd) -> dict:
    res = subprocess.run([sys.executable, "-m", "lipcli", *args, "--json", "-q"], capture_output=True, text=True,
                         timeout=600, cwd=cwd)  # the same threads as this process: same rounding
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _flags(settings: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The same run through ``lipcli.train`` and through ``lip train`` (recipe lipconvnet)."""
    import torch

    tmp = tmp_path_factory.mktemp("api")
    threads = torch.get_num_threads()  # one thread on both sides: the same float rounding
    torch.set_num_threads(1)
    try:
        api = lipcli.train(recipe="lipconvnet", out=tmp / "api.safetensors", **SETTINGS)
    finally:
        torch.set_num_threads(threads)
    cli = _lip("train", "--recipe", "lipconvnet", *_flags(SETTINGS), "--threads", "1",
               "--out", str(tmp / "cli.safetensors"), cwd=tmp)
    return tmp, api, cli


def test_train_is_the_twin_of_lip_train(twins):
    _tmp, api, cli = twins
    assert type(api).__name__ == "TrainSummary"
    ours = api.to_json()
    for key in ("epochs", "test_accuracy", "lipschitz_upper_bound", "lipschitz_estimate", "dataset"):
        assert ours[key] == cli[key], key


def test_certify_and_lipschitz_are_the_twins_of_their_commands(twins):
    tmp, _api, _cli = twins
    model = tmp / "api.safetensors"
    summary = lipcli.certify(model, radii="36,72", limit=32, write=False)
    cli = _lip("certify", str(model), "--radii", "36,72", "--limit", "32", "--no-write", cwd=tmp)
    assert [r.certified for r in summary.radii] == [r["certified"] for r in cli["radii"]]
    assert summary.lipschitz.value == cli["lipschitz"]["value"]
    report = lipcli.lipschitz(model, no_estimate=True)
    assert report.to_json()["upper_bound"] == _lip("lipschitz", str(model), "--no-estimate", cwd=tmp)["upper_bound"]


def test_a_bad_setting_is_the_same_one_line_error(tmp_path):
    with pytest.raises(LipUsageError, match=r"^epochs must be in 1\.\.100000, got 0$"):
        lipcli.train(dataset="digits", epochs=0, out=tmp_path / "m.safetensors")
    with pytest.raises(LipUsageError, match="unknown setting 'epoch'"):
        lipcli.train(dataset="digits", epoch=3, out=tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


def test_the_guides_notebook_session_runs_as_written(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text(encoding="utf-8")
    section = text.split("## Python API: a notebook session", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "guide.md", "exec"), {})
    assert (tmp_path / "runs" / "nb" / "model.safetensors").is_file()
