"""Model files: bit-exact round trips, atomic writes, and clean errors for bad files."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from lipcli.host import modelfile
from lipcli.host import plugins
from lipcli.sdk.errors import MissingPluginError, ModelFileError
from lipcli.host.models import create_model, load_model, save_model


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool="projection", head="mlp:hidden=16")
    model.eval()
    return model


@pytest.fixture()
def saved(tmp_path, tiny_model):
    path = tmp_path / "m.safetensors"
    save_model(tiny_model, path, dataset={"name": "digits", "params": {}, "num_classes": 10},
               lipschitz={"upper_bound": 4.0}, results={"clean_accuracy": 0.5})
    return path


def test_raw_round_trip_is_bit_exact(tmp_path):
    g = torch.Generator().manual_seed(1)
    tensors = {"a": torch.randn(3, 4, generator=g), "b": torch.randint(0, 9, (5,)),
               "c": torch.randn(2, dtype=torch.float64, generator=g)}
    meta = {"config": {"x": [1, 2.5, "s"]}, "results": {"acc": 0.123456789012345}}
    path = modelfile.save_model_file(tmp_path / "raw.safetensors", tensors, meta)
    mf = modelfile.read_model_file(path)
    for k, v in tensors.items():
        assert mf.tensors[k].dtype == v.dtype and torch.equal(mf.tensors[k], v)
    assert mf.metadata["config"] == meta["config"]
    assert mf.metadata["results"] == meta["results"]
    assert mf.metadata["lipschitz"] is None and mf.metadata["format_version"] == 1
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_model_round_trip_preserves_tensors_metadata_and_logits(saved, tiny_model):
    model, mf = load_model(saved)
    for k, v in tiny_model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert mf.metadata["dataset"]["name"] == "digits"
    assert mf.metadata["lipschitz"] == {"upper_bound": 4.0}
    assert mf.metadata["normalization"]["std"] == tiny_model.lipcli_config["std"]
    cfg = mf.config
    assert cfg["pool"]["name"] == "projection" and cfg["pool"]["distribution"] == "lipcli"
    assert cfg["head"]["params"] == {"hidden": 16}
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(x), tiny_model(x))


def test_update_metadata_is_atomic_and_keeps_tensors(saved):
    before = load_file(str(saved))
    modelfile.update_metadata(saved, {"results": {"clean_accuracy": 0.75}})
    after = load_file(str(saved))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert modelfile.read_metadata(saved)["results"] == {"clean_accuracy": 0.75}


def test_failed_write_leaves_old_file_intact(saved, monkeypatch):
    original = saved.read_bytes()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(ModelFileError, match="No space left"):
        modelfile.update_metadata(saved, {"results": {"x": 1}})
    assert saved.read_bytes() == original
    assert not [p for p in os.listdir(saved.parent) if p.endswith(".tmp")]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "text", "empty"])
def test_corrupt_files_give_clean_errors(saved, damage):
    data = saved.read_bytes()
    if damage == "truncate":
        saved.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        saved.write_bytes(data[:8] + b"\xff" * 64 + data[72:])
    elif damage == "text":
        saved.write_text("this is not a model\n")
    else:
        saved.write_bytes(b"")
    with pytest.raises(ModelFileError) as exc:
        load_model(saved)
    assert "\n" not in str(exc.value) and str(saved) in str(exc.value)


def test_missing_and_directory(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        load_model(tmp_path / "nope.safetensors")
    with pytest.raises(ModelFileError, match="directory"):
        load_model(tmp_path)


def test_foreign_safetensors_file(tmp_path):
    path = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(path), metadata={"format": "pt"})
    with pytest.raises(ModelFileError, match="not a lipcli model"):
        load_model(path)


def _rewrite_meta(path, **changes):
    tensors = load_file(str(path))
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        meta = dict(fh.metadata())
    meta.update(changes)
    save_file(tensors, str(path), metadata=meta)


def test_tampered_metadata(saved):
    cfg = modelfile.read_metadata(saved)["config"]
    bad = dict(cfg, num_classes=12)
    _rewrite_meta(saved, **{"lipcli.config": json.dumps(bad)})
    with pytest.raises(ModelFileError, match="shape"):
        load_model(saved)
    _rewrite_meta(saved, **{"lipcli.config": "{not json"})
    with pytest.raises(ModelFileError, match="not valid JSON"):
        load_model(saved)
    _rewrite_meta(saved, **{"lipcli.config": json.dumps(dict(cfg, std=[0.0, 1.0, 1.0]))})
    with pytest.raises(ModelFileError, match="std"):
        load_model(saved)
    _rewrite_meta(saved, **{"lipcli.format_version": "99", "lipcli.config": json.dumps(cfg)})
    with pytest.raises(ModelFileError, match="newer"):
        load_model(saved)


def test_tampered_tensors(saved):
    tensors = load_file(str(saved))
    from safetensors import safe_open

    with safe_open(str(saved), "pt") as fh:
        meta = dict(fh.metadata())
    key = next(k for k in tensors if k.endswith("weight"))
    bad = dict(tensors)
    bad[key] = torch.full_like(tensors[key], float("nan"))
    save_file(bad, str(saved), metadata=meta)
    with pytest.raises(ModelFileError, match="NaN"):
        load_model(saved)
    bad = dict(tensors)
    bad.pop(key)
    save_file(bad, str(saved), metadata=meta)
    with pytest.raises(ModelFileError, match="missing"):
        load_model(saved)


def test_missing_plugin_names_distribution(saved):
    cfg = modelfile.read_metadata(saved)["config"]
    cfg["pool"] = {"name": "polygon", "params": {"vertices": 6}, "provider": "polygon",
                   "distribution": "lipcli-polygon-pool"}
    _rewrite_meta(saved, **{"lipcli.config": json.dumps(cfg)})
    with pytest.raises(MissingPluginError) as exc:  # entry points ignored: installed or not
        load_model(saved, registry=plugins.create_host(autoload=False).registry())
    assert "pip install lipcli-polygon-pool" in str(exc.value) and "'polygon'" in str(exc.value)


def test_unwritable_destination(tmp_path, tiny_model):
    with pytest.raises(ModelFileError, match="does not exist"):
        save_model(tiny_model, tmp_path / "no" / "such" / "dir.safetensors")


def test_written_file_has_normal_permissions(saved):
    umask = os.umask(0)
    os.umask(umask)
    assert (saved.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_defective_metadata_is_a_runtime_error_naming_the_file(saved):
    """Bad values in a model file are the file's defect (exit 1), never a usage error."""
    from typer.testing import CliRunner

    from lipcli.cli import app

    cfg = modelfile.read_metadata(saved)["config"]
    bad = json.loads(json.dumps(cfg))
    bad["conv"]["params"]["zzz"] = 1
    _rewrite_meta(saved, **{"lipcli.config": json.dumps(bad)})
    with pytest.raises(ModelFileError, match=r"m\.safetensors: metadata: conv 'soc-fast' has no parameter 'zzz'"):
        load_model(saved)
    r = CliRunner().invoke(app, ["lipschitz", str(saved), "--no-estimate"])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert lines == [f"error: {saved}: metadata: conv 'soc-fast' has no parameter 'zzz' "
                     "(valid: train_terms, eval_terms, power_iters)"]

    bad = json.loads(json.dumps(cfg))
    bad["conv"]["params"]["train_terms"] = 1  # the factory rejects it: still the file's fault
    _rewrite_meta(saved, **{"lipcli.config": json.dumps(bad)})
    with pytest.raises(ModelFileError, match=r"m\.safetensors: .*train_terms"):
        load_model(saved)

    for version in ('"1"', "true", "0", "1.5"):
        _rewrite_meta(saved, **{"lipcli.config": json.dumps(cfg), "lipcli.format_version": version})
        with pytest.raises(ModelFileError, match=r"m\.safetensors: metadata: format_version must be a positive integer"):
            load_model(saved)
    r = CliRunner().invoke(app, ["lipschitz", str(saved)])
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
        f"error: {saved}: metadata: format_version must be a positive integer, got 1.5"]


