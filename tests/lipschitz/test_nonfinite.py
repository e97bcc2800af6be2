"""A model file whose layer outputs non-finite values (zero power-iteration vectors, a zero
weight; a NaN weight is refused when the file is read) is refused by ``lip certify``, ``lip lipschitz`` and ``lip export --certify`` with one
line naming the layer at fault (issue 26 item 8: ``lip export --certify`` blamed the next
promised layer, "plugin lipcli.pooling breaks its 1-Lipschitz promise (measured inf)")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save
from typer.testing import CliRunner

from lipcli.cli import app

from conftest import save_tiny_model

runner = CliRunner()


def _edited(src: Path, dst: Path, edit) -> Path:
    with safe_open(str(src), "pt") as fh:
        meta = dict(fh.metadata())
        tensors = {k: fh.get_tensor(k).clone() for k in fh.keys()}
    edit(tensors)
    dst.write_bytes(save(tensors, metadata=meta))
    return dst


def _zero_power_vectors(t):
    for key in t:
        if key.startswith("body.block2_down.power_"):
            t[key].zero_()


def _zero_weight(t):
    t["body.block2_down.weight"].zero_()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nonfinite")
    tiny = save_tiny_model(root / "tiny.safetensors", dataset={"name": "digits", "params": {}})
    return {"zero": _edited(tiny, root / "zero.safetensors", _zero_power_vectors),
            "zero-weight": _edited(tiny, root / "zw.safetensors", _zero_weight)}


SUSPECT = {"zero": "(all-zero: power_u0, power_v0, power_u1, power_v1 and 4 more)",
           "zero-weight": "(all-zero: weight)"}
COMMANDS = {
    "certify": ["certify", "{model}", "--limit", "8", "--no-write", "-q"],
    "lipschitz": ["lipschitz", "{model}", "-q"],
    "export": ["export", "{model}", "--certify", "--output", "{out}", "-q"],
}


@pytest.mark.parametrize("case", sorted(SUSPECT))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_layer_at_fault_is_named_not_the_next_promise(models, tmp_path, case, command):
    out = tmp_path / "m.pt2"
    args = [a.format(model=models[case], out=out) for a in COMMANDS[command]]
    r = runner.invoke(app, args)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert ("conv 'soc-fast' at layer 'block2_down' (plugin lipcli.soc) outputs non-finite values "
            "for finite inputs " + SUSPECT[case]) in line, line
    assert "promise" not in line and "internal error" not in line and "pool" not in line, line
    if command == "certify":
        assert line.startswith("error: the model produced non-finite features: ")
    assert not out.exists() and r.stdout == ""


def test_export_names_the_layer_in_a_real_process(models, tmp_path):
    out = tmp_path / "m.pt2"
    r = subprocess.run([sys.executable, "-m", "lipcli", "export", str(models["zero"]), "--certify",
                        "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        "error: conv 'soc-fast' at layer 'block2_down' (plugin lipcli.soc) outputs non-finite values"), r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
