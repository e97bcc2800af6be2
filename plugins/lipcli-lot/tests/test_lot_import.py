"""``lip import --from lot``: checkpoints written by the LOT authors' code
(``tools/make_import_fixtures_lot.py``, tests/data/: a LipConvNet with the LLN head, a LipResNet
with ``--residual`` and a LipConvNet with their LOT head) import to the same function, with a
guaranteed bound above the features' true local norm; bad checkpoints are one line each and
write nothing; the source's certificate rule is reproduced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lipcli.sdk.residual import ConvexResidual
from lipcli.testing import check_import_fixture, check_import_refused, load_model, run_lip
from lipcli_lot.head import LOTHead
from lipcli_lot.importer import LOTImporter
from lipcli_lot.lot import LOTConv

DATA = Path(__file__).resolve().parent / "data"
CASES = ["lot_lipconvnet_b2_w2_lln", "lot_lipresnet_b3_w2_lln", "lot_lipconvnet_b1_w2_c100",
         "lot_lipresnet_b3_w2_hh1", "lot_lipconvnet_b1_w2_hh2"]


def _record(case: str) -> dict:
    return json.loads((DATA / f"{case}.logits.json").read_text())


def _inputs(record: dict) -> torch.Tensor:
    return torch.rand(*record["inputs"], generator=torch.Generator().manual_seed(record["input_seed"]))


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    """The reports of :func:`check_import_fixture` (logits to 1e-5, provenance, bound at
    least the float64 Jacobian norm of the features), by case."""
    folder = tmp_path_factory.mktemp("lot")
    return {case: check_import_fixture(DATA / f"{case}.pt", "lot", folder / f"{case}.safetensors")
            for case in CASES}


@pytest.mark.parametrize("case, dataset", list(zip(CASES, ["cifar10", "cifar10", "cifar100", "cifar10", "cifar10"])))
def test_import_matches_the_authors_model(imported, case, dataset):
    """Logits within ``1e-5`` of the largest; the bound is above the features' Jacobian norm and
    at most ``1/0.2507`` (the normalisation) times a little above 1 per LOT layer."""
    report, largest = imported[case], torch.tensor(_record(case)["logits"]).abs().max()
    assert report.metadata["dataset"]["name"] == dataset
    assert report.max_logit_error < 1e-5 * float(largest)
    assert report.jacobian_norm <= report.bound < (1 / 0.2507) * 1.01


def test_imported_layers_are_the_authors_lot_form(imported):
    model, mf = load_model(imported[CASES[1]].model_file)
    convs = [m for m in model.modules() if isinstance(m, LOTConv)]
    assert len(convs) == 15 and all(c.pad == c.kernel_size // 2 for c in convs)
    assert all(c.iterations == 10 and c.eps == 1e-4 for c in convs)
    residuals = [m for m in model.modules() if isinstance(m, ConvexResidual)]
    assert len(residuals) == 5 and all(r.mix == 0.5 for r in residuals)
    assert mf.metadata["provenance"]["ignored"] == []
    head_model, _mf = load_model(imported[CASES[2]].model_file)
    assert isinstance(head_model.head, LOTHead) and head_model.head.iterations == 10
    for case, order in ((CASES[3], 1), (CASES[4], 2)):  # their hh1, hh2: lipcli-householder's
        acts = [m for m in load_model(imported[case].model_file)[0].modules() if type(m).__name__ == "HouseHolder"]
        assert len(acts) == (15 if order == 1 else 5) and all(a.order == order for a in acts)


def test_the_zero_border_matters(imported):
    """The same layers on the image's own torus (lipcli's default border) give other logits."""
    record = _record(CASES[0])
    model, _mf = load_model(imported[CASES[0]].model_file)
    for conv in (m for m in model.modules() if isinstance(m, LOTConv) and m.pad):
        conv.spatial_size.copy_(conv.spatial_size - 2 * conv.pad)
        conv.pad = 0
        conv.invalidate()
    with torch.no_grad():
        got = model(_inputs(record))
    assert float((got - torch.tensor(record["logits"])).abs().max()) > 1e-3


P = "layer2.1.conv."
VARIANTS = {  # id: (case, change of its state dict, the one line expected)
    "missing": (0, lambda s: s.pop(P + "bias"), f"missing keys for importer 'lot': {P}bias"),
    "extra": (0, lambda s: s.__setitem__("layer9.extra", torch.ones(2)),
              "unexpected keys for importer 'lot': layer9.extra"),
    "shape": (0, lambda s: s.__setitem__(P + "weight", torch.ones(8, 7, 3, 3)),
              f"tensor '{P}weight' has shape (8, 7, 3, 3), expected (8, 16, 3, 3)"),
    "nan": (0, lambda s: s["last_layer.weight"].view(-1)[0].fill_(float("nan")),
            "tensor 'last_layer.weight' contains NaN"),
    "activation": (0, lambda s: s.__setitem__("layer1.0.activation.alpha", torch.ones(1)),
                   "activation tensors alpha: not the authors' MaxMin, hh1 or hh2"),
    "hh1-missing": (0, lambda s: s.__setitem__("layer1.0.activation.theta", torch.ones(1, 1, 1, 1)),
                    "missing keys for importer 'lot': layer1.1.activation.theta"),
    "hh2-offset": (4, lambda s: s["layer3.0.activation.theta0"].view(-1)[1].fill_(7.0),
                   "cannot import layer3.0.activation.theta0 outside [0, 2*pi]"),
    "cayley": (0, lambda s: s.__setitem__("layer1.0.conv.alpha", torch.ones(1)), "non-LOT LipConvNet (conv.alpha)"),
    "features": (0, lambda s: s.__setitem__("last_layer.weight", torch.ones(10, 48)), "last_layer.weight has 48 features"),
    "mix": (1, lambda s: s.__setitem__("layer3.res_lamda_logit", torch.ones(1)), "different res_lamda_logit values"),
    "hidden-shape": (1, lambda s: s.__setitem__("layer2.hidden_block.0.conv.bias", torch.ones(5)),
                     "tensor 'layer2.hidden_block.0.conv.bias' has shape (5,), expected (4,)"),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_checkpoints_are_one_line_and_write_nothing(tmp_path, variant):
    case, change, message = VARIANTS[variant]
    path = tmp_path / f"{variant}.pt"
    state = torch.load(DATA / f"{CASES[case]}.pt", weights_only=True)
    change(state)
    torch.save(state, path)
    check_import_refused(path, "lot", message)


def test_arch_must_agree_with_the_checkpoint(tmp_path):
    out = tmp_path / "m.safetensors"
    ckpt = str(DATA / f"{CASES[0]}.pt")
    for arch in ("lot-lipconvnet-5", "lot-lipresnet-10"):
        result = run_lip(["import", ckpt, "--from", "lot", "--arch", arch, "--out", str(out)])
        assert result.exit_code == 1 and "holds a lot-lipconvnet-10" in result.stderr and not out.exists()
    result = run_lip(["import", ckpt, "--from", "lot", "--arch", "lipconvnet-10", "--out", str(out)])
    assert result.exit_code == 2 and "lot-lipconvnet-N" in result.stderr and not out.exists()


@pytest.mark.parametrize("case", CASES)
def test_source_rule_is_the_authors_certificate(imported, case):
    """``source_certificates`` on the imported model gives the radii the authors'
    ``lln_certificates`` / ``ortho_certificates`` gave on their own model (recorded)."""
    record = _record(case)
    model, _mf = load_model(imported[case].model_file)
    src = LOTImporter().source_certificates(model, _inputs(record))
    assert src.lipschitz == pytest.approx(1 / 0.2507) == record["source_lipschitz"]
    assert torch.allclose(src.radii, torch.tensor(record["source_radii"]), rtol=1e-4, atol=1e-6)
