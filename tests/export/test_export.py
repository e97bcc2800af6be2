"""``lip export``: round trips (LLN, CRC-Lip; LipConvnet-5 and -20 at width 4) through every
format, run in a subprocess where lipcli cannot be imported; certificates compared with
lipcli's own (exported radii <= lip certify's, equal for LLN); the lowering protocol (a
component without a lowering is named); bad input leaves nothing behind."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lipcli import create_model
from lipcli.host import plugins
from lipcli import save_model
from lipcli.sdk.lowering import DENSE_MIN_GAIN
from lipcli.cli import app
from lipcli.export import ExportCheckError, ExportOptions, export_model
from lipcli.export.formats import OnnxFormat
from lipcli.host.modelfile import update_metadata
from lipcli.host.models import load_model
from lipcli.host.plugins import get_registry
from lipcli.sdk.errors import LipUsageError
from lipcli.testing import run_exported_program

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript", "onnxruntime"))
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="needs the lipcli[onnx] extra")
# the same tiny models are lowered by every export (program and check): SOC builds reused
pytestmark = pytest.mark.usefixtures("memo_soc_build")

#: loads an exported file with lipcli (and plugins) made unimportable; writes the outputs
RUNNER_SCRIPT = r'''
import json, sys
for blocked in ("lipcli", "lipcli_polygon_pool"):
    sys.modules[blocked] = None          # any import of them now fails
import numpy as np
fmt, path, images, out = sys.argv[1:]
x = np.load(images)
if fmt == "onnx":
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    result = session.run(None, {"image": x})
    record = session.get_modelmeta().custom_metadata_map["lipcli"]
else:
    import torch
    extra = {"lipcli.json": ""}
    if fmt == "pt2":
        program = torch.export.load(path, extra_files=extra).module()
    else:
        program = torch.jit.load(path, _extra_files=extra)
    with torch.no_grad():
        result = [t.numpy() for t in program(torch.from_numpy(x))]
    record = extra["lipcli.json"]
np.savez(out, logits=result[0], radius=result[1])
loaded = sorted(m for m in sys.modules if m.startswith("lipcli") and sys.modules[m] is not None)
print(json.dumps({"record": json.loads(record), "lipcli_modules": loaded}))
'''


def make_model(path: Path, head: str, depth: int = 5, classes: int = 10, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = create_model(f"lipconvnet-{depth}", width=4, num_classes=classes,
                         head=head + (":hidden=32" if head == "mlp" else ""))
    with torch.no_grad():  # a trained-looking head: larger logits, so that radii are not all 0
        for p in model.head.parameters():
            p.mul_(4.0)
    save_model(model, path, dataset=None)
    return path


def run_isolated(tmp_path: Path, fmt: str, exported: Path, images: np.ndarray) -> tuple[dict, dict]:
    info, data = run_exported_program(tmp_path, fmt, exported, images, runner_script=RUNNER_SCRIPT)
    return info, {"logits": data["logits"], "radius": data["radius"]}


def lipcli_reference(model_path: Path, images: torch.Tensor) -> dict:
    """lipcli's logits and ``lip certify``'s input-space radii (full certificate: LLN exact,
    CRC-Lip closed form AND dual, lazy curvature), as run_certification computes them."""
    from lipcli.certify import input_radii as _input_radii
    from lipcli.lipschitz.bound import guaranteed_upper_bound

    model, _ = load_model(model_path)
    reg = get_registry()
    with torch.no_grad():
        y = model.features(images)
        logits = model.head(y)
        name = reg.get("head", model.lipcli_config["head"]["name"]).certificate
        certifier = reg.component("certificate", name).build()
        certifier.prepare(model.head, None)
        result = certifier.certify(model.head, y)
    bound = guaranteed_upper_bound(model)[0]
    return {"logits": logits.numpy(), "radius": _input_radii(result.radius, bound).numpy(),
            "predictions": result.predictions.numpy()}


CASES = [
    pytest.param("lln", 5, "pt2", id="lln-5-pt2"),
    pytest.param("mlp", 5, "torchscript", id="crc-5-torchscript"),
    # the LLN certificate through ONNX runs fast in plugins/lipcli-liresnet (test_liresnet_export),
    # ONNX's metadata record in crc-5-onnx: this case only in the slow suite
    pytest.param("lln", 5, "onnx", id="lln-5-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("mlp", 5, "onnx", id="crc-5-onnx", marks=needs_onnx),
    pytest.param("lln", 20, "torchscript", id="lln-20-torchscript", marks=pytest.mark.slow),
    pytest.param("mlp", 20, "pt2", id="crc-20-pt2", marks=pytest.mark.slow),
    pytest.param("mlp", 20, "onnx", id="crc-20-onnx", marks=[pytest.mark.slow, needs_onnx]),
    pytest.param("lln", 20, "pt2", id="lln-20-pt2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("head,depth,fmt", CASES)
def test_round_trip_matches_lipcli_without_lipcli(tmp_path, head, depth, fmt):
    classes = 4 if head == "mlp" else 10  # 4 classes: 12 exact curvature bounds, not 90
    model_path = make_model(tmp_path / "m.safetensors", head, depth, classes)
    report = export_model(model_path, ExportOptions(format=fmt, certify=True, check_inputs=8))
    out = Path(report.output)
    assert out.is_file() and out.suffix == ("." + fmt if fmt != "torchscript" else ".pt")
    assert report.check.max_rel_logit_diff <= 1e-5 and report.check.max_rel_radius_diff <= 1e-5
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.safetensors", out.name])

    images = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    info, got = run_isolated(tmp_path, fmt, out, images.numpy())
    assert info["lipcli_modules"] == []
    record = info["record"]
    assert record["certificate"]["kind"] == ("lln" if head == "lln" else "crc-lip")
    assert record["config"]["arch"]["name"] == f"lipconvnet-{depth}"
    assert record["lipschitz"]["upper_bound"] == report.lipschitz_upper_bound
    assert record["source_model"]["sha256"] == __import__("hashlib").sha256(model_path.read_bytes()).hexdigest()

    ref = lipcli_reference(model_path, images)
    scale = np.abs(ref["logits"]).max()
    assert np.abs(got["logits"] - ref["logits"]).max() <= 1e-5 * scale
    assert (got["logits"].argmax(1) == ref["predictions"]).all()
    assert got["radius"].dtype == np.float64 and (got["radius"] >= 0).all()
    rscale = max(ref["radius"].max(), 1e-12)
    # never above lip certify's radius (up to the float32 feature rounding both share)
    assert (got["radius"] <= ref["radius"] + 1e-5 * rscale).all(), (got["radius"], ref["radius"])
    if head == "lln":  # the same certificate: equal
        np.testing.assert_allclose(got["radius"], ref["radius"], rtol=0, atol=1e-5 * rscale)
    assert (ref["radius"] > 0).any()


def test_crc_closed_form_equals_lipcli_closed_form_with_the_same_bounds(tmp_path):
    """The exported CRC certificate is exactly lipcli's closed form (same float64 arithmetic)."""
    from lipcli.builtins.crc.certifier import CRCCertifier

    model, _ = load_model(make_model(tmp_path / "m.safetensors", "mlp", classes=4))
    exported = CRCCertifier().export_certificate(model.head)
    y = model.features(torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))).detach()
    pred, radius = exported.module(y)
    # equal up to the last bit or two (the batched matrix products may round differently)
    np.testing.assert_allclose(radius.numpy(), exported.reference(y).numpy(), rtol=1e-14, atol=0)
    assert exported.record["curvature_level"] == "exact per-pair"


