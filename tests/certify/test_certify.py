"""``lip certify`` end to end on a tiny untrained LipConvnet and the offline ``digits`` data:
certificates vs PGD, JSON / CSV / plot consistency, labelling of unsound modes, bad inputs."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.certify import CertifyOptions, parse_radii, run_certification
from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError
from lipcli.host.modelfile import read_metadata
from lipcli.certify.plot import certified_accuracy_curve

from conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
DIGITS = {"name": "digits", "params": {}, "num_classes": 10}
LIMIT = "40"


def _save_tiny(path: Path, *, num_classes: int = 10, dataset=DIGITS, head: str = "lln", seed: int = 0) -> Path:
    return save_tiny_model(path, dataset=dataset, num_classes=num_classes, head=head, seed=seed)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("cert") / "tiny.safetensors")


@pytest.fixture(scope="module")
def baseline(model_file: Path, tmp_path_factory) -> dict:
    """One plain JSON run with a per-sample CSV (no write)."""
    out = tmp_path_factory.mktemp("base")
    csv_path = out / "ps.csv"
    res = CliRunner().invoke(app, [
        "certify", str(model_file), "--radii", "0,1,2,36", "--limit", LIMIT, "--json",
        "--no-write", "--per-sample", str(csv_path), "-q",
    ])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(csv_path.open()))
    return {"summary": json.loads(res.stdout), "rows": rows}


def _one_error_line(res, code: int) -> str:
    assert res.exit_code == code, (res.exit_code, res.output)
    err = res.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in res.output
    return err


# -- parsing --------------------------------------------------------------------------------------
def test_parse_radii_units_fractions_and_errors() -> None:
    assert parse_radii("36,72,108") == pytest.approx([36 / 255, 72 / 255, 108 / 255])
    assert parse_radii("0.14, 0.5", unit=1) == [0.14, 0.5]
    assert parse_radii("36/255,0.1", unit=1) == pytest.approx([0.1, 36 / 255])
    assert parse_radii("72,36,36") == pytest.approx([36 / 255, 72 / 255])  # sorted, unique
    assert parse_radii("0") == [0.0]
    for bad in ("36,abc", "-1", "", " ", "36,,72", "1/0", "inf", "nan", "1e999", "3/", "/2", "--1"):
        with pytest.raises(LipUsageError):
            parse_radii(bad)
    with pytest.raises(LipUsageError):
        parse_radii("36", unit=0)


# -- end to end -----------------------------------------------------------------------------------
def test_json_summary_and_per_sample_csv_are_consistent(baseline: dict) -> None:
    s, rows = baseline["summary"], baseline["rows"]
    n = int(LIMIT)
    assert s["total"] == n == len(rows)
    assert s["sound"] is True and s["lipschitz"]["guaranteed"] is True
    assert s["lipschitz"]["value"] == s["lipschitz"]["upper_bound"]
    assert s["certificate"]["name"] == "lln" and s["certificate"]["exact_classes"] is True
    assert s["dataset"]["name"] == "digits" and s["dataset"]["size"] == n
    # the split's indices of the seeded, class-stratified subset (increasing, all distinct)
    index = [int(r["index"]) for r in rows]
    assert index == sorted(set(index)) and len(index) == n
    correct = [r["correct"] == "1" for r in rows]
    assert correct == [r["label"] == r["prediction"] for r in rows]
    radius = [float(r["radius"]) for r in rows]
    assert all(r >= 0 for r in radius)
    assert s["correct"] == sum(correct)
    assert s["clean_accuracy"] == pytest.approx(sum(correct) / n)
    for row in s["radii"]:
        eps = row["radius"]
        count = sum(c and r >= eps for c, r in zip(correct, radius))
        assert row["certified"] == count
        assert row["certified_accuracy"] == pytest.approx(count / n)
    assert s["radii"][0]["radius"] == 0.0 and s["radii"][0]["certified_accuracy"] == s["clean_accuracy"]
    assert [r["radius_units"] for r in s["radii"]] == pytest.approx([0, 1, 2, 36])
    mean_all = sum(r for c, r in zip(correct, radius) if c) / n
    assert s["mean_certified_radius"]["all"] == pytest.approx(mean_all, rel=1e-9, abs=1e-15)
    for key in ("features", "certificate", "lipschitz", "total"):
        assert s["time_s"][key] >= 0
    assert s["written"] == []


def test_attack_finds_no_violation_on_certified_points(model_file: Path, baseline: dict) -> None:
    radius = sorted(float(r["radius"]) for r in baseline["rows"])
    positive = [r for r in radius if r > 0]
    assert positive, "the tiny model certifies nothing; the test would be vacuous"
    # radii at which about half / a quarter of the predictions are certified
    eps = [positive[len(positive) // 2], positive[(3 * len(positive)) // 4]]
    radii = ",".join(f"{e!r}/1" for e in eps)
    res = CliRunner().invoke(app, [
        "certify", str(model_file), "--radii", radii, "--limit", LIMIT, "--attack",
        "--attack-steps", "15", "--attack-restarts", "1", "--json", "--no-write", "-q",
    ])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["violations"] == 0 and s["attack"]["violations"] == 0
    for row in s["radii"]:
        assert row["violations"] == 0
        assert row["attacked"] >= sum(1 for r in radius if r >= row["radius"]) > 0
        # certified accuracy <= empirical robust accuracy <= clean accuracy
        assert row["certified_accuracy"] <= row["empirical_robust_accuracy"] <= s["clean_accuracy"]


def test_wrong_lipschitz_bound_is_caught_as_a_soundness_violation(model_file: Path, monkeypatch) -> None:
    """Negative control: with Lip(g) under-stated 1000x the certificates over-claim, PGD must
    break some of them, and the command must fail loudly with exit 1 and write nothing."""
    import lipcli.lipschitz.bound as lipschitz_mod

    real = lipschitz_mod.guaranteed_upper_bound

    def too_small(model):
        bound, rows = real(model)
        return bound / 1000.0, rows

    # where certify uses it (first: importing lipcli.certify.steps here must bind the real one),
    # then inside lipschitz_report
    monkeypatch.setattr("lipcli.certify.steps.guaranteed_upper_bound", too_small)
    monkeypatch.setattr(lipschitz_mod, "guaranteed_upper_bound", too_small)
    before = _sha(model_file)
    res = CliRunner().invoke(app, [
        "certify", str(model_file), "--radii", "10", "--limit", "12", "--attack",
        "--attack-steps", "10", "--attack-restarts", "1", "-q",
    ])
    err = _one_error_line(res, 1)
    assert "SOUNDNESS VIOLATION" in err and "WRONG" in err
    assert _sha(model_file) == before


def test_progress_covers_every_stage(model_file: Path) -> None:
    stages: dict[str, tuple[int, int]] = {}
    run_certification(
        model_file,
        CertifyOptions(radii=[0.1], limit=5, batch_size=2, write=False, lipschitz="estimate",
                       lipschitz_iters=2, attack=True, attack_steps=2, attack_restarts=1),
        progress=lambda stage, done, total: stages.__setitem__(stage, (done, total)),
    )
    assert stages["features"] == (5, 5) and stages["certificate"] == (5, 5)
    done, total = stages["power-method estimate (layers)"]
    assert done == total > 0
    attack = [k for k in stages if k.startswith("attack eps=")]
    assert len(attack) == 1 and stages[attack[0]][0] == stages[attack[0]][1]


def test_estimate_and_top_k_are_labelled(model_file: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["certify", str(model_file), "--radii", "36", "--limit", "8",
                              "--lipschitz", "estimate", "--lipschitz-iters", "5", "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    assert "ESTIMATE (paper convention, not guaranteed)" in res.stdout
    assert "NOT guaranteed" in res.stdout
    res = runner.invoke(app, ["certify", str(model_file), "--radii", "36", "--limit", "8",
                              "--lipschitz", "estimate", "--lipschitz-iters", "5", "--top-k", "2",
                              "--json", "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["lipschitz"]["label"] == "ESTIMATE (paper convention, not guaranteed)"
    assert s["lipschitz"]["guaranteed"] is False and s["sound"] is False
    assert s["lipschitz"]["estimate"] <= s["lipschitz"]["upper_bound"]
    assert s["certificate"]["exact_classes"] is False
    assert "HEURISTIC" in s["certificate"]["classes"]
    res = runner.invoke(app, ["certify", str(model_file), "--radii", "36", "--limit", "8",
                              "--top-k", "2", "--no-write", "-q"])
    assert res.exit_code == 0 and "HEURISTIC" in res.stdout


def test_results_and_cache_written_atomically_unless_no_write(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "w.safetensors")
    before = _sha(path)
    runner = CliRunner()
    res = runner.invoke(app, ["certify", str(path), "--radii", "36", "--limit", "8", "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    assert _sha(path) == before
    res = runner.invoke(app, ["certify", str(path), "--radii", "36", "--limit", "8", "-q"])
    assert res.exit_code == 0, res.output
    meta = read_metadata(path)
    stored = meta["results"]["certify"]
    assert stored["radii"][0]["radius_units"] == pytest.approx(36)
    assert stored["total"] == 8
    assert meta["cache"]["lln"]["method"] == "lln"
    assert "stored in" in res.stdout
    assert list(tmp_path.iterdir()) == [path]  # no temporary files left behind
    # a second run reuses the stored (fingerprinted) cache: only the results slot is rewritten
    res = runner.invoke(app, ["certify", str(path), "--radii", "72", "--limit", "8", "--json", "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["written"] == ["results"]
    assert read_metadata(path)["cache"] == meta["cache"]
    assert read_metadata(path)["results"]["certify"]["radii"][0]["radius_units"] == pytest.approx(72)


def test_plot_and_curve(model_file: Path, tmp_path: Path, baseline: dict) -> None:
    png = tmp_path / "curve.png"
    res = CliRunner().invoke(app, ["certify", str(model_file), "--radii", "0,1,2", "--limit", "8",
                                   "--plot", str(png), "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the exact step curve agrees with direct counting
    radius = torch.tensor([0.5, 0.0, 0.2, 0.2, 0.9], dtype=torch.float64)
    correct = torch.tensor([True, True, True, True, False])
    xs, ys = certified_accuracy_curve(radius, correct)
    assert (xs[0], ys[0]) == (0.0, 4 / 5)
    for x, y in zip(xs, ys):
        left = float((correct & (radius >= x)).sum()) / 5
        right = float((correct & (radius > x)).sum()) / 5
        assert y in (left, right)
    assert ys[-1] == 0.0


def test_plot_without_matplotlib_names_the_extra(model_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    res = CliRunner().invoke(app, ["certify", str(model_file), "--plot", str(tmp_path / "p.png"),
                                   "--limit", "4", "--no-write"])
    err = _one_error_line(res, 1)
    assert "pip install 'lipcli[plot]'" in err


def test_mlp_head_runs_crc_lip(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "mlp.safetensors", head="mlp:hidden=16")
    res = CliRunner().invoke(app, ["certify", str(path), "--radii", "0,36", "--limit", "8", "--json",
                                   "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["certificate"]["name"] == "crc-lip" and s["head"] == "mlp"
    assert s["radii"][0]["certified_accuracy"] == s["clean_accuracy"]


# -- bad inputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("radii", ["36,abc", "-1", "", "36,,72", "1/0", "nan"])
def test_bad_radii(model_file: Path, radii: str) -> None:
    res = CliRunner().invoke(app, ["certify", str(model_file), "--radii", radii, "--no-write"])
    assert "radi" in _one_error_line(res, 2)


def test_bad_inputs_give_one_line_and_exit_code(model_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    m = str(model_file)
    cases = [
        ([str(tmp_path / "missing.safetensors")], 2, "not found"),
        ([m, "--dataset", "nope"], 2, "unknown dataset 'nope'"),
        ([m, "--dataset", "cifar10", "--no-download", "-q"], 2, "no-data-root does not exist"),
        ([m, "--dataset", "cifar10", "--data-dir", str(tmp_path / "nodir")], 2, "--data-dir: data directory"),
        ([m, "--dataset", "cifar10", "--data-dir", str(tmp_path)], 2, "cifar"),
        ([m, "--split", "validation"], 2, "validation"),
        ([m, "--lipschitz", "guess"], 2, "--lipschitz"),
        ([m, "--top-k", "0"], 2, "--top-k"),
        ([m, "--limit", "0"], 2, "--limit"),
        ([m, "--batch-size", "0"], 2, "--batch-size"),
        ([m, "--radius-unit", "-3"], 2, "--radius-unit"),
        ([m, "--per-sample", str(tmp_path / "no" / "x.csv")], 2, "does not exist"),
    ]
    if not torch.cuda.is_available():
        cases.append(([m, "--device", "cuda"], 2, "CUDA"))
    for args, code, text in cases:
        res = runner.invoke(app, ["certify", *args, "--no-write"])
        err = _one_error_line(res, code)
        assert text in err, (args, err)

    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(model_file.read_bytes()[:200])
    assert "corrupt" in _one_error_line(runner.invoke(app, ["certify", str(corrupt)]), 1)

    mismatch = _save_tiny(tmp_path / "five.safetensors", num_classes=5)
    err = _one_error_line(runner.invoke(app, ["certify", str(mismatch), "--no-write"]), 2)
    assert "10 classes" in err and "5" in err

    no_meta = _save_tiny(tmp_path / "nometa.safetensors", dataset=None)
    err = _one_error_line(runner.invoke(app, ["certify", str(no_meta), "--no-write"]), 2)
    assert "--dataset" in err


def test_real_subprocess_error(model_file: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)

    out = run("certify", str(model_file), "--radii", "36,abc")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "'abc'" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_driver_api_returns_arrays(model_file: Path) -> None:
    outcome = run_certification(model_file, CertifyOptions(radii=[0.0], limit=6, write=False))
    assert outcome.radius.dtype == torch.float64 and outcome.radius.shape == (6,)
    assert outcome.summary.radii[0].certified == int(outcome.correct.sum())


# -- other data sets and a model trained by `lip train` ------------------------------------------
def test_cifar10_layout_and_imagefolder_mismatch(tmp_path: Path, cifar10_root: Path, imagefolder_root: Path) -> None:
    path = _save_tiny(tmp_path / "c10.safetensors", dataset=None)
    runner = CliRunner()
    res = runner.invoke(app, ["certify", str(path), "--dataset", "cifar10", "--data-dir", str(cifar10_root),
                              "--radii", "0,36", "--json", "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["dataset"]["name"] == "cifar10" and s["total"] == 12  # conftest: 12 test images
    # a 3-class image folder cannot be evaluated by a 10-class model
    err = _one_error_line(runner.invoke(app, ["certify", str(path), "--dataset", "imagefolder",
                                              "--data-dir", str(imagefolder_root), "--no-write"]), 2)
    assert "3 classes" in err and "10" in err
    three = _save_tiny(tmp_path / "three.safetensors", num_classes=3, dataset=None)
    res = runner.invoke(app, ["certify", str(three), "--dataset", "imagefolder", "--data-dir",
                              str(imagefolder_root), "--radii", "36", "--json", "--no-write", "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["dataset"]["num_classes"] == 3


def test_model_trained_by_lip_train_certifies_from_its_metadata(tiny_model_file: Path, tmp_path: Path) -> None:
    import shutil

    path = tmp_path / "trained.safetensors"
    shutil.copy(tiny_model_file, path)
    training_results = read_metadata(path)["results"] or {}
    res = CliRunner().invoke(app, ["certify", str(path), "--radii", "0,4,36", "--limit", "16",
                                   "--attack", "--attack-steps", "10", "--attack-restarts", "1",
                                   "--json", "-q"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["dataset"]["name"] == "digits" and s["violations"] == 0
    stored = read_metadata(path)["results"]
    assert stored["certify"]["total"] == 16
    for key, value in training_results.items():  # what `lip train` stored is kept
        assert stored[key] == value


def test_certification_runs_without_tf32():
    """TF32 (cuDNN's default for float32 convolutions on GPUs) would change the margins
    being certified; certification turns it off and restores the setting afterwards."""
    import lipcli.certify as certify_module
    from lipcli.numerics import precision
    from lipcli.lipschitz.report import lipschitz_report

    seen = []

    @precision.in_full_float32_precision
    def probe():
        seen.append(precision.tf32_state())

    before = precision.tf32_state()
    allowing = ("tf32", "tf32") if precision._new_api() else (True, True)
    precision._set_tf32_state(*allowing)
    try:
        probe()
        assert seen == [precision.FULL_PRECISION[precision._new_api()]]
        assert precision.tf32_state() == allowing
        with pytest.raises(RuntimeError), precision.full_float32_precision():
            raise RuntimeError("restored on errors too")
        assert precision.tf32_state() == allowing
    finally:
        precision._set_tf32_state(*before)
    # the drivers really run inside it: record the setting from within each of them
    class Seen(Exception):
        pass

    def record(*_args, **_kwargs):
        seen.append(precision.tf32_state())
        raise Seen

    seen.clear()
    precision._set_tf32_state(*allowing)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(certify_module.driver, "resolve_device", record)
            with pytest.raises(Seen):
                certify_module.run_certification("unused.safetensors", certify_module.CertifyOptions(radii=[0.1]))
            import lipcli.lipschitz.report as lipschitz_module

            mp.setattr(lipschitz_module, "layer_input_shapes", record)
            with pytest.raises(Seen):
                lipschitz_report(torch.nn.Identity(), estimate=False)
    finally:
        precision._set_tf32_state(*before)
    assert seen == [precision.FULL_PRECISION[precision._new_api()]] * 2


def test_machine_json_is_strict_even_with_infinite_radii(capsys):
    """An infinite certified radius (e.g. all other classes share the predicted class's
    weights) must not produce ``Infinity`` (invalid JSON) on stdout."""
    from lipcli.cli.common import print_json
    from lipcli._util.strictjson import strict_json

    print_json({"radius": float("inf"), "rows": [1.0, float("-inf"), float("nan")], "n": 3})
    text = capsys.readouterr().out

    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    data = json.loads(text, parse_constant=reject)
    assert data == {"radius": "inf", "rows": [1.0, "-inf", "nan"], "n": 3}
    assert float(data["radius"]) == float("inf")
    assert strict_json((0.5, {"a": 2})) == [0.5, {"a": 2}]


def test_attack_runs_lowered_but_the_radii_stay_those_of_the_feature_pass(model_file: Path) -> None:
    """The DEFAULT path: 40 inputs do not pay for any build of the eval lowering, so every
    layer runs literally, with or without the attack; the attack's passes (40 inputs x 60)
    pay off, so the attack's own network runs the small-image layers as dense matrices, and
    PGD through it breaks no certificate.  The radii do not depend on the attack."""
    common = dict(radii=parse_radii("36,72"), limit=40, write=False)
    attacked = run_certification(model_file, CertifyOptions(attack=True, attack_steps=20,
                                                            attack_restarts=1, **common))
    series = run_certification(model_file, CertifyOptions(series=True, **common))
    plain = run_certification(model_file, CertifyOptions(**common))
    assert any(note.startswith("PGD check:") for note in attacked.summary.notes)
    for run in (attacked, series, plain):
        assert not any("eval lowering" in note for note in run.summary.notes)
        assert run.summary.lipschitz.dense_layers == [] == run.summary.to_json()["lipschitz"]["dense_layers"]
        assert run.summary.lipschitz.value == series.summary.lipschitz.value
        assert torch.equal(run.radius, series.radius) and torch.equal(run.predictions, series.predictions)
    assert attacked.violations == [] and attacked.summary.attack.violations == 0
