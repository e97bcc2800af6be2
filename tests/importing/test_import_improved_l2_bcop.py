"""``lip import --from improved-l2`` of the paper's BCOP LipConvNet (the checkpoint made by their
code, ``tools/make_import_fixtures_improved_l2.py ... bcop``, tests/data/import/) onto
lipcli-bcop's ``bcop:taps=authors``: the same function, a bound above the features' Jacobian
norm, the source's certificate rule, and one-line refusals."""

from __future__ import annotations

import pytest
import torch
from improved_l2_fixture import check_changed_copy_refused, check_source_rule, imported_case

from lipcli.testing import load_model

BCOPConv = pytest.importorskip("lipcli_bcop.bcop", reason="lipcli-bcop is not installed").BCOPConv
CASE = "improved_l2_bcop_lln_d5_w2"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return imported_case(CASE, tmp_path_factory.mktemp("bcop"))


def test_logits_are_the_papers(imported):
    """Logits within ``1e-5`` of the largest (checked by the report too); every layer is
    lipcli-bcop's in the authors' tap layout; the bound is above the Jacobian norm."""
    report, rec, x = imported
    model, mf = load_model(report.model_file)
    want = torch.tensor(rec["logits"])
    with torch.no_grad():
        assert float((model(x) - want).abs().max()) < 1e-5 * float(want.abs().max())
    assert mf.metadata["config"]["conv"]["name"] == "bcop"
    convs = [m for m in model.modules() if isinstance(m, BCOPConv)]
    assert len(convs) == 6 and all(c.taps == "authors" for c in convs)
    assert report.jacobian_norm <= report.bound < (1 / 0.2507) * 1.001


def test_the_tap_layout_matters(imported):
    """lipcli's own layout (no transposed taps where ``in·s² ≤ out``) gives other logits."""
    report, rec, x = imported
    model, _mf = load_model(report.model_file)
    for conv in model.modules():
        if isinstance(conv, BCOPConv):
            conv.taps = "lipcli"  # an operator setting: the cached eval filter is recomputed
    with torch.no_grad():
        assert float((model(x) - torch.tensor(rec["logits"])).abs().max()) > 1e-3


def test_source_rule_is_the_papers_certificate(imported):
    check_source_rule(*imported)


def _other_mask(s: dict) -> None:
    s["block2.0.ortho.mask"] = s["block2.0.ortho.mask"].flip(-1)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("block3.0.ortho.mask"), "missing keys for importer 'improved-l2': block3.0.ortho.mask"),
    (lambda s: s.__setitem__("block1.0.ortho.conv_matrices", torch.ones(3, 8, 8)),
     "tensor 'block1.0.ortho.conv_matrices' has shape (3, 8, 8), expected (5, 8, 8)"),
    (_other_mask, "not the authors' half-rank mask"),
    (lambda s: s["block4.0.ortho.conv_matrices"].view(-1)[0].fill_(float("nan")),
     "tensor 'block4.0.ortho.conv_matrices' contains NaN"),
], ids=["missing", "shape", "mask", "nan"])
def test_bad_checkpoints_are_one_line(tmp_path, change, message):
    check_changed_copy_refused(CASE, change, message, tmp_path)
