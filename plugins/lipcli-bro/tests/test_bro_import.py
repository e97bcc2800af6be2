"""``lip import --from bronet-lipconvnet``: checkpoints written by the BRONet authors'
``lipconvnet/`` code (``tools/make_import_fixtures.py bronet-lipconvnet``, tests/data/) import
to the same function, with a guaranteed bound above the features' true local norm; bad
checkpoints are one line each and write nothing; the source's certificate rule is reproduced."""

from __future__ import annotations

import pytest
import torch
from bro_fixture_data import DATA, check_matches, check_variant_refused, import_reports, inputs, record

from lipcli.testing import load_model, run_lip
from lipcli_bro.bro import BROConv
from lipcli_bro.importer import BRONetLipConvNetImporter

#: two BRO LipConvNets (identity and Kaiming starts), their SOC LipConvNet and two LOT ones
#: (``--lln``; their LOT last layer, 100 classes: test_bro_import_lot.py)
CASES = ["bronet_lipconvnet_b2_w2_c10", "bronet_lipconvnet_b1_w2_c100", "bronet_lipconvnet_soc_b2_w2_c10",
         "bronet_lipconvnet_lot_b2_w2_c10", "bronet_lipconvnet_lot_b1_w2_c100"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    return import_reports(CASES, "bronet-lipconvnet", tmp_path_factory.mktemp("bronet"))


@pytest.mark.parametrize("case", CASES)
def test_import_matches_the_authors_model(imported, case):
    report, rec = imported[case], record(case)
    check_matches(report, rec, rec["lipconvnet_args"]["num_classes"])
    # 1/0.2507 for the normalisation, a little above 1 for every BRO, SOC or LOT layer (ridge, eps, rounding)
    assert report.jacobian_norm <= report.bound < (1 / 0.2507) * 1.01


def test_the_filter_orientation_matters(tmp_path):
    """The Kaiming-initialised case has taps off the centre: importing its filters unflipped
    (the authors' rfft2 is a convolution) gives other logits, so the flip is what matches."""
    case = CASES[1]
    state = torch.load(DATA / f"{case}.pt", weights_only=True)
    rec = record(case)
    for key in [k for k in state if k.endswith("conv.weight") and state[k].shape[-1] == 3]:
        state[key] = state[key].flip(-1, -2)
    torch.save(state, tmp_path / "unflipped.pt")
    code = run_lip(["import", str(tmp_path / "unflipped.pt"), "--from", "bronet-lipconvnet",
                    "--out", str(tmp_path / "m.safetensors")]).exit_code
    assert code == 0
    model, _mf = load_model(tmp_path / "m.safetensors")
    x = inputs(rec)
    with torch.no_grad():
        got = model(x)
    assert float((got - torch.tensor(rec["logits"])).abs().max()) > 1e-2


def test_imported_layers_are_the_authors_bro_form(imported):
    model, mf = load_model(imported[CASES[0]].model_file)
    convs = [m for m in model.modules() if isinstance(m, BROConv)]
    assert len(convs) == 10 and all(c.pad == c.kernel_size // 2 and c.ridge == 1e-5 for c in convs)
    assert all("orthogonal" not in c.lip_promises for c in convs)
    # square layers: the authors' mask_mapping(c, 0.5); channel-changing ones: min(in*s^2, out)
    assert [c.rank for c in convs] == [2, 4, 2, 8, 4, 16, 8, 32, 16, 64]
    assert mf.metadata["provenance"]["ignored"] == []


P = "layer2.1.conv."


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop(P + "bias"), f"missing keys for importer 'bronet-lipconvnet': {P}bias"),
    (lambda s: s.__setitem__("layer9.extra", torch.ones(2)),
     "unexpected keys for importer 'bronet-lipconvnet': layer9.extra"),
    (lambda s: s.__setitem__(P + "weight", torch.ones(16, 7, 3, 3)),
     f"tensor '{P}weight' has shape (16, 7, 3, 3), expected (16, 8, 3, 3)"),
    (lambda s: s["last_layer.weight"].view(-1)[0].fill_(float("nan")), "tensor 'last_layer.weight' contains NaN"),
    (lambda s: s.__setitem__("layer1.0.activation.theta", torch.ones(1, 1, 1, 1)), "HouseHolder activations"),
    (lambda s: s.__setitem__("layer1.0.conv.alpha", torch.ones(1)), "the authors' Cayley LipConvNet"),
    (lambda s: s.__setitem__("layer2.1.conv.weight", torch.ones(8, 16, 3, 3)),  # one LOT-shaped filter: read as
     "has shape (3, 2, 3, 3), expected (2, 3, 3, 3) for BRONet LipConvNet-10 (width 2), LOT"),  # LOT, BRO ones refused
    (lambda s: s.__setitem__("dense_layers.0.weight", torch.ones(1)), "dense layers (--num-dense > 0)"),
    (lambda s: s.__setitem__("last_layer.weight", torch.ones(10, 48)), "last_layer.weight has 48 features"),
], ids=["missing", "extra", "shape", "nan", "householder", "cayley", "lot", "dense", "features"])
def test_bad_checkpoints_are_one_line_and_write_nothing(tmp_path, change, message):
    check_variant_refused(CASES[0], "bronet-lipconvnet", change, message, tmp_path)


