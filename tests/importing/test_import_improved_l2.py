"""``lip import --from improved-l2``: checkpoints made by the paper's code
(``tools/make_import_fixtures.py``, tests/data/import/) import to the same function, with a
guaranteed bound above the features' true local norm; bad checkpoints are one line each and
write nothing; the imported model certifies; ``--compare`` reports both rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.host.models import load_model
from lipcli.importing import import_checkpoint

DATA = Path(__file__).resolve().parent.parent / "data" / "import"
CASES = ["improved_l2_lln_d10_w2", "improved_l2_crc_d5_w2"]
runner = CliRunner()


def _fixed_inputs(record: dict) -> torch.Tensor:
    gen = torch.Generator().manual_seed(record["input_seed"])
    return torch.rand(*record["inputs"], generator=gen)


def _lip(*args: str):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("imported")
    for case in CASES:
        import_checkpoint(DATA / f"{case}.pt", "improved-l2", out / f"{case}.safetensors")
    return {case: out / f"{case}.safetensors" for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_the_authors(imported, case):
    record = json.loads((DATA / f"{case}.logits.json").read_text())
    model, mf = load_model(imported[case])
    with torch.no_grad():
        got = model(_fixed_inputs(record))
    want = torch.tensor(record["logits"])
    scale = want.abs().max()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(scale)), (got - want).abs().max()
    prov = mf.metadata["provenance"]
    assert prov["source"] == record["source"] and prov["format"] == "torch-pickle"
    import hashlib

    assert prov["sha256"] == hashlib.sha256((DATA / f"{case}.pt").read_bytes()).hexdigest()
    assert mf.metadata["dataset"]["name"] == "cifar10"


@pytest.mark.parametrize("case", CASES)
def test_guaranteed_bound_covers_the_dense_jacobian(imported, case):
    model, mf = load_model(imported[case])
    bound = mf.metadata["lipschitz"]["upper_bound"]
    model = model.double()
    x = torch.rand(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    jac = torch.autograd.functional.jacobian(lambda t: model.features(t)[0], x).reshape(-1, x.numel())
    norm = float(torch.linalg.matrix_norm(jac, ord=2))
    assert 0.5 * bound < norm <= bound  # tight: SOC is orthogonal up to its series truncation


def _save_variant(tmp_path: Path, change) -> Path:
    state = torch.load(DATA / "improved_l2_lln_d10_w2.pt", weights_only=True)
    change(state)
    path = tmp_path / "variant.pt"
    torch.save(state, path)
    return path


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("block2.0.ortho._u3"), "missing keys for importer 'improved-l2': block2.0.ortho._u3"),
    (lambda s: s.__setitem__("extra.weight", torch.ones(2)), "unexpected keys for importer 'improved-l2': extra.weight"),
    (lambda s: s.__setitem__("logits_layer.weight", torch.ones(10, 7)), "tensor 'logits_layer.weight' has shape (10, 7), expected (10, 64)"),
    (lambda s: s["block3.1.ortho.weight"].view(-1)[0].fill_(float("nan")), "tensor 'block3.1.ortho.weight' contains NaN"),
], ids=["missing", "extra", "shape", "nan"])
def test_bad_checkpoints_are_one_line_and_write_nothing(tmp_path, change, message):
    path = _save_variant(tmp_path, change)
    out = tmp_path / "m.safetensors"
    code, _stdout, stderr = _lip("import", str(path), "--from", "improved-l2", "--out", str(out))
    assert code == 1 and message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["variant.pt"]


def test_a_pickle_that_would_write_a_file_is_refused(tmp_path):
    import os

    target = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    state = torch.load(DATA / "improved_l2_lln_d10_w2.pt", weights_only=True)
    state["payload"] = Payload()
    torch.save(state, tmp_path / "evil.pt")
    out = tmp_path / "m.safetensors"
    code, _stdout, stderr = _lip("import", str(tmp_path / "evil.pt"), "--from", "improved-l2", "--out", str(out))
    assert code == 1 and len(stderr.strip().splitlines()) == 1 and "refused" in stderr, stderr
    assert not target.exists() and not out.exists()


def test_wrong_from_is_a_usage_error(tmp_path):
    out = tmp_path / "m.safetensors"
    code, _stdout, stderr = _lip("import", str(DATA / f"{CASES[0]}.pt"), "--from", "nope", "--out", str(out))
    assert code == 2 and "unknown importer 'nope'" in stderr and "improved-l2" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not out.exists()


def test_arch_must_agree_with_the_checkpoint(tmp_path):
    out = tmp_path / "m.safetensors"
    code, _o, stderr = _lip("import", str(DATA / f"{CASES[0]}.pt"), "--from", "improved-l2",
                            "--arch", "lipconvnet-15", "--out", str(out))
    assert code == 1 and "has 3 layers per block but the checkpoint has 2" in stderr and not out.exists()
    code, _o, stderr = _lip("import", str(DATA / f"{CASES[0]}.pt"), "--from", "improved-l2",
                            "--arch", "resnet", "--out", str(out))
    assert code == 2 and not out.exists()


def _compare(case: str, out: Path, cifar10_root: Path) -> dict:
    """``lip import CASE --compare --radii 0,36 --json``: its ``compare`` record."""
    code, stdout, stderr = _lip("import", str(DATA / f"{case}.pt"), "--from", "improved-l2",
                                "--out", str(out), "--compare", "--data-dir", str(cifar10_root),
                                "--radii", "0,36", "--json")
    assert code == 0, stderr
    return json.loads(stdout)["compare"]


def test_certify_and_compare_on_the_imported_model(tmp_path, cifar10_root):
    out = tmp_path / "m.safetensors"
    cmp = _compare(CASES[0], out, cifar10_root)
    assert cmp["source_lipschitz"] < cmp["lipcli_lipschitz"]  # the estimate is below the bound
    rows = cmp["rows"]
    assert [r["radius_units"] for r in rows] == [0, 36]
    for row in rows:  # a larger divisor can only certify fewer points (same margins, 10 classes)
        assert row["lipcli_certified_accuracy"] <= row["source_certified_accuracy"] + 1e-12
        assert row["source_only"] >= 0
    code, stdout, stderr = _lip("certify", str(out), "--data-dir", str(cifar10_root), "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["lipschitz"]["guaranteed"] and summary["total"] == cmp["points"]


def test_source_rule_is_lipclis_margin_over_the_estimate(imported, cifar10_root):
    """With 10 classes the source's top-9 is every other class, so its feature-space radius is
    lipcli's: ``source radius * estimate == lipcli radius * bound`` point by point."""
    from lipcli.builtins.lipconvnet.importer import ImprovedL2Importer
    from lipcli.certify import CertifyOptions, run_certification
    from lipcli.certify.data import load_dataset, stack
    from lipcli.host.plugins import get_registry

    path = imported[CASES[0]]
    outcome = run_certification(path, CertifyOptions(data_dir=str(cifar10_root), write=False, device="cpu"))
    model, _mf = load_model(path)
    dataset, _ = load_dataset(get_registry(), None, name="cifar10", data_dir=str(cifar10_root),
                              download=False, split="test", model_path=path)
    images, _labels = stack(dataset, list(range(len(outcome.labels))))
    src = ImprovedL2Importer().source_certificates(model, images)
    assert torch.equal(src.predictions, outcome.predictions.cpu())
    ours = outcome.radius.cpu() * outcome.summary.lipschitz.value
    theirs = src.radii.double() * src.lipschitz
    assert torch.allclose(theirs, ours, rtol=1e-5, atol=1e-7)
    assert src.lipschitz < outcome.summary.lipschitz.value


