"""``lip import --from improved-l2``: the paper's flagship configurations (its code, unmodified:
``tools/make_import_fixtures_options.py improved-l2``): projection pooling (``--pooling lip1``)
with the CRC-Lip head, and with its orthogonal (SOC) last layer: the authors' logits, lipcli's
``projection`` pool and ``ortho`` head, a guaranteed bound, a certificate; a stated
configuration must agree with the keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lipcli.builtins.pooling.pools import ProjectionPool
from lipcli.testing import check_import_fixture, check_import_refused, load_model, run_lip

DATA = Path(__file__).resolve().parent.parent / "data" / "import"
CRC, ORTHO = "improved_l2_lip1_crc_d5_w2", "improved_l2_lip1_ortho_d5_w2"


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("lip1")
    return {case: check_import_fixture(DATA / f"{case}.pt", "improved-l2", out / f"{case}.safetensors")
            for case in (CRC, ORTHO)}


def _record(case: str) -> dict:
    return json.loads((DATA / f"{case}.logits.json").read_text())


def test_lip1_pooling_is_lipclis_projection_pool(imported):
    """Every pooling layer is a ``ProjectionPool`` with the source's angles; the CRC case has
    no pool after block 5 (``crc_full``: activation features), the ortho case has one."""
    state = torch.load(DATA / f"{ORTHO}.pt", weights_only=True)
    for case, pools in ((CRC, 4), (ORTHO, 5)):
        model, mf = load_model(imported[case].model_file)
        found = {name: m for name, m in model.body.named_children() if isinstance(m, ProjectionPool)}
        assert len(found) == pools and mf.metadata["config"]["pool"]["name"] == "projection"
        assert mf.metadata["provenance"]["options"]["pooling"] == "lip1"
    model, _mf = load_model(imported[ORTHO].model_file)
    assert torch.equal(model.body.block3_pool.theta, state["block3.0.act.theta"])


def test_ortho_last_layer_is_the_ortho_head(imported):
    """The source's SOC 1x1 last layer: lipcli's ``ortho`` head whose matrix has orthonormal
    rows to float32 rounding (the series re-orthonormalised) and a guaranteed bound >= 1."""
    model, mf = load_model(imported[ORTHO].model_file)
    assert type(model.head).__name__ == "OrthoHead" and mf.metadata["config"]["head"]["name"] == "ortho"
    w = model.head.normalized_weight().detach().double()
    assert torch.allclose(w @ w.T, torch.eye(10, dtype=torch.float64), atol=1e-6)
    assert model.head.lipschitz_upper_bound() >= float(torch.linalg.matrix_norm(w, ord=2))


def test_the_projection_pooling_crc_model_certifies(imported, cifar10_root, tmp_path):
    result = run_lip(["certify", str(imported[CRC].model_file), "--data-dir", str(cifar10_root), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["lipschitz"]["guaranteed"] and summary["total"] > 0


def test_ortho_source_rule_is_the_authors(imported):
    """Their ``OrthoLinear.certificates`` (margin / √2) over their ``lipschitz_constant(exact=True)``
    estimate: the recorded radii (both estimates start from random vectors: the tolerance)."""
    from lipcli.builtins.lipconvnet.importer import ImprovedL2Importer

    rec = _record(ORTHO)
    model, _mf = load_model(imported[ORTHO].model_file)
    x = torch.rand(*rec["inputs"], generator=torch.Generator().manual_seed(rec["input_seed"]))
    src = ImprovedL2Importer().source_certificates(model, x)
    assert src.lipschitz == pytest.approx(rec["source_lipschitz"], rel=1e-3)
    assert torch.allclose(src.radii.double(), torch.tensor(rec["source_radii"], dtype=torch.float64),
                          rtol=1e-3, atol=1e-6)


def test_their_config_json_agrees_and_a_contradiction_is_refused(tmp_path):
    out = tmp_path / "m.safetensors"
    result = run_lip(["import", str(DATA / f"{ORTHO}.pt"), "--from", "improved-l2", "--out", str(out),
                      "--config", str(DATA / f"{ORTHO}.config.json")])
    assert result.exit_code == 0, result.output
    result = run_lip(["import", str(DATA / f"{ORTHO}.pt"), "--from", "improved-l2", "--out", str(tmp_path / "n.st"),
                      "--option", "pooling=max"])
    assert result.exit_code == 1 and "option pooling='max' is stated" in result.stderr
    assert "pooling='lip1'" in result.stderr and not (tmp_path / "n.st").exists()


def test_cayley_ortho_last_layer_is_refused_by_name(tmp_path):
    state = torch.load(DATA / f"{ORTHO}.pt", weights_only=True)
    for key in [k for k in state if k.startswith("logits_layer.ortho._")]:
        state.pop(key)
    state["logits_layer.ortho.alpha"] = torch.ones(())
    torch.save(state, tmp_path / "cayley_head.pt")
    check_import_refused(tmp_path / "cayley_head.pt", "improved-l2", "Cayley or BCOP orthogonal last layer")
