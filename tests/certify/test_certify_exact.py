"""``lip certify --exact`` (float64 features and margins, lipcli.certify.exact) against a float64
recomputation written here from the certificate's formula, and the radii's independence of
``--attack`` (the eval lowering is decided on the feature pass alone)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lipcli.builtins.datasets.digits import load_digits_dataset
from lipcli.certify import CertifyOptions, run_certification
from lipcli.cli import app
from lipcli.host.models import load_model
from lipcli.lipschitz.bound import guaranteed_upper_bound

LIMIT = 40


def _float64_lln_radii(path: Path, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(predictions, input-space radii)`` of the LLN model at ``path`` on the digits test
    points ``indices``: the model's float64 features, ``logits = y Ŵᵀ + b`` with
    ``Ŵ_i = W_i/||W_i||`` in float64, ``r = min_j (f_l - f_j)/||ŵ_l - ŵ_j|| / Lip``."""
    model, _ = load_model(path, device="cpu")
    model.eval()
    lip = guaranteed_upper_bound(model)[0]  # of the stored (float32) weights
    m64 = copy.deepcopy(model).double()
    images = load_digits_dataset("test").images[indices].double()
    with torch.no_grad():
        y = m64.body(images)
        w = m64.head.weight.double()
        w_hat = w / w.norm(dim=1, keepdim=True)
        logits = y @ w_hat.T + m64.head.bias.double()
    pred = logits.argmax(1)
    radii = []
    for i in range(len(indices)):
        l = int(pred[i])
        r = min(float((logits[i, l] - logits[i, j]) / (w_hat[l] - w_hat[j]).norm())
                for j in range(logits.shape[1]) if j != l)
        radii.append(max(r, 0.0) / lip)
    return pred, torch.tensor(radii, dtype=torch.float64)


def test_exact_radii_equal_a_float64_recomputation(tiny_model_file: Path) -> None:
    exact = run_certification(tiny_model_file, CertifyOptions(limit=LIMIT, write=False, exact=True))
    pred, radii = _float64_lln_radii(tiny_model_file, exact.indices)
    assert exact.summary.exact and exact.radius.dtype == torch.float64
    assert torch.equal(exact.predictions, pred)
    assert torch.allclose(exact.radius, radii, rtol=0, atol=1e-12), (exact.radius - radii).abs().max()
    # the float32 path is not that close (it is what --exact measures against)
    plain = run_certification(tiny_model_file, CertifyOptions(limit=LIMIT, write=False))
    assert not plain.summary.exact
    assert (plain.radius - radii).abs().max() > 1e-12


def test_exact_run_is_recorded_and_leaves_the_cache(tiny_model_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(tiny_model_file.read_bytes())
    res = CliRunner().invoke(app, ["certify", str(path), "--limit", "20", "--exact", "--json", "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["exact"] is True and summary["lipschitz"]["dense_layers"] == []
    assert any(note.startswith("--exact:") for note in summary["notes"])
    assert summary["written"] == ["results"]  # the certificate cache is the float32 head's
    from lipcli.host.modelfile import read_metadata

    stored = read_metadata(path)["results"]
    assert stored["certify"]["exact"] is True
    # a float32 run of the same evaluation is another history entry, not a replacement
    res = CliRunner().invoke(app, ["certify", str(path), "--limit", "20", "--json", "-q"])
    assert res.exit_code == 0 and json.loads(res.stdout)["exact"] is False
    runs = read_metadata(path)["results"]["certify_runs"]
    assert [r["exact"] for r in runs] == [True, False]


def test_radii_do_not_depend_on_the_attack(tiny_model_file: Path) -> None:
    """The attack's many passes would make the dense lowering pay off; the radii (and the
    layers counted as dense in the bound) are those of the feature pass alone."""
    base = dict(limit=120, write=False, attack_steps=5, attack_restarts=1)
    without = run_certification(tiny_model_file, CertifyOptions(**base))
    attacked = run_certification(tiny_model_file, CertifyOptions(**base, attack=True))
    assert without.radius.tolist() == attacked.radius.tolist()
    assert without.summary.lipschitz.dense_layers == attacked.summary.lipschitz.dense_layers
    assert without.summary.lipschitz.value == attacked.summary.lipschitz.value
    assert attacked.summary.attack is not None and attacked.summary.violations == 0
    # on this model the attack's own network is lowered (what used to switch the radii)
    assert any(note.startswith("PGD check:") for note in attacked.summary.notes)


@pytest.mark.parametrize("head", ["mlp"])
def test_exact_runs_the_mlp_head_in_float64(tmp_path: Path, head: str) -> None:
    from conftest import save_tiny_model

    path = save_tiny_model(tmp_path / "mlp.safetensors", dataset={"name": "digits", "params": {},
                           "num_classes": 10}, head=head)
    out = run_certification(path, CertifyOptions(limit=20, write=False, exact=True))
    model, _ = load_model(path, device="cpu")
    m64 = copy.deepcopy(model.eval()).double()
    with torch.no_grad():
        logits = m64(load_digits_dataset("test").images[out.indices].double())
    assert torch.equal(out.predictions, logits.argmax(1))
    assert out.summary.exact and bool((out.radius >= 0).all())
