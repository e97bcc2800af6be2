"""Model files are untrusted input: forged metadata asking for unbounded work or memory is
refused as ``bad model file: ...`` (exit 1) before the work, through the real CLI.

The forged files are the tiny saved model with one metadata value replaced: ``width``,
``num_classes``, SOC's ``eval_terms`` (each 10**9), a head ``hidden`` inflated so that the
config no longer matches the tensors, a 200,000-deep JSON value and 5 MB of metadata.  A
separate interpreter measures what failing on them costs: its peak memory grows by less than
100 MB, and the CPU time of the failing command stays under a second (a bound on the *work*,
which was 640 s and a 512 GB allocation before; not a speed measurement).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.modelfile import MAX_JSON_DEPTH, json_depth

from conftest import forge, save_tiny_model

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("m") / "m.safetensors", dataset={"name": "digits", "params": {}})


def _width(cfg):
    cfg["arch"]["params"]["width"] = 10**9


def _classes(cfg):
    cfg["num_classes"] = 10**9


def _terms(cfg):
    cfg["conv"]["params"]["eval_terms"] = 10**9


def _terms_65(cfg):
    cfg["conv"]["params"]["eval_terms"] = 65


def _hidden(cfg):
    cfg["head"] = {"name": "mlp", "params": {"hidden": 32768}, "provider": "lipcli.crc",
                   "distribution": "lipcli"}


CASES = {
    "width": (dict(edit=_width), "arch parameter 'width' = 1000000000 is out of range"),
    "classes": (dict(edit=_classes), "num_classes must be an integer from 2 to"),
    "terms": (dict(edit=_terms), "conv parameter 'eval_terms' = 1000000000 is out of range"),
    "terms65": (dict(edit=_terms_65), "eval_terms must be in 2..64"),
    "hidden": (dict(edit=_hidden), "far more than the file holds"),
    "deep": (dict(dataset="[" * 200_000 + "]" * 200_000), f"nested deeper than {MAX_JSON_DEPTH} levels"),
    "big": (dict(results=json.dumps("a" * 5_000_000)), "bytes of metadata (limit"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["certify", "lipschitz"])
def test_forged_metadata_is_one_bad_model_file_line(tiny, tmp_path, case, command):
    kwargs, message = CASES[case]
    path = forge(tiny, tmp_path / f"{case}.safetensors", **kwargs)
    r = runner.invoke(app, [command, str(path), "--no-write" if command == "certify" else "-q"])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0], r.stderr
    assert message in lines[0] and str(path) in lines[0]
    if case != "terms65":  # that one is the factory's own range check
        assert lines[0].startswith("error: bad model file: ")


MEASURE = r"""
import json, resource, sys, time
from lipcli.cli import app
import lipcli.host.models, lipcli.host.plugins, lipcli.lipschitz.bound
lipcli.host.plugins.get_registry()
results = {}
for path in sys.argv[1:]:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    try:
        app(["--debug", "lipschitz", path, "--no-estimate", "-q"], standalone_mode=False)
    except Exception as exc:
        results[path] = {"error": type(exc).__name__, "cpu_s": time.process_time() - t0,
                         "extra_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}
print(json.dumps(results))
"""


def test_forged_metadata_costs_little_memory_and_work(tiny, tmp_path):
    paths = [str(forge(tiny, tmp_path / f"{case}.safetensors", **CASES[case][0]))
             for case in ("width", "classes", "terms", "deep", "big", "hidden")]
    proc = subprocess.run([sys.executable, "-c", MEASURE, *paths], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert sorted(results) == sorted(paths)
    for path, got in results.items():
        assert got["error"] == "ModelFileError", (path, got)
        assert got["extra_kb"] < 100 * 1024, (path, got)
        assert got["cpu_s"] < 1.0, (path, got)  # "hidden" too: the rest is built without init work


def test_json_depth_skips_strings_and_escapes():
    assert json_depth('{"a": [1, {"b": "[[[\\"]]"}]}') == 3
    assert json_depth("1") == 0 and json_depth('"[{"') == 0 and json_depth("[]") == 1
    assert json_depth("[" * 100_000 + "]" * 100_000) == 100_000


def test_valid_files_still_load_identically(tiny):
    import torch

    from lipcli.host.models import load_model

    model, mf = load_model(tiny)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    again, _ = load_model(tiny)
    assert torch.equal(model(x), again(x))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in mf.tensors.items())
