"""Sandwich: the study's outputs from the same parameters (fixtures made by running its code,
``tools/make_layers_compared_fixtures.py``), the verified bound against float64 dense
Jacobians, conformance, export, a wrong layer caught, gradients at initialisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lipcli_sandwich.plugin as plugin
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import check_conv_spec, check_export_module, randomise_parameters
from lipcli.testing.conv import jacobian_singular_values, pair_ratio
from lipcli_sandwich import SandwichConv, SandwichFc
from lipcli_sandwich.export import ExportedSandwich

DATA = Path(__file__).resolve().parent / "data"
CONV_CASES = ["sandwich_conv_c4_c4_k3_n8", "sandwich_conv_c4_c6_k3_n6", "sandwich_conv_c6_c4_k3_n4_stable"]
FC_CASES = ["sandwich_fc_8_8", "sandwich_fc_8_5", "sandwich_fc_5_8_stable"]


def _fixture(case: str) -> tuple[dict, dict]:
    return load_file(str(DATA / f"{case}.safetensors")), json.loads((DATA / f"{case}.json").read_text())


def _load(layer, t) -> None:
    with torch.no_grad():
        for name in ("weight", "bias", "psi"):
            getattr(layer, name).copy_(t[name])
        layer.alpha.copy_(t["alpha"].reshape(()))


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_gives_the_studys_outputs(case):
    t, meta = _fixture(case)
    assert meta["commit"] == "01e3f2ad1f48ad749b2e91452c1d5869d3a6159a"
    layer = SandwichConv(meta["in"], meta["out"], meta["kernel"], 1, psi_in_bias=meta["numerical_stable"]).double()
    n = meta["size"]
    layer.spatial_size.copy_(torch.tensor([n, n]))
    _load(layer, t)
    layer.train()
    torch.testing.assert_close(layer(t["x_train"]), t["y_train"], rtol=1e-10, atol=1e-12)
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(t["x_eval"]), t["y_eval"], rtol=1e-10, atol=1e-12)


def test_alpha_starts_at_the_spectrum_norm_as_the_studys():
    t, meta = _fixture("sandwich_conv_c4_c4_k3_n8")
    layer = SandwichConv(4, 4, 3, 1).double()
    with torch.no_grad():
        layer.weight.copy_(t["weight"])
    layer(torch.zeros(1, 4, 8, 8, dtype=torch.float64))
    torch.testing.assert_close(layer.alpha.reshape(1), t["alpha"], rtol=1e-12, atol=0)


@pytest.mark.parametrize("case", FC_CASES)
def test_dense_gives_the_studys_outputs(case):
    """To 1e-6: the study's SandwichFc keeps ψ in float32 whatever the default dtype (its
    ``exp(±ψ)`` are float32), the fixture's other tensors are float64."""
    t, meta = _fixture(case)
    layer = SandwichFc(meta["in"], meta["out"], psi_in_bias=meta["numerical_stable"]).double()
    _load(layer, t)
    layer.train()
    torch.testing.assert_close(layer(t["x_train"]), t["y_train"], rtol=1e-6, atol=1e-6)
    layer.eval()
    with torch.no_grad():
        torch.testing.assert_close(layer(t["x_eval"]), t["y_eval"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("cin, cout, k, stride, n", [(4, 4, 3, 1, 6), (3, 5, 3, 1, 5), (4, 16, 3, 2, 6),
                                                    (8, 4, 3, 1, 4), (4, 4, 1, 1, 1), (2, 3, 5, 1, 7)])
def test_bound_covers_the_float64_dense_jacobian(stable, cin, cout, k, stride, n):
    torch.manual_seed(cin + n)
    layer = SandwichConv(cin, cout, k, stride, psi_in_bias=stable).double()
    layer(torch.zeros(1, cin, n, n, dtype=torch.float64))
    randomise_parameters(layer, seed=n + k).eval()
    bound = layer.lipschitz_upper_bound()
    gen = torch.Generator().manual_seed(2)
    shape = (cin, n, n)
    svals = jacobian_singular_values(layer, shape, torch.float64, gen, points=4)
    norm = max(max(float(v.max()) for v in svals), pair_ratio(layer, shape, gen))
    assert 0.05 < norm <= bound * (1 + 1e-12)
    assert bound <= 1 + 1e-9


def test_dense_bound_covers_the_jacobian():
    for stable in (False, True):
        layer = randomise_parameters(SandwichFc(6, 5, psi_in_bias=stable).double(), seed=3).eval()
        gen = torch.Generator().manual_seed(0)
        worst = 0.0
        for _ in range(8):
            x = 3 * torch.randn(1, 6, generator=gen, dtype=torch.float64)
            jac = torch.autograd.functional.jacobian(layer, x).reshape(5, 6)
            worst = max(worst, float(torch.linalg.matrix_norm(jac, ord=2)))
        assert 0.3 < worst <= layer.lipschitz_upper_bound() <= 1 + 1e-9


def test_float32_bound_is_just_above_one_and_other_sizes_are_refused():
    layer = SandwichConv(8, 8, 3, 1)
    layer(torch.randn(2, 8, 8, 8))
    layer.eval()
    assert 1.0 <= layer.lipschitz_upper_bound() < 1 + 1e-4
    with pytest.raises(ValueError, match="sized for 8x8"):
        layer(torch.randn(2, 8, 6, 6))


@pytest.mark.parametrize("stable", [False, True])
def test_conformance_checks_pass(stable):
    reports = check_conv_spec(plugin.sandwich_spec(), params={"psi_in_bias": stable})
    assert len(reports) == 7 and all(r.sigma_max <= r.bound * (1 + 1e-12) for r in reports)


class _NoCayley(SandwichConv):
    """Deliberately wrong: the raw (scaled) spectrum instead of its Cayley transform."""

    def compute_operators(self, size):
        from lipcli_sandwich.core import SQRT2, centred_spectrum

        wfft = centred_spectrum(self.weight, size)
        Q = 3 * wfft / wfft.norm() * wfft.shape[0] ** 0.5
        q = self.out_channels
        return Q, SQRT2 * Q[:, :, q:], SQRT2 * Q[:, :, :q].conj().transpose(1, 2)

    def lipschitz_upper_bound(self) -> float:
        return 1.0


def test_a_layer_without_cayley_is_caught():
    wrong = ConvSpec(name="sandwich-wrong", factory=_NoCayley, description="no Cayley")
    with pytest.raises(AssertionError, match="bound"):
        check_conv_spec(wrong, cases=[(4, 4, 3, 1, 6)])


@pytest.mark.parametrize("cin, cout, k, stride, n", [(4, 4, 3, 1, 6), (4, 16, 3, 2, 6), (4, 4, 1, 1, 1)])
def test_export_stand_in_equals_the_eval_layer(cin, cout, k, stride, n):
    layer = SandwichConv(cin, cout, k, stride).double()
    layer(torch.zeros(1, cin, n, n, dtype=torch.float64))
    randomise_parameters(layer, seed=n).eval()
    check_export_module(layer, ExportedSandwich, torch.randn(3, cin, n, n, dtype=torch.float64))


def test_gradients_reach_every_layer_of_a_stack():
    """[LC] Table 3 saw gradient norms fall by 1e6 from the head to the first Sandwich layer of
    their network; here a stack of 5 fresh layers at 8x8 keeps every layer's gradient within
    a factor 1e3 of the last one's (a regression guard, not a claim about deep networks)."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[SandwichConv(8, 8, 3, 1) for _ in range(5)])
    x = torch.rand(16, 8, 8, 8)
    layers(x).square().sum().backward()
    norms = [float(l.weight.grad.norm()) for l in layers]
    assert all(v > 0 for v in norms) and min(norms) > 1e-3 * norms[-1]