def test_export_without_certificate_and_default_output(tmp_path):
    model_path = make_model(tmp_path / "m.safetensors", "lln")
    r = runner.invoke(app, ["export", str(model_path), "--format", "torchscript", "--check", "4", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["output"] == str(tmp_path / "m.torchscript.pt") and data["certificate"] is None
    assert data["record"]["outputs"] == ["logits"] and data["check"]["max_rel_radius_diff"] is None
    program = torch.jit.load(data["output"])
    assert program(torch.rand(3, 3, 32, 32)).shape == (3, 10)
    again = runner.invoke(app, ["export", str(model_path), "--format", "torchscript"])
    assert again.exit_code == 2 and "already exists; pass --overwrite" in again.output
    table = runner.invoke(app, ["export", str(model_path), "--format", "torchscript", "--check", "4",
                                "--overwrite"])  # the report for people, from the ExportReport
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"wrote {data['output']} (torchscript, ") and lines[1] == "outputs: logits"
    assert lines[2] == ("lowering: 4 of 6 layers as one dense matrix (block2_down, block3_down, block4_down, "
                        "block5_down; 21.2 MiB), the others as their series (cap 32 MiB per layer)")
    assert lines[3].startswith("check on ") and lines[3].endswith(", 0 different predictions")


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("args,code,text", [
    (["--format", "tflite"], 2, "unknown export format 'tflite'; valid formats: pt2, onnx, torchscript"),
    (["-o", "{tmp}"], 2, "is a directory; give a file name"),
    (["-o", "{tmp}/missing/x.pt2"], 2, "(--output): directory"),
    (["--check", "0"], 2, "--check must be in 1..100000"),
    (["--check", "100001"], 2, "--check must be in 1..100000"),
    (["--check", "100000"], 2, "--check must be at most 21845 for this model"),
    (["-o", "{tmp}/x.onnx", "--format", "pt2"], 2, "has the suffix of format 'onnx' but --format is 'pt2'"),
])
def test_bad_options_one_line_nothing_written(tmp_path, args, code, text):
    model_path = make_model(tmp_path / "m.safetensors", "lln")
    before = sorted(p.name for p in tmp_path.iterdir())
    r = runner.invoke(app, ["export", str(model_path), *[a.format(tmp=tmp_path) for a in args]])
    assert r.exit_code == code and text in _one_line(r), r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_library_errors_name_arguments_not_flags(tmp_path):
    """export_model's usage errors speak of its arguments (output, overwrite, format), the CLI
    of its options (the same messages with --output, --overwrite, --format)."""
    model_path = make_model(tmp_path / "m.safetensors", "lln")
    (tmp_path / "x.pt2").write_bytes(b"keep")
    cases = [(ExportOptions(out=str(tmp_path / "x.pt2")), "already exists; pass overwrite to replace it or "
              "choose another output"),
             (ExportOptions(out=str(tmp_path / "y.onnx"), format="pt2"),
              "output " + str(tmp_path / "y.onnx") + " has the suffix of format 'onnx' but format is 'pt2'; "
              "use a .pt2 file name or format onnx"),
             (ExportOptions(out=str(model_path), format="pt2", overwrite=True), "is the model file itself"),
             (ExportOptions(out=str(tmp_path / "no" / "z.pt2")), "(output): directory")]
    for options, text in cases:
        with pytest.raises(LipUsageError) as info:
            export_model(model_path, options)
        assert text in str(info.value) and "--" not in str(info.value)
    r = runner.invoke(app, ["export", str(model_path), "-o", str(model_path), "--overwrite"])
    assert r.exit_code == 2 and _one_line(r) == f"error: --output {model_path} is the model file itself"
    assert (tmp_path / "x.pt2").read_bytes() == b"keep"


def test_corrupt_model_and_failed_check_leave_nothing(tmp_path, monkeypatch):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    r = runner.invoke(app, ["export", str(bad)])
    assert r.exit_code == 1 and "not a valid safetensors model file" in _one_line(r)
    model_path = make_model(tmp_path / "m.safetensors", "lln")
    monkeypatch.setattr("lipcli.export.driver.TOLERANCE", 0.0)  # every float difference fails
    with pytest.raises(ExportCheckError, match="nothing was written"):
        export_model(model_path, ExportOptions(certify=True, check_inputs=4))
    r = runner.invoke(app, ["export", str(model_path), "--check", "4"])
    assert r.exit_code == 1 and "differs from lipcli" in _one_line(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors", "m.safetensors"]


def test_missing_plugin_info_works_export_names_distribution(tmp_path):
    model_path = make_model(tmp_path / "m.safetensors", "lln")
    config = json.loads(json.dumps(load_model(model_path)[1].config))
    config["pool"] = {"name": "hexagon", "params": {}, "provider": "hex", "distribution": "lipcli-hexagon"}
    update_metadata(model_path, {"config": config})
    r = runner.invoke(app, ["info", str(model_path), "--json"])
    assert r.exit_code == 0, r.output
    card = json.loads(r.stdout)
    assert card["missing"] == ["pool 'hexagon' (pip install lipcli-hexagon)"]
    assert {c["kind"]: c["installed"] for c in card["components"]}["pool"] is False
    table = runner.invoke(app, ["info", str(model_path)])
    assert table.exit_code == 0 and "pip install lipcli-hexagon" in table.stdout
    r = runner.invoke(app, ["export", str(model_path)])
    assert r.exit_code == 1 and "'lipcli-hexagon'" in _one_line(r) and "hexagon" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_component_without_lowering_is_named(tmp_path, monkeypatch):
    src = str(ROOT / "plugins" / "lipcli-polygon-pool" / "src")
    monkeypatch.syspath_prepend(src)
    module = __import__("lipcli_polygon_pool.plugin", fromlist=["plugin"])
    # the polygon pool has a lowering (its own tests export it): take it away for this test
    monkeypatch.delattr(__import__("lipcli_polygon_pool.polygon", fromlist=["polygon"]).PolygonPool,
                        "export_module")
    plugins.reset()
    try:
        if "polygon" not in get_registry().names("pool"):  # not installed as a distribution
            plugins.register_plugin(module, "polygon-in-process")
        torch.manual_seed(0)
        model = create_model("lipconvnet-5", width=4, pool="polygon")
        save_model(model, tmp_path / "p.safetensors")
        r = runner.invoke(app, ["export", str(tmp_path / "p.safetensors")])
        line = _one_line(r)
        assert r.exit_code == 1
        assert "layer 'block1_pool' (pool 'polygon' from distribution" in line
        assert "has no export_module() method" in line
    finally:
        plugins.reset()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.safetensors"]


def test_onnx_missing_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxruntime)
    with pytest.raises(Exception) as info:
        OnnxFormat().available()
    assert "onnxruntime" in str(info.value) and "pip install 'lipcli[onnx]'" in str(info.value)


def test_format_from_the_output_suffix():
    from lipcli.export.formats import format_for

    assert format_for(None, "a/model.torchscript.pt").name == "torchscript"
    assert format_for(None, "model.ONNX").name == "onnx"
    assert format_for(None, "model.bin").name == "pt2" and format_for(None, None).name == "pt2"
    assert format_for("onnx", "model.bin").name == "onnx"


def test_dense_lowering_recorded_and_cap_honoured(tmp_path):
    """Default cap: the small-image SOC layers of a tiny LipConvnet-5 become dense matrices
    (recorded in the metadata and printed); ``--dense-max-mib 0``: every layer is its series;
    both programs equal lipcli (and each other) to float32 rounding."""
    model_path = make_model(tmp_path / "m.safetensors", "lln")
    outputs = {}
    for cap in ("32", "0"):
        out = tmp_path / f"m{cap}.torchscript.pt"
        r = runner.invoke(app, ["export", str(model_path), "-o", str(out), "--check", "4",
                                "--dense-max-mib", cap, "--json"])
        assert r.exit_code == 0, r.output
        lowering = json.loads(r.stdout)["record"]["lowering"]
        assert lowering["dense_max_mib"] == float(cap)
        socs = [e["layer"] for e in lowering["layers"]]
        assert socs == ["stem_conv", "block1_down", "block2_down", "block3_down", "block4_down",
                        "block5_down"]
        dense = [e for e in lowering["layers"] if e["lowering"] == "dense"]
        assert lowering["dense_layers"] == [e["layer"] for e in dense]
        if cap == "0":
            assert dense == []
        else:  # 8x8 and smaller outputs: 2x to 32x fewer operations, matrices <= 16 MiB
            assert [e["layer"] for e in dense] == ["block2_down", "block3_down", "block4_down", "block5_down"]
            assert all(e["dense_mib"] <= 32 and DENSE_MIN_GAIN * e["dense_flops_per_image"]
                       <= e["series_flops_per_image"] for e in dense)
            series = [e for e in lowering["layers"] if e["lowering"] == "series"]
            assert all(DENSE_MIN_GAIN * e["dense_flops_per_image"] > e["series_flops_per_image"]
                       for e in series)  # 32x32 and 16x16 outputs: the series is cheaper
        outputs[cap] = torch.jit.load(str(out))(torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(2)))
    model, _ = load_model(model_path)
    with torch.no_grad():
        want = model(torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(2)))
    scale = want.abs().max()
    for got in outputs.values():
        assert (got - want).abs().max() <= 1e-5 * scale
    bad = runner.invoke(app, ["export", str(model_path), "--dense-max-mib", "-1"])
    assert bad.exit_code == 2 and "--dense-max-mib must be a finite number of MiB >= 0" in _one_line(bad)