def test_a_safetensors_copy_imports_to_the_same_model(tmp_path, imported):
    from safetensors.torch import save_file

    state = torch.load(DATA / f"{CASES[1]}.pt", weights_only=True)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "c.safetensors")
    report = import_checkpoint(tmp_path / "c.safetensors", "improved-l2", tmp_path / "m.safetensors")
    assert report.format == "safetensors" and report.ignored == ["logits_layer._u", "logits_layer._v"]
    ours, _ = load_model(tmp_path / "m.safetensors")
    ref, _ = load_model(imported[CASES[1]])
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values()))
    code, stdout, _err = _lip("info", str(tmp_path / "m.safetensors"))
    assert code == 0 and "imported by lip import --from improved-l2" in stdout and report.sha256 in stdout


def test_a_whole_pickled_module_is_refused(tmp_path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    code, _o, stderr = _lip("import", str(tmp_path / "module.pt"), "--from", "improved-l2",
                            "--out", str(tmp_path / "m.safetensors"))
    assert code == 1 and "torch.nn.modules.linear.Linear" in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.safetensors").exists()


def test_unsupported_source_pieces_are_named(tmp_path):
    path = _save_variant(tmp_path, lambda s: s.__setitem__("init_layer.act.theta", torch.ones(1, 1, 1, 1)))
    code, _o, stderr = _lip("import", str(path), "--from", "improved-l2", "--out", str(tmp_path / "m.safetensors"))
    assert code == 1 and "HouseHolder" in stderr and not (tmp_path / "m.safetensors").exists()


def test_lippool_is_named(tmp_path):
    path = _save_variant(tmp_path, lambda s: s.__setitem__("block1.1.act.theta", torch.ones(4)))
    code, _o, stderr = _lip("import", str(path), "--from", "improved-l2", "--out", str(tmp_path / "m.safetensors"))
    assert code == 1 and "LipPool" in stderr and not (tmp_path / "m.safetensors").exists()


def test_source_rule_reproduces_the_authors_certificates(imported):
    """``source_certificates`` on the authors' fixed inputs gives the radii the authors' own
    ``evaluate_certificates(exact=True)`` gave (recorded by the fixture script); both divide
    by a power-iteration estimate from a random start, hence the tolerance."""
    from lipcli.builtins.lipconvnet.importer import ImprovedL2Importer

    record = json.loads((DATA / f"{CASES[0]}.logits.json").read_text())
    model, _mf = load_model(imported[CASES[0]])
    src = ImprovedL2Importer().source_certificates(model, _fixed_inputs(record))
    assert src.lipschitz == pytest.approx(record["source_lipschitz"], rel=1e-4)
    want = torch.tensor(record["source_radii"], dtype=torch.float64)
    assert torch.allclose(src.radii.double(), want, rtol=1e-4, atol=1e-6), (src.radii, want)


def test_crc_source_rule_reproduces_the_papers_precise_certificates(imported):
    """The paper's ``crc_full`` rule (``evaluate_certificates_precise``, the curvature power
    method seeded as the fixture script seeded it) on the imported head: the authors' per-class
    certificates, converged pairs (> 0) and unconverged ones (0: their Newton stops short)."""
    from lipcli.builtins.lipconvnet.importer import ImprovedL2Importer
    from lipcli.builtins.lipconvnet.source_crc import paper_crc_certificates

    record = json.loads((DATA / f"{CASES[1]}.logits.json").read_text())
    model, _mf = load_model(imported[CASES[1]])
    x = _fixed_inputs(record)
    with torch.no_grad():
        features = model.features(x)
        preds = model.head(features).argmax(1)
    want = torch.tensor(record["source_crc_certs"])
    assert (want > 0).any() and (want == 0).any()
    got = paper_crc_certificates(model.head, features, preds, seed=0)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got, want)
    src = ImprovedL2Importer().source_certificates(model, x)
    assert src.lipschitz == pytest.approx(record["source_lipschitz"], rel=1e-4)
    assert torch.allclose(src.radii.float(), torch.tensor(record["source_radii"]), atol=1e-6)
    assert "curvature estimate" in src.label


def test_compare_reports_the_crc_source_rule(tmp_path, cifar10_root):
    cmp = _compare(CASES[1], tmp_path / "m.safetensors", cifar10_root)
    assert cmp["note"] is None and cmp["source_lipschitz"] < cmp["lipcli_lipschitz"]
    assert all(r["source_certified_accuracy"] is not None and r["source_only"] >= 0 for r in cmp["rows"])
