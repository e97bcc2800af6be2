"""``lip import --from sll``: checkpoints written by the SLL authors' code
(``tools/make_import_fixtures.py sll``, tests/data/) import to the same function, with a
guaranteed bound above the features' true local norm; bad checkpoints are one line each and
write nothing; the source's certificate rule (``lip_cst = 1``) is reproduced for --compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lipcli.testing import (certify_model_file, check_import_fixture, check_import_refused, load_model,
                            run_lip)
from lipcli_sll.importer import SLLImporter

DATA = Path(__file__).resolve().parent / "data"
#: the authors' configurations (tools/make_import_fixtures.py sll, tools/make_import_fixtures_options.py sll):
#: two trainer checkpoints, one without convolutions (n_conv 0), one LipschitzNetwork saved alone
CASES = ["sll_cifar10_c2_d1_w4", "sll_cifar100_c3_d0_w3", "sll_cifar10_c0_d2_w4", "sll_cifar10_c2_d0_w4_net"]
CONFIG = ["--config", str(Path(__file__).resolve().parent / "data" / f"{CASES[0]}.config.json")]


def _lip(*args: str) -> tuple[int, str, str]:
    result = run_lip(list(args))
    return result.exit_code, result.stdout, result.stderr


def _import(checkpoint: Path, out: Path) -> None:
    code, _stdout, stderr = _lip("import", str(checkpoint), "--from", "sll", "--out", str(out), *CONFIG)
    assert code == 0, stderr


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    """Each case imported and checked (logits, provenance, bound vs Jacobian): its report."""
    out = tmp_path_factory.mktemp("imported")
    return {case: check_import_fixture(DATA / f"{case}.pth", "sll", out / f"{case}.safetensors")
            for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_import_matches_the_authors_model(imported, case):
    report = imported[case]
    record = json.loads((DATA / f"{case}.logits.json").read_text())
    assert report.metadata["dataset"]["name"] == record["config"]["dataset"]
    ignored = report.metadata["provenance"]["ignored"]
    assert (bool(ignored) == case.endswith(("w4", "w3"))) and all(k.startswith("optimizer_state_dict.") for k in ignored)
    assert report.metadata["provenance"]["options"]["shift_data"] is True
    assert report.jacobian_norm <= report.bound < 1.0 + 1e-5  # std 1: the SLL layers' 1 + O(1e-6)


def _variant(tmp_path: Path, change) -> Path:
    state = torch.load(DATA / f"{CASES[0]}.pth", weights_only=True)
    change(state["model_state_dict"])
    path = tmp_path / "variant.pth"
    torch.save(state, path)
    (tmp_path / "variant.config.json").write_text((DATA / f"{CASES[0]}.config.json").read_text())
    return path


P = "module.model.model."
FULL = "model_state_dict." + P


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop(P + "2.q"), f"missing keys for importer 'sll': {FULL}2.q"),
    (lambda s: s.__setitem__(P + "9.extra", torch.ones(2)), f"unexpected keys for importer 'sll': {FULL}9.extra"),
    (lambda s: s.__setitem__(P + "6.weight", torch.ones(10, 7)),
     f"tensor '{FULL}6.weight' has shape (10, 7), expected (10, 256)"),
    (lambda s: s.__setitem__(P + "5.bias", torch.ones(32)), f"tensor '{FULL}5.bias' has shape (32,), expected (1, 32)"),
    (lambda s: s[P + "1.kernel"].view(-1)[0].fill_(float("nan")), f"tensor '{FULL}1.kernel' contains NaN"),
    (lambda s: s[P + "1.q"].fill_(100.0), "overflows exp in float32"),
    (lambda s: s.__setitem__(P + "1.kernel", torch.ones(3, 4, 5, 5)), "cannot import a 5x5 SLL filter"),
], ids=["missing", "extra", "shape", "bias-shape", "nan", "q-overflow", "kernel-5"])
def test_bad_checkpoints_are_one_line_and_write_nothing(tmp_path, change, message):
    check_import_refused(_variant(tmp_path, change), "sll", message)


def test_a_bare_state_dict_without_wrappers_imports_the_same(tmp_path, imported):
    """``NormalizedModel.state_dict()`` saved directly (no trainer dictionary, no DataParallel)."""
    state = torch.load(DATA / f"{CASES[0]}.pth", weights_only=True)["model_state_dict"]
    torch.save({k[len("module."):]: v for k, v in state.items()}, tmp_path / "bare.pt")
    _import(tmp_path / "bare.pt", tmp_path / "bare.safetensors")
    a, _ = load_model(tmp_path / "bare.safetensors")
    b, _ = load_model(imported[CASES[0]].model_file)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_arch_must_agree_with_the_checkpoint(tmp_path):
    out = tmp_path / "m.safetensors"
    code, _o, stderr = _lip("import", str(DATA / f"{CASES[0]}.pth"), "--from", "sll", "--arch", "sll-small",
                            "--out", str(out), *CONFIG)
    assert code == 1 and "the checkpoint has 2, 1, 4" in stderr and not out.exists()
    code, _o, stderr = _lip("import", str(DATA / f"{CASES[0]}.pth"), "--from", "sll", "--arch", "lipconvnet-5",
                            "--out", str(out), *CONFIG)
    assert code == 2 and "sll-small" in stderr and not out.exists()


def _random_cifar10(root: Path, images: int = 12) -> Path:
    """CIFAR-10's file layout holding ``images`` random images in every batch."""
    import pickle

    import numpy as np

    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (images, 3072), dtype=np.uint8),
                 "labels": [int(v) for v in rng.integers(0, 10, images)]}
        (base / name).write_bytes(pickle.dumps(batch))
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    return root


