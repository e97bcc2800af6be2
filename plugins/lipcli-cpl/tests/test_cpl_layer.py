"""CPL: the study's outputs from the same parameters (fixtures made by running its code,
``tools/make_layers_compared_fixtures.py``), the proven bound against float64 dense Jacobians,
conformance, export, and a wrong layer caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lipcli_cpl.plugin as plugin
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import check_conv_spec, check_export_module, randomise_parameters
from lipcli.testing.conv import jacobian_singular_values, pair_ratio
from lipcli_cpl import CPLConv, CPLLinear, cpl_layer_bound
from lipcli_cpl.export import ExportedCPL, ExportedCPLLinear

DATA = Path(__file__).resolve().parent / "data"


def _fixture(case: str) -> tuple[dict, dict]:
    return load_file(str(DATA / f"{case}.safetensors")), json.loads((DATA / f"{case}.json").read_text())


def _authors_layer(t: dict, meta: dict) -> CPLConv:
    layer = CPLConv(meta["channels"], meta["channels"], meta["kernel"], 1, eval_step="authors").double()
    with torch.no_grad():
        layer.kernel.copy_(t["kernel"])
        layer.bias.copy_(t["bias"])
    layer.u = t["u0"].clone()
    return layer


@pytest.mark.parametrize("case", ["cpl_conv_c4_k3_n6", "cpl_conv_c6_k1_n1"])
def test_same_parameters_give_the_studys_outputs(case):
    """One training step (one power step from the same u, u updated) and the eval pass
    (100 steps, cached) equal the study's CPLConv2d to 1e-12 (float64)."""
    t, meta = _fixture(case)
    assert meta["commit"] == "01e3f2ad1f48ad749b2e91452c1d5869d3a6159a"
    layer = _authors_layer(t, meta).train()
    torch.testing.assert_close(layer(t["x_train"]), t["y_train"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.u, t["u"], rtol=1e-12, atol=1e-12)
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(t["x_eval"]), t["y_eval"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer.eval_state()[2].reshape(1), t["eval_rescaling"], rtol=1e-12, atol=0)


def test_dense_layer_is_the_studys_1x1_layer_on_1x1_images():
    t, meta = _fixture("cpl_conv_c6_k1_n1")
    c = meta["channels"]
    dense = CPLLinear(c, eval_step="authors").double()
    with torch.no_grad():
        dense.kernel.copy_(t["kernel"].reshape(c, c))
        dense.bias.copy_(t["bias"])
    dense.u = t["u0"].reshape(1, c).clone()
    dense.train()
    torch.testing.assert_close(dense(t["x_train"].reshape(-1, c)), t["y_train"].reshape(-1, c), rtol=1e-12, atol=1e-12)
    dense.eval()
    with torch.no_grad():
        torch.testing.assert_close(dense(t["x_eval"].reshape(-1, c)), t["y_eval"].reshape(-1, c), rtol=1e-12, atol=1e-12)


def _jacobian_norm(layer, shape) -> float:
    gen = torch.Generator().manual_seed(3)
    svals = jacobian_singular_values(layer, shape, torch.float64, gen, points=4)
    return max(max(float(v.max()) for v in svals), pair_ratio(layer, shape, gen))


@pytest.mark.parametrize("eval_step", ["verified", "authors"])
@pytest.mark.parametrize("cin, cout, k, stride, n", [(4, 4, 3, 1, 6), (3, 5, 3, 1, 5), (4, 16, 3, 2, 6),
                                                    (8, 4, 3, 1, 4), (4, 4, 1, 1, 1), (4, 4, 5, 1, 7)])
def test_bound_covers_the_float64_dense_jacobian(eval_step, cin, cout, k, stride, n):
    """Random (large) parameters: the authors' step is expansive beyond 1, the bound is not
    beaten; the verified step keeps the layer at 1."""
    torch.manual_seed(cin + cout + n)
    layer = randomise_parameters(CPLConv(cin, cout, k, stride, eval_step=eval_step).double(), seed=k + n)
    layer.train()
    layer(torch.randn(1, cin, n, n, dtype=torch.float64))  # draws u at this size, one power step
    layer.eval()
    bound = layer.lipschitz_upper_bound()
    norm = _jacobian_norm(layer, (cin, n, n))
    assert norm <= bound * (1 + 1e-9)
    assert norm > 0.5
    if eval_step == "verified":
        assert bound <= 1 + 1e-9


def test_authors_step_can_be_expansive_and_its_bound_says_so():
    """One power step only (an unconverged estimate): the study's step h = 2/σ̂² exceeds 2/‖W‖²,
    the Jacobian norm exceeds 1, and the bound covers it (the estimate would not)."""
    torch.manual_seed(5)
    layer = randomise_parameters(CPLConv(4, 4, 3, 1, eval_step="authors").double(), seed=1)
    layer.train()
    layer(torch.randn(1, 4, 6, 6, dtype=torch.float64))
    layer.eval()
    import lipcli_cpl.core as core

    old = core.EVAL_STEPS
    try:
        core.EVAL_STEPS = 1
        import lipcli_cpl.conv as conv_module

        conv_module.EVAL_STEPS = 1
        layer.invalidate()
        bound = layer.lipschitz_upper_bound()
        norm = _jacobian_norm(layer, (4, 6, 6))
    finally:
        core.EVAL_STEPS = old
        conv_module.EVAL_STEPS = old
    assert norm > 1.001
    assert norm <= bound * (1 + 1e-9)


def test_layer_bound_formula():
    assert 1.0 <= cpl_layer_bound(2.0, 1.0) <= 1.0 + 1e-10  # exact product 2: bound 1 up to rounding
    assert cpl_layer_bound(0.5, 1.0) == 1.0
    assert cpl_layer_bound(2.0, 1.1) >= 2 * 1.21 - 1
    with pytest.raises(ValueError):
        cpl_layer_bound(float("nan"), 1.0)


def test_dense_bound_covers_the_jacobian():
    for es in ("verified", "authors"):
        layer = randomise_parameters(CPLLinear(6, 9, eval_step=es).double(), seed=2).eval()
        gen = torch.Generator().manual_seed(0)
        worst = 0.0
        for _ in range(6):
            x = 3 * torch.randn(1, 6, generator=gen, dtype=torch.float64)
            jac = torch.autograd.functional.jacobian(layer, x).reshape(6, 6)
            worst = max(worst, float(torch.linalg.matrix_norm(jac, ord=2)))
        assert 0.5 < worst <= layer.lipschitz_upper_bound() * (1 + 1e-9)


def test_larger_images_are_refused_and_state_roundtrips():
    layer = CPLConv(4, 4, 3, 1)
    layer(torch.randn(2, 4, 6, 6))
    layer(torch.randn(2, 4, 4, 4))  # smaller: covered
    with pytest.raises(ValueError, match="sized for 6x6"):
        layer(torch.randn(2, 4, 8, 8))
    fresh = CPLConv(4, 4, 3, 1)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.u.shape == (1, 4, 6, 6)
    layer.eval(), fresh.eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        assert torch.equal(layer(x), fresh(x))
    with pytest.raises(ValueError, match="forward pass"):
        CPLConv(4, 4, 3, 1).eval().lipschitz_upper_bound()


def test_training_step_updates_u_and_gradients_reach_the_filter():
    layer = CPLConv(4, 4, 3, 1)
    x = torch.randn(2, 4, 6, 6)
    layer(x)
    u1 = layer.u.clone()
    layer(x).sum().backward()
    assert not torch.equal(u1, layer.u)
    assert layer.kernel.grad is not None and float(layer.kernel.grad.abs().sum()) > 0


@pytest.mark.parametrize("eval_step", ["verified", "authors"])
def test_conformance_checks_pass(eval_step):
    reports = check_conv_spec(plugin.cpl_spec(), params={"eval_step": eval_step})
    assert len(reports) == 7 and all(r.sigma_max <= r.bound * (1 + 1e-12) for r in reports)


class _EstimateBound(CPLConv):
    """Deliberately wrong: certifies with the power-iteration estimate (the study's claim of 1)
    after a single power step, so that the estimate is still far below ‖W‖."""

    def eval_state(self):
        import lipcli_cpl.core as core

        with torch.no_grad():
            u, v = core.power_steps(self.u, self.kernel, 1, 1e-12)
            return u, v, core.rescaling(u, v, self.kernel)

    def lipschitz_upper_bound(self) -> float:
        return 1.0


def test_certifying_with_the_estimate_is_caught():
    def factory(*args):
        torch.manual_seed(11)
        return randomise_parameters(_EstimateBound(*args, eval_step="authors"), seed=4)
    wrong = ConvSpec(name="cpl-estimate", factory=factory, description="CPL certified with its estimate")
    with pytest.raises(AssertionError, match="bound"):
        check_conv_spec(wrong, cases=[(4, 4, 3, 1, 6)])


@pytest.mark.parametrize("cin, cout, k, stride, n", [(4, 4, 3, 1, 6), (4, 16, 3, 2, 6), (8, 4, 1, 1, 3)])
def test_export_stand_in_equals_the_eval_layer(cin, cout, k, stride, n):
    layer = randomise_parameters(CPLConv(cin, cout, k, stride).double(), seed=n)
    layer(torch.randn(1, cin, n, n, dtype=torch.float64))
    layer.eval()
    check_export_module(layer, ExportedCPL, torch.randn(3, cin, n, n, dtype=torch.float64))
    dense = randomise_parameters(CPLLinear(5).double(), seed=1).eval()
    check_export_module(dense, ExportedCPLLinear, torch.randn(3, 5, dtype=torch.float64))
