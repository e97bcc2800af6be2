"""``lip import --from bronet-lipconvnet`` of the BRONet authors' LOT LipConvNet
(``tools/make_import_fixtures_bronet.py lipconvnet-lot``, tests/data/: ``--lln``, and their 1×1
LOT last layer on 100 classes) onto lipcli-lot's ``lot:border=zero`` layers and ``lot`` head.  The
same function, the bound and the source's rule: the shared cases of test_bro_import.py."""

from __future__ import annotations

import pytest
import torch
from bro_fixture_data import DATA, check_variant_refused, import_reports, inputs, record

from lipcli.testing import load_model, run_lip

pytest.importorskip("lipcli_lot")
from lipcli_lot.head import LOTHead  # noqa: E402
from lipcli_lot.lot import LOTConv  # noqa: E402

CASES = ["bronet_lipconvnet_lot_b2_w2_c10", "bronet_lipconvnet_lot_b1_w2_c100"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    return import_reports(CASES, "bronet-lipconvnet", tmp_path_factory.mktemp("bronet_lot"))


def test_imported_layers_are_the_authors_lot_form(imported):
    model, mf = load_model(imported[CASES[0]].model_file)
    assert mf.metadata["config"]["conv"]["name"] == "lot"
    convs = [m for m in model.modules() if isinstance(m, LOTConv)]
    assert len(convs) == 10 and all(c.pad == c.kernel_size // 2 for c in convs)
    assert all(c.iterations == 10 and c.eps == 1e-4 for c in convs)
    assert not isinstance(model.head, LOTHead)  # --lln: lipcli's lln head
    assert mf.metadata["provenance"]["ignored"] == []
    state = torch.load(DATA / f"{CASES[0]}.pt", weights_only=True)
    assert torch.equal(model.body.layer2_conv2.weight, state["layer2.1.conv.weight"])  # not flipped


def test_their_lot_last_layer_is_the_lot_head(imported):
    model, _mf = load_model(imported[CASES[1]].model_file)
    assert isinstance(model.head, LOTHead) and tuple(model.head.weight.shape) == (100, 64)


def test_the_filter_orientation_matters(tmp_path):
    """Their LOT layer and lipcli's read the filter the same way: importing it flipped (as a
    BRO filter is) gives other logits."""
    case = CASES[0]
    state = torch.load(DATA / f"{case}.pt", weights_only=True)
    for key in [k for k in state if k.endswith("conv.weight") and state[k].shape[-1] == 3]:
        state[key] = state[key].flip(-1, -2)
    torch.save(state, tmp_path / "flipped.pt")
    out = tmp_path / "m.safetensors"
    code = run_lip(["import", str(tmp_path / "flipped.pt"), "--from", "bronet-lipconvnet", "--out", str(out)]).exit_code
    assert code == 0
    model, _mf = load_model(out)
    rec = record(case)
    with torch.no_grad():
        assert float((model(inputs(rec)) - torch.tensor(rec["logits"])).abs().max()) > 1e-3


P = "layer3.0.conv."


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop(P + "bias"), f"missing keys for importer 'bronet-lipconvnet': {P}bias"),
    (lambda s: s.__setitem__(P + "weight", torch.ones(8, 4, 3, 3)),
     f"tensor '{P}weight' has shape (8, 4, 3, 3), expected (8, 8, 3, 3)"),
    (lambda s: s.__setitem__("last_layer.weight", torch.ones(10, 64, 3, 3)), "no last_layer.weight of 2 dimensions"),
], ids=["missing", "shape", "head"])
def test_bad_lot_checkpoints_are_one_line_and_write_nothing(tmp_path, change, message):
    check_variant_refused(CASES[0], "bronet-lipconvnet", change, message, tmp_path)