def test_certify_with_an_unknown_recorded_dataset_names_the_file(saved):
    """``lip certify`` without --dataset on a file naming a data set nobody provides: the
    file's defect (exit 1), one line naming the file and the way out."""
    from typer.testing import CliRunner

    from lipcli.cli import app

    _rewrite_meta(saved, **{"lipcli.dataset": json.dumps({"name": "nope", "params": {}})})
    r = CliRunner().invoke(app, ["certify", str(saved), "--no-write"])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(saved) in lines[0] and "'nope'" in lines[0], lines
    assert "--dataset NAME" in lines[0]


def test_recorded_dataset_defects_name_the_file(saved):
    from lipcli.host.models import recorded_dataset

    assert recorded_dataset(saved, None) is None
    assert recorded_dataset(saved, {"name": "digits", "params": {}}).name == "digits"
    with pytest.raises(MissingPluginError, match=r"m\.safetensors: metadata: unknown dataset 'nope'.*--dataset NAME"):
        recorded_dataset(saved, {"name": "nope", "distribution": "lipcli"})
    with pytest.raises(MissingPluginError, match="pip install lipcli-extra-data"):
        recorded_dataset(saved, {"name": "nope", "distribution": "lipcli-extra-data"})
    with pytest.raises(ModelFileError, match=r"m\.safetensors: metadata: dataset 'digits' has no parameter 'zzz'"):
        recorded_dataset(saved, {"name": "digits", "params": {"zzz": 1}})
    with pytest.raises(ModelFileError, match="string 'name'"):
        recorded_dataset(saved, {"name": 3})


def test_save_model_metadata_slots_must_be_dicts(tmp_path, tiny_model):
    with pytest.raises(TypeError, match="dataset must be a dict"):
        save_model(tiny_model, tmp_path / "m.safetensors", dataset="digits")
    assert not (tmp_path / "m.safetensors").exists()


def test_disabled_plugin_autoload_is_named_instead_of_not_installed(saved, monkeypatch):
    """A model needing a plugin's component while installed plugins are disabled: the
    message says they are disabled, not that the distribution is missing."""
    cfg = modelfile.read_metadata(saved)["config"]
    bad = json.loads(json.dumps(cfg))
    bad["pool"] = {"name": "polygon-x", "params": {}, "distribution": "lipcli-polygon-x"}
    _rewrite_meta(saved, **{"lipcli.config": json.dumps(bad)})
    with pytest.raises(MissingPluginError, match="pip install lipcli-polygon-x"):
        load_model(saved)
    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "1")
    # not installed at all: still the install hint
    with pytest.raises(MissingPluginError, match="pip install lipcli-polygon-x"):
        load_model(saved)
    # installed but not loaded (pretend the distribution exists)
    import lipcli.host.models as models_module

    monkeypatch.setattr(models_module, "_is_installed", lambda dist: True)
    with pytest.raises(MissingPluginError, match="is installed, but installed plugins are not loaded"):
        load_model(saved)
