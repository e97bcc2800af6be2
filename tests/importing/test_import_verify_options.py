"""``lip import --verify`` (the imported logits against the source's on the user's inputs,
before anything is written) and the source's stated configuration (``--config``/``--option``,
:mod:`lipcli.sdk.source_options`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.importers import ImportRefused
from lipcli.sdk.source_options import SourceOptions, parse_config_file, parse_option
from lipcli.testing import load_model, run_lip

DATA = Path(__file__).resolve().parent.parent / "data" / "import"
CASE = "improved_l2_lln_d10_w2"


def _verify_file(tmp_path: Path, scale: float = 1.0, shift: float = 0.0) -> Path:
    record = json.loads((DATA / f"{CASE}.logits.json").read_text())
    x = torch.rand(*record["inputs"], generator=torch.Generator().manual_seed(record["input_seed"]))
    logits = np.array(record["logits"], dtype=np.float64) * scale + shift
    np.savez(tmp_path / "theirs.npz", inputs=x.numpy(), logits=logits)
    return tmp_path / "theirs.npz"


def _import(tmp_path: Path, *extra: str):
    out = tmp_path / "m.safetensors"
    return run_lip(["import", str(DATA / f"{CASE}.pt"), "--from", "improved-l2", "--out", str(out), *extra]), out


def test_verify_passes_on_the_sources_logits_and_is_recorded(tmp_path):
    result, out = _import(tmp_path, "--verify", str(_verify_file(tmp_path)))
    assert result.exit_code == 0, result.output
    assert "verified against" in result.stdout
    _model, mf = load_model(out)
    verified = mf.metadata["provenance"]["verified"]
    assert verified["points"] == 4 and verified["max_abs_error"] <= 1e-4 * verified["scale"]


@pytest.mark.parametrize(("scale", "shift"), [(1.01, 0.0), (1.0, 0.5)])
def test_verify_refuses_other_logits_and_writes_nothing(tmp_path, scale, shift):
    result, out = _import(tmp_path, "--verify", str(_verify_file(tmp_path, scale, shift)))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "beyond the tolerance 0.0001" in lines[0], result.output
    assert "model file not written" in lines[0] and not out.exists()


def test_verify_tolerance_and_bad_files(tmp_path):
    result, out = _import(tmp_path, "--verify", str(_verify_file(tmp_path, 1.01)), "--verify-tolerance", "0.5")
    assert result.exit_code == 0 and out.exists(), result.output
    np.savez(tmp_path / "bad.npz", inputs=np.zeros((2, 3, 16, 16), np.float32), logits=np.zeros((2, 10)))
    result, out2 = _import(tmp_path, "--verify", str(tmp_path / "bad.npz"), "--overwrite")
    assert result.exit_code == 2 and "inputs of shape (3, 16, 16)" in result.stderr
    np.savez(tmp_path / "none.npz", x=np.zeros(3))
    result, _ = _import(tmp_path, "--verify", str(tmp_path / "none.npz"), "--overwrite")
    assert result.exit_code == 2 and "no array 'inputs'" in result.stderr


def test_yaml_subset_and_json_configs(tmp_path):
    (tmp_path / "c.yaml").write_text("model:\n  depth: 12  # blocks\n  act_name: \"MinMax\"\n  use_lln: True\n"
                                     "training:\n  lr: 1.0e-3\n")
    cfg = parse_config_file(tmp_path / "c.yaml")
    assert cfg == {"model": {"depth": 12, "act_name": "MinMax", "use_lln": True}, "training": {"lr": 1e-3}}
    (tmp_path / "c.json").write_text(json.dumps({"conv_layer": "soc", "lln": False}))
    assert parse_config_file(tmp_path / "c.json") == {"conv_layer": "soc", "lln": False}
    (tmp_path / "l.yaml").write_text("radii:\n  - 1\n")
    with pytest.raises(LipUsageError, match="line 2"):
        parse_config_file(tmp_path / "l.yaml")
    assert parse_option("--conv-layer=soc") == ("conv_layer", "soc")
    with pytest.raises(LipUsageError):
        parse_option("novalue")


def test_options_are_stated_or_refused_by_name():
    opts = SourceOptions()
    opts.add("--config c.yaml", {"model": {"act_name": "MinMax"}, "loss": {"eps": 1}, "gloro": {"eps": 2}})
    assert opts.require("act_name") == "MinMax"
    with pytest.raises(ImportRefused, match="'use_lln' of the source's configuration is not stated"):
        opts.require("use_lln")
    assert opts.require("use_lln", told=True) is True
    with pytest.raises(ImportRefused, match="stated twice"):
        opts.require("eps")
    opts.add("--option", {"act_name": "ReLU"})
    with pytest.raises(ImportRefused, match="--config c.yaml states 'MinMax', --option states 'ReLU'"):
        opts.require("act_name")
    with pytest.raises(ImportRefused, match="cannot import option k=3: lipcli maps k 1, 2 only"):
        SourceOptions(stated={"x": {"k": 3}}).choose("k", {1: "a", 2: "b"})
