"""Typed driver results and the CLI around them: ``--json`` is the results' ``to_json()``,
``lip info`` reads back what ``lip certify``/``lip lipschitz --write`` stored, and library
errors name the setting while ``lip`` names its option."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lipcli.certify import CertifyOptions, RadiusRow, run_certification
from lipcli.cli import app
from lipcli.data.loaders import check_data_dir, resolve_dataset
from lipcli._util.records import to_json
from lipcli.sdk.errors import SettingError

runner = CliRunner()


def _json(args: list[str]) -> dict:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_info_card_reads_back_the_stored_certify_and_lipschitz_results(tiny_model_file: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.safetensors"
    shutil.copy(tiny_model_file, model)
    cert = _json(["certify", str(model), "--radii", "0,36", "--limit", "8", "--json", "-q"])
    assert "results" in cert["written"]
    lip = _json(["lipschitz", str(model), "--write", "--no-estimate", "--json", "-q"])
    card = _json(["info", str(model), "--json"])
    stored = card["results"]["certify"]
    assert list(stored) == ["dataset", "clean_accuracy", "total", "radii", "radius_unit",
                            "certificate", "lipschitz", "sound", "attack", "weights_sha256", "weights_match"]
    assert stored["weights_match"] is True and stored["weights_sha256"] == card["weights_sha256"]
    assert stored["total"] == cert["total"] == 8 and stored["sound"] is cert["sound"] is True
    assert stored["clean_accuracy"] == cert["clean_accuracy"]
    assert stored["radii"] == [{k: r[k] for k in ("radius_units", "radius", "certified_accuracy")}
                               for r in cert["radii"]]
    assert stored["certificate"] == cert["certificate"]["name"] and stored["attack"] is None
    assert card["lipschitz"]["upper_bound"] == lip["upper_bound"] == cert["lipschitz"]["upper_bound"]
    assert list(card["lipschitz"])[-3:] == ["empirical_lower", "how", "weights_match"]
    text = runner.invoke(app, ["info", str(model)]).stdout
    assert f"lip certify ({cert['certificate']['name']}, Lipschitz GUARANTEED upper bound, sound)" in text
    assert "8 points" in text


def test_json_is_made_from_the_typed_results(tiny_model_file: Path) -> None:
    outcome = run_certification(tiny_model_file, CertifyOptions(radii=[0.0, 0.1], limit=6, write=False))
    summary = outcome.summary
    data = summary.to_json()
    # field order is key order; the PGD columns and the front end's extras are absent
    assert list(data)[:5] == ["model", "weights_sha256", "arch", "head", "dataset"]
    assert list(data["radii"][0]) == ["radius", "radius_units", "certified_accuracy", "certified"]
    assert "per_sample" not in data and "plot" not in data and data["written"] == []
    assert data["radii"][1]["certified"] == summary.radii[1].certified == int(
        (outcome.correct & (outcome.radius >= 0.1)).sum())
    assert data["promises"]["layers"] and data["promises"]["max_ratio"] <= 1 + 1e-6
    row = RadiusRow(radius=0.1, radius_units=25.5, certified_accuracy=0.5, certified=3, attacked=4,
                    empirical_robust_accuracy=0.5, violations=0)
    assert to_json(row)["violations"] == 0 and to_json([row])[0]["attacked"] == 4


@pytest.mark.parametrize(
    ("options", "setting", "flag"),
    [({"top_k": 0}, "top_k", "--top-k must be at least 1"),
     ({"batch_size": 0}, "batch_size", "--batch-size must be in 1..65536"),
     ({"lipschitz": "guess"}, "lipschitz", "--lipschitz must be one of bound, estimate"),
     ({"device": "tpu"}, "device", "--device: unknown device 'tpu'")],
)
def test_library_errors_name_the_setting_and_lip_names_the_option(
    tiny_model_file: Path, options: dict, setting: str, flag: str
) -> None:
    with pytest.raises(SettingError) as err:
        run_certification(tiny_model_file, CertifyOptions(write=False, **options))
    assert err.value.setting == setting and "--" not in str(err.value)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    res = runner.invoke(app, ["certify", str(tiny_model_file), "--no-write", *args])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"error: {flag}")


def test_data_directory_errors_are_neutral_in_the_library(tmp_path: Path) -> None:
    cifar = resolve_dataset("cifar10")
    with pytest.raises(SettingError) as err:
        check_data_dir(cifar, None, download=False)
    assert err.value.setting == "data_dir" and "--" not in str(err.value)
    with pytest.raises(SettingError, match="does not exist"):
        check_data_dir(cifar, str(tmp_path / "missing"), download=False)
    assert check_data_dir(resolve_dataset("digits"), None, download=False) is None