def test_arch_must_agree_with_the_checkpoint(tmp_path):
    out = tmp_path / "m.safetensors"
    ckpt = str(DATA / f"{CASES[0]}.pt")
    result = run_lip(["import", ckpt, "--from", "bronet-lipconvnet", "--arch", "bronet-lipconvnet-5",
                      "--out", str(out)])
    assert result.exit_code == 1 and "the checkpoint has 2" in result.stderr and not out.exists()
    result = run_lip(["import", ckpt, "--from", "bronet-lipconvnet", "--arch", "lipconvnet-10", "--out", str(out)])
    assert result.exit_code == 2 and "bronet-lipconvnet-N" in result.stderr and not out.exists()


@pytest.mark.parametrize("case", CASES)
def test_source_rule_is_the_authors_certificate(imported, case):
    """``source_certificates`` on the imported model gives the radii the authors'
    ``lln_certificates`` gave on their own model (recorded by the fixture script)."""
    rec = record(case)
    model, _mf = load_model(imported[case].model_file)
    x = inputs(rec)
    src = BRONetLipConvNetImporter().source_certificates(model, x)
    assert src.lipschitz == pytest.approx(1 / 0.2507)
    assert torch.allclose(src.radii, torch.tensor(rec["source_radii"]), rtol=1e-4, atol=1e-6)


def test_soc_lipconvnet_imports_onto_soc_fast(imported):
    """Their SOC LipConvNet: lipcli's SOC layers with the imported power vectors (their σ)."""
    model, mf = load_model(imported[CASES[2]].model_file)
    assert mf.metadata["config"]["conv"]["name"] == "soc-fast"
    assert sum(key.endswith(".power_u0") for key in model.state_dict()) == 10
    state = torch.load(DATA / f"{CASES[2]}.pt", weights_only=True)
    assert torch.equal(model.body.layer2_conv2.power_u0, state["layer2.1.conv._v1"].flatten())


def test_soc_power_vectors_matter(tmp_path):
    """Other power vectors give another σ and other logits: importing them is what matches."""
    state = torch.load(DATA / f"{CASES[2]}.pt", weights_only=True)
    gen = torch.Generator().manual_seed(0)
    for key in [k for k in state if k.endswith(("conv._u1", "conv._v1"))]:
        moved = state[key] + 0.2 * torch.randn(state[key].shape, generator=gen)
        state[key] = moved / moved.norm()
    torch.save(state, tmp_path / "ones.pt")
    out = tmp_path / "m.safetensors"
    assert run_lip(["import", str(tmp_path / "ones.pt"), "--from", "bronet-lipconvnet", "--out", str(out)]).exit_code == 0
    model, _mf = load_model(out)
    rec = record(CASES[2])
    with torch.no_grad():
        assert float((model(inputs(rec)) - torch.tensor(rec["logits"])).abs().max()) > 1e-4
