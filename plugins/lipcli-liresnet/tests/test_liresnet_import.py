"""``lip import --from liresnet``: checkpoints written by the LiResNet authors' code
(``tools/make_import_fixtures_liresnet.py``, tests/data/) import to the same function, with a
guaranteed bound above the features' true local norm; the authors' own certificate (their
power-iteration ``sub_lipschitz``, their radius rule) is reproduced for ``--compare``; bad
checkpoints are one line each and write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lipcli_liresnet.free_conv import FreeConv
from lipcli.testing import check_import_fixture, check_import_refused, load_model, run_lip
from lipcli_liresnet.importer import LiResNetImporter

DATA = Path(__file__).resolve().parent / "data"
CASES = ["liresnet_cifar10_d2_w4", "liresnet_cifar100_d3_w6"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    """Each case imported and checked (logits, provenance, bound vs Jacobian): its report."""
    out = tmp_path_factory.mktemp("imported")
    return {case: check_import_fixture(DATA / f"{case}.pth", "liresnet", out / f"{case}.safetensors")
            for case in CASES}


def _record(case: str) -> dict:
    return json.loads((DATA / f"{case}.logits.json").read_text())


def _inputs(record: dict) -> torch.Tensor:
    return torch.rand(*record["inputs"], generator=torch.Generator().manual_seed(record["input_seed"]))


@pytest.mark.parametrize("case", CASES)
def test_import_matches_the_authors_model(imported, case):
    report, record = imported[case], _record(case)
    assert report.metadata["dataset"]["name"] == {10: "cifar10", 100: "cifar100"}[record["config"]["model"]["num_classes"]]
    ignored = report.metadata["provenance"]["ignored"]
    assert any(k.startswith("optimizer.") for k in ignored)
    assert {"backbone.stem.0.init_x", "backbone.linear.eval_weight"} <= set(ignored)
    model, _mf = load_model(report.model_file)
    assert isinstance(model.body.stem_conv, FreeConv) and model.body.stem_conv.weight.shape[-1] == 5
    assert report.jacobian_norm <= report.bound


@pytest.mark.parametrize("case", CASES)
def test_the_authors_certificate_is_reproduced(imported, case):
    """Their ``sub_lipschitz()`` (500 power steps; float32 SVDs) and, per input, the radius at
    which their ``trades_loss`` rule stops certifying the predicted class."""
    record = _record(case)
    model, _mf = load_model(imported[case].model_file)
    src = LiResNetImporter().source_certificates(model, _inputs(record))
    assert src.strict and src.lipschitz == pytest.approx(record["source_lipschitz"], rel=1e-4)
    assert torch.equal(src.predictions, torch.tensor(record["logits"]).argmax(1))
    assert torch.allclose(src.radii.double(), torch.tensor(record["source_radii"], dtype=torch.float64),
                          rtol=1e-4, atol=1e-7)
    # lipcli divides by a proven bound, the authors by an estimate below it
    assert src.lipschitz <= imported[case].bound


def _variant(tmp_path: Path, change) -> Path:
    """The first case's checkpoint with ``change`` applied to its ``backbone`` state dict."""
    state = torch.load(DATA / f"{CASES[0]}.pth", weights_only=True)
    change(state["backbone"])
    torch.save(state, tmp_path / "variant.pth")
    return tmp_path / "variant.pth"


B = "backbone."


def _set(key: str, value):
    return lambda s: s.__setitem__(key, value)


@pytest.mark.parametrize("change, message, code", [
    (lambda s: s.pop("conv.gamma"), f"missing keys for importer 'liresnet': {B}conv.gamma", 1),
    (_set("neck.extra", torch.ones(2)), f"unexpected keys for importer 'liresnet': {B}neck.extra", 1),
    (_set("head.bias", torch.ones(10, 1)), f"no {B}head.bias of 1 dimensions", 1),
    (_set("linear.gamma", torch.ones(2, 16)), f"tensor '{B}linear.gamma' has shape (2, 16), expected (2, 16, 1)", 1),
    (_set("neck.kernel", torch.ones(4, 32)), f"tensor '{B}neck.kernel' has shape (4, 32), expected (4, 64)", 1),
    (lambda s: s["conv.weights"].view(-1)[3].fill_(float("nan")), f"tensor '{B}conv.weights' contains NaN", 1),
    (lambda s: s["linear.identity"].mul_(2.0), "it is not the identity the authors' layer adds", 1),
    (_set("neck.weight", torch.zeros(16, 64)), "Gram is not positive definite", 1),
    (_set("stem.0.weight", torch.ones(4, 3, 13, 13)), "cannot import a 13x13 stem", 1),
    (_set("conv.init_x", torch.ones(1, 8, 32, 32)), "cannot import 32x32 residual blocks", 1),
    (_set("stem.0.weight", torch.ones(5, 3, 5, 5)), "MinMax needs equal, even widths", 1),
], ids=["missing", "extra", "bias-dims", "gamma-shape", "kernel-shape", "nan", "identity", "singular",
        "patch-stem", "tiny-imagenet", "stem-width"])