def test_import_compare_reports_both_rules(tmp_path):
    root = _random_cifar10(tmp_path / "cifar")
    out = tmp_path / "m.safetensors"
    code, stdout, stderr = _lip("import", str(DATA / f"{CASES[0]}.pth"), "--from", "sll", "--out", str(out),
                                "--compare", "--data-dir", str(root), "--radii", "0,36", "--json", *CONFIG)
    assert code == 0, stderr
    cmp = json.loads(stdout)["compare"]
    assert cmp["source_lipschitz"] == 1.0 < cmp["lipcli_lipschitz"]
    for row in cmp["rows"]:
        assert row["lipcli_certified_accuracy"] <= row["source_certified_accuracy"] + 1e-12
        assert row["source_only"] >= 0


def test_source_rule_is_lipclis_margin_with_lipschitz_one(imported, tmp_path):
    """The authors' ``eval_certified`` divides by ``lip_cst = 1``: point by point its radius is
    lipcli's all-class LLN radius times lipcli's guaranteed bound (same logits, same row
    distances), i.e. lipcli's certified radius is the source's divided by the bound (>= 1)."""
    import pickle

    root = _random_cifar10(tmp_path / "cifar")
    outcome = certify_model_file(imported[CASES[0]].model_file, data_dir=str(root), write=False, device="cpu")
    batch = pickle.loads((root / "cifar-10-batches-py" / "test_batch").read_bytes())
    images = torch.from_numpy(batch["data"]).reshape(-1, 3, 32, 32).float() / 255
    model, _mf = load_model(imported[CASES[0]].model_file)
    src = SLLImporter().source_certificates(model, images)
    assert src.lipschitz == 1.0 and torch.equal(src.predictions, outcome.predictions.cpu())
    bound = outcome.summary.lipschitz.value
    assert bound > 1.0 and outcome.summary.lipschitz.guaranteed
    assert torch.allclose(src.radii.double(), outcome.radius.cpu() * bound, rtol=1e-5, atol=1e-7)


def test_shift_data_is_stated_or_refused_and_both_values_map(tmp_path, imported):
    """``shift_data`` changes no tensor: refused unstated (it was assumed True), the reader's
    mean with True, none with False."""
    (tmp_path / "alone.pth").write_bytes((DATA / f"{CASES[2]}.pth").read_bytes())  # no config.json beside it
    check_import_refused(tmp_path / "alone.pth", "sll", "option 'shift_data' of the source's configuration")
    out = tmp_path / "noshift.safetensors"
    code, _o, stderr = _lip("import", str(DATA / f"{CASES[2]}.pth"), "--from", "sll", "--out", str(out),
                            "--option", "shift_data=false")
    assert code == 0, stderr
    model, _mf = load_model(out)
    assert float(model.body.normalize.shift.abs().max()) == 0.0
    shifted, _ = load_model(imported[CASES[2]].model_file)
    assert float(shifted.body.normalize.shift.min()) > 0.4


def test_a_stated_size_must_agree(tmp_path):
    out = tmp_path / "m.safetensors"
    code, _o, stderr = _lip("import", str(DATA / f"{CASES[2]}.pth"), "--from", "sll", "--out", str(out),
                            "--option", "shift_data=true", "--option", "n_conv=3")
    assert code == 1 and "option n_conv=3 is stated, but the checkpoint's tensors are those of n_conv=0" in stderr
