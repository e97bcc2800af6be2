"""``lip import --from bronet``: checkpoints written by the BRONet authors' ``bronet/`` code
(``tools/make_import_fixtures_bronet.py``, tests/data/) import to the same function, with a
guaranteed bound above the features' true local norm; bad checkpoints are one line each and
write nothing; the source's certificate rule is reproduced."""

from __future__ import annotations

import json

import pytest
import torch
from bro_fixture_data import DATA, check_matches, check_variant_refused, import_reports, inputs, record

from lipcli.testing import check_import_refused, load_model, run_lip
from lipcli_bro.bro import BROConv
from lipcli_bro.bronet_importer import BRONetImporter
from lipcli_liresnet.cholesky import CholeskyLinear

#: the authors' two tiny configurations (tools/make_import_fixtures_bronet.py): 5x5 stem with
#: centring and two dense layers; 3x3 stem, no centring, 2x2 neck patches, 100 classes
CASES = ["bronet_d2_w4_c10", "bronet_d1_w6_c100"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    return import_reports(CASES, "bronet", tmp_path_factory.mktemp("bronet"))


def test_import_matches_the_authors_model(imported):
    """Both cases: the authors' logits, a bound at least the features' Jacobian norm, the
    estimator state and the optimizer's listed as not imported."""
    for case, report in imported.items():
        rec = record(case)
        check_matches(report, rec, rec["model_config"]["num_classes"])
        assert report.jacobian_norm <= report.bound
        ignored = set(report.metadata["provenance"]["ignored"])
        assert {"backbone.stem.0.init_x", "backbone.conv.I_low", "backbone.conv.I_full"} <= ignored
        assert any(k.startswith("optimizer.state.") for k in ignored)


def test_imported_layers_are_the_authors_form(imported):
    model, _mf = load_model(imported[CASES[0]].model_file)
    convs = [m for m in model.modules() if isinstance(m, BROConv)]
    assert [(c.rank, c.pad, c.ridge) for c in convs] == [(2, 1, 1e-7)] * 2
    assert all("orthogonal" not in c.lip_promises for c in convs)
    assert sum(isinstance(m, CholeskyLinear) for m in model.modules()) == 3  # neck dense + 2 dense
    assert model.body.stem_conv.kernel_size == 5


def test_the_folding_of_gamma_and_running_mean_matters(tmp_path):
    """Importing ``gamma`` as 1 or the running mean as 0 changes the logits: the folded
    ``V = I + W·γ·d^-1/2`` and ``bias − running_mean`` are what match."""
    case = CASES[0]
    rec = record(case)
    x = inputs(rec)
    for key, value in (("conv.gamma", 1.0), ("conv.running_mean", 0.0)):
        ckpt = torch.load(DATA / f"{case}.pt", weights_only=True)
        ckpt["backbone"][key].fill_(value)
        torch.save(ckpt, tmp_path / "variant.pt")
        out = tmp_path / f"{key}.safetensors"
        assert run_lip(["import", str(tmp_path / "variant.pt"), "--from", "bronet", "--out", str(out)]).exit_code == 0
        model, _mf = load_model(out)
        with torch.no_grad():
            assert float((model(x) - torch.tensor(rec["logits"])).abs().max()) > 1e-4, key


@pytest.mark.parametrize("case", CASES)
def test_source_rule_is_the_authors_certificate(imported, case):
    """``source_certificates`` on the imported model gives the constant and radii of the
    authors' ``test.py`` on their own model (recorded by the fixture script)."""
    rec = record(case)
    model, _mf = load_model(imported[case].model_file)
    x = inputs(rec)
    src = BRONetImporter().source_certificates(model, x)
    assert src.lipschitz == pytest.approx(rec["source_lipschitz"], rel=1e-4)
    assert torch.allclose(src.radii, torch.tensor(rec["source_radii"]), rtol=1e-4, atol=1e-6)


def _without(prefix):
    def change(ckpt):
        for key in [k for k in ckpt["backbone"] if k.startswith(prefix)]:
            ckpt["backbone"].pop(key)
    return change


B = "backbone."


@pytest.mark.parametrize("change, message", [
    (lambda c: c["backbone"].pop("neck.bias"), f"missing keys for importer 'bronet': {B}neck.bias"),
    (lambda c: c["backbone"].__setitem__("extra.weight", torch.ones(2)),
     f"unexpected keys for importer 'bronet': {B}extra.weight"),
    (lambda c: c["backbone"].__setitem__("conv.gamma", torch.ones(2, 4, 1, 1, 2)),
     f"tensor '{B}conv.gamma' has shape (2, 4, 1, 1, 2), expected (2, 4, 1, 1, 1)"),
    (lambda c: c["backbone"]["linear.weights"].view(-1)[3].fill_(float("nan")),
     f"tensor '{B}linear.weights' contains NaN"),
    (lambda c: c["backbone"].__setitem__("conv_1.weights", torch.ones(1)), "hybrid backbone"),
    (lambda c: c["backbone"].__setitem__("linear.residual_identity", torch.ones(16, 8)), "BRO dense layers"),
    (lambda c: c["backbone"].__setitem__("neck.kernel", torch.ones(64, 4)), "BRO neck"),
    (_without("neck.kernel"), "l2 neck"),
    (lambda c: c["backbone"].__setitem__("stem.0.weight", torch.ones(4, 3, 14, 14)), "ImageNet patch stem"),
    (lambda c: c["backbone"].__setitem__("conv.weights", torch.ones(2, 4, 4, 3, 3)), "rank below the width"),
    (_without("stem."), "not a checkpoint of BRONet's bronet/ network"),
], ids=["missing", "extra", "shape", "nan", "hybrid", "bro-dense", "bro-neck", "l2-neck", "imagenet-stem",
        "lot-backbone", "not-bronet"])
def test_bad_checkpoints_are_one_line_and_write_nothing(tmp_path, change, message):
    check_variant_refused(CASES[0], "bronet", change, message, tmp_path)


def test_bare_state_dict_and_wrong_arch(tmp_path):
    """A bare ``state_dict()`` (no ``backbone.`` prefix, no optimizer, no configs) is refused
    naming the first option its tensors cannot tell, then imports to the same logits with the
    configuration stated (``--config``, JSON); ``--arch`` other than ``bronet`` is a usage
    error (exit 2), nothing written."""
    rec = record(CASES[0])
    torch.save(torch.load(DATA / f"{CASES[0]}.pt", weights_only=True)["backbone"], tmp_path / "bare.pt")
    check_import_refused(tmp_path / "bare.pt", "bronet", "option 'backbone_type' of the source's configuration is "
                                                        "not stated")
    (tmp_path / "cfg.json").write_text(json.dumps({"model": rec["model_config"]}))
    out = tmp_path / "m.safetensors"
    assert run_lip(["import", str(tmp_path / "bare.pt"), "--from", "bronet", "--out", str(out),
                    "--config", str(tmp_path / "cfg.json")]).exit_code == 0
    model, _mf = load_model(out)
    x = inputs(rec)
    with torch.no_grad():
        assert torch.allclose(model(x), torch.tensor(rec["logits"]), rtol=1e-5, atol=1e-5)
    out2 = tmp_path / "m2.safetensors"
    result = run_lip(["import", str(tmp_path / "bare.pt"), "--from", "bronet", "--arch", "liresnet", "--out", str(out2),
                      "--config", str(tmp_path / "cfg.json")])
    assert result.exit_code == 2 and "builds the arch 'bronet'" in result.stderr and not out2.exists()


#: the authors' code at options that change no tensor shape (tools/make_import_fixtures_options.py)
PLAIN = "bronet_d2_w4_c10_plain"


def test_quasi_residual_and_zero_padding_off_import_as_stated(tmp_path):
    """``backbone_quasi_residual: False`` (``V = γ·W``) and ``backbone_zero_padding: False``
    (the circular torus): the authors' logits; with either stated the other way (what was
    imported before the configuration was read) the logits differ."""
    rec = record(PLAIN)
    report = import_reports([PLAIN], "bronet", tmp_path)[PLAIN]
    check_matches(report, rec, 10)
    assert report.jacobian_norm <= report.bound
    model, mf = load_model(report.model_file)
    assert {c.border for c in model.modules() if isinstance(c, BROConv)} == {"circular"}
    assert mf.metadata["provenance"]["options"]["backbone_quasi_residual"] is False
    for key in ("backbone_quasi_residual", "backbone_zero_padding"):
        ckpt = torch.load(DATA / f"{PLAIN}.pt", weights_only=True)
        ckpt["configs"]["model"][key] = True
        torch.save(ckpt, tmp_path / "flipped.pt")
        out = tmp_path / f"{key}.safetensors"
        assert run_lip(["import", str(tmp_path / "flipped.pt"), "--from", "bronet", "--out", str(out)]).exit_code == 0
        other, _ = load_model(out)
        with torch.no_grad():
            err = float((other(inputs(rec)) - torch.tensor(rec["logits"])).abs().max())
        assert err > 1e-3, key


@pytest.mark.parametrize("block", ["lot", "cholesky", "cayley"])
def test_backbones_without_a_lipcli_layer_are_refused_by_name(tmp_path, block):
    """The authors' LOT backbone (their code, backbone_type lot) and the same layout stated as
    cholesky or cayley: refused naming the option, not read as BRO or as a shape mismatch."""
    check_variant_refused("bronet_lot_d1_w4_c10", "bronet",
                          lambda c: c["configs"]["model"].__setitem__("backbone_type", block),
                          f"cannot import option backbone_type='{block}': no lipcli layer computes", tmp_path)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("act_name", "ReLU", "option act_name='ReLU': lipcli maps act_name 'minmax' only"),
    ("use_lln", False, "option use_lln=False"),
    ("backbone_type", "soc", "backbone_type='soc'"),
    ("backbone_centering", False, "option backbone_centering=False is stated"),
])
def test_other_stated_options_are_refused_by_name(tmp_path, key, value, message):
    check_variant_refused(CASES[0], "bronet", lambda c: c["configs"]["model"].__setitem__(key, value), message,
                          tmp_path)