def test_bad_checkpoints_are_one_line_and_write_nothing(tmp_path, change, message, code):
    check_import_refused(_variant(tmp_path, change), "liresnet", message, code=code)


def test_arch_is_read_from_the_shapes(tmp_path):
    out = tmp_path / "m.safetensors"
    result = run_lip(["import", str(DATA / f"{CASES[0]}.pth"), "--from", "liresnet", "--arch", "liresnet",
                      "--out", str(out)])
    assert result.exit_code == 2 and "leave --arch out" in result.stderr and not out.exists()


def test_a_bare_data_parallel_state_dict_imports_the_same(tmp_path, imported):
    """``model.state_dict()`` of the DDP-wrapped model (``module.`` keys), no trainer dictionary:
    refused until its configuration is stated (``--config`` their YAML), then the same model."""
    state = torch.load(DATA / f"{CASES[0]}.pth", weights_only=True)["backbone"]
    torch.save({f"module.{k}": v for k, v in state.items()}, tmp_path / "bare.pt")
    check_import_refused(tmp_path / "bare.pt", "liresnet", "option 'act_name'")
    cfg = _record(CASES[0])["config"]["model"]
    (tmp_path / "cifar10.yaml").write_text(
        "model:\n" + "".join(f"    {k}: {v!r}\n" if isinstance(v, str) else f"    {k}: {v}\n" for k, v in cfg.items())
        + "dataset:\n    name: 'cifar10'\n    num_classes: 10\n    input_size: 32  # CIFAR\n")
    result = run_lip(["import", str(tmp_path / "bare.pt"), "--from", "liresnet", "--out",
                      str(tmp_path / "bare.safetensors"), "--config", str(tmp_path / "cifar10.yaml")])
    assert result.exit_code == 0, result.output
    a, _ = load_model(tmp_path / "bare.safetensors")
    b, _ = load_model(imported[CASES[0]].model_file)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def _with_config(tmp_path: Path, **model) -> Path:
    """The first case's checkpoint with its saved ``configs.model`` changed (as train.py saves
    it for another configuration)."""
    state = torch.load(DATA / f"{CASES[0]}.pth", weights_only=True)
    state["configs"]["model"].update(model)
    torch.save(state, tmp_path / "variant.pth")
    return tmp_path / "variant.pth"


@pytest.mark.parametrize(("model", "message"), [
    ({"act_name": "HalfAbs"}, "option act_name='HalfAbs': lipcli maps act_name 'minmax' only"),
    ({"act_name": "ReLU"}, "option act_name='ReLU'"),
    ({"use_lln": False}, "option use_lln=False: lipcli maps use_lln True only"),
    ({"depth": 12}, "option depth=12 is stated, but the checkpoint's tensors are those of depth=2"),
])
def test_the_saved_configuration_decides_and_refuses_by_name(tmp_path, model, message):
    """The options that change no shape come from the configs train.py saves: another
    activation or a plain head is refused naming the option (it imported as MinMax/LLN)."""
    check_import_refused(_with_config(tmp_path, **model), "liresnet", message)


def test_a_stated_option_that_contradicts_the_checkpoint_is_refused(tmp_path):
    out = tmp_path / "m.safetensors"
    result = run_lip(["import", str(DATA / f"{CASES[0]}.pth"), "--from", "liresnet", "--out", str(out),
                      "--option", "act_name=ReLU"])
    assert result.exit_code == 1 and "option 'act_name'" in result.stderr and "'MinMax'" in result.stderr
    assert not out.exists()


def test_the_options_are_recorded(imported):
    prov = imported[CASES[0]].metadata["provenance"]
    assert prov["options"] == {"act_name": "MinMax", "use_lln": True}
