"""The eval lowering (lipcli.lowering.network, lipcli.sdk.lowering): the dense operators'
guaranteed bounds cover their float32 matrices, certified radii equal the series path's,
the network is cached per model and input shape, training is untouched."""

from __future__ import annotations

import pytest
import torch

from lipcli.builtins.soc.layer import SOC
from lipcli.host.models import create_model
from lipcli.host.plugins import get_registry
from lipcli.lipschitz.bound import guaranteed_upper_bound, lowered_upper_bound
from lipcli.lowering.caps import dense_max_bytes
from lipcli.lowering.network import lower_body, lowered_network
from lipcli.sdk.lowering import DenseOperator, LoweringContext, rounding_excess


def _trained_looking(layer: SOC, seed: int) -> SOC:
    torch.manual_seed(seed)
    with torch.no_grad():
        layer.weight.mul_(3.0)
        layer.bias.normal_()
    layer.refresh(50)
    return layer.eval()


@pytest.mark.parametrize("cin,cout,stride,side", [(4, 4, 1, 4), (4, 8, 2, 4), (8, 8, 1, 2), (8, 4, 1, 1)])
def test_dense_bound_covers_the_float32_matrix(cin: int, cout: int, stride: int, side: int) -> None:
    layer = _trained_looking(SOC(cin, cout, stride=stride), seed=cin + side)
    shape = (cin, side, side)
    dense = layer.export_module(LoweringContext(shape, 2**30))
    if not isinstance(dense, DenseOperator):
        pytest.skip("not cheaper as a matrix at this size")
    bound = layer.lipschitz_upper_bound() + dense.bound_excess
    norm = float(torch.linalg.matrix_norm(dense.matrix.double(), ord=2))
    assert norm <= bound
    # the excess is the float32 rounding of a norm-1 matrix: tiny, not a loose 1e-3
    assert 0 < dense.bound_excess < 1e-5
    # and the dense operator is the layer (float rounding only)
    x = torch.randn(5, *shape)
    with torch.no_grad():
        assert torch.allclose(dense(x), layer(x), rtol=1e-5, atol=1e-5)


def test_rounding_excess_bounds_the_spectral_norm_of_the_rounding_error() -> None:
    torch.manual_seed(0)
    m64 = torch.linalg.qr(torch.randn(200, 200, dtype=torch.float64))[0]
    m32 = m64.float()
    exact = float(torch.linalg.matrix_norm(m32.double() - m64, ord=2))
    excess = rounding_excess(m64, m32)
    assert exact <= excess <= 2**-24 * float(m64.norm()) * 1.01


def _radii(model: torch.nn.Module, network: torch.nn.Module, lipschitz: float, x: torch.Tensor) -> torch.Tensor:
    reg = get_registry()
    name = reg.get("head", model.lipcli_config["head"]["name"]).certificate
    certifier = reg.component("certificate", name).build()
    with torch.no_grad():
        y = network.features(x)
    return certifier.certify(model.head, y).radius.double() / lipschitz


@pytest.mark.usefixtures("memo_soc_build")  # repeated builds of the same layers
# depth 10 has what depth 20 has (stride-1 3x3 convs inside the blocks, 1x1 convs after the
# last): depth 20 only in the slow suite
@pytest.mark.parametrize("depth,head,classes", [
    (5, "lln", 10), (5, "mlp", 10), (10, "lln", 10), (5, "lln", 100),
    pytest.param(20, "lln", 10, marks=pytest.mark.slow),
])
def test_lowered_radii_equal_the_series_radii(depth: int, head: str, classes: int) -> None:
    torch.manual_seed(depth + classes)
    model = create_model(f"lipconvnet-{depth}", width=4, num_classes=classes,
                         head=head + (":hidden=32" if head == "mlp" else "")).eval()
    with torch.no_grad():
        for p in model.head.parameters():
            p.mul_(4.0)
    lowered = lowered_network(model)
    assert lowered.dense_layers, "a small-image layer should run as a matrix"
    series = lowered_network(model, series=True)
    assert not series.dense_layers and series.body is model.body
    l_series = guaranteed_upper_bound(model)[0]
    l_lowered = lowered_upper_bound(model, lowered)[0]
    assert l_series <= l_lowered <= l_series * (1 + 1e-5)
    x = torch.rand(16, 3, 32, 32)
    r_series = _radii(model, series, l_series, x)
    r_lowered = _radii(model, lowered, l_lowered, x)
    scale = float(r_series.abs().max())
    assert scale > 0
    assert float((r_lowered - r_series).abs().max()) <= 1e-5 * scale


@pytest.mark.usefixtures("memo_soc_build")  # repeated builds of the same layers
def test_lowered_network_is_cached_per_shape_and_weights() -> None:
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4).eval()
    first = lowered_network(model)
    assert lowered_network(model) is first
    assert lowered_network(model, dense_max_mib=0.0).dense_layers == []
    again = lowered_network(model)
    assert again is not first  # only the latest is kept
    assert lowered_network(model) is again
    layer = next(m for m in model.modules() if isinstance(m, SOC))
    with torch.no_grad():
        layer.bias.add_(1.0)
    assert lowered_network(model) is not again  # a changed parameter builds it again
    model.train()
    with pytest.raises(Exception, match="eval mode"):
        lowered_network(model)


def test_lowering_leaves_the_model_state_untouched() -> None:
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lowered_network(model)
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.usefixtures("memo_soc_build")  # the plain body lowers the same layers again
def test_lowered_bound_covers_the_float64_jacobian_of_the_network() -> None:
    """The guaranteed bound of the operator that runs (dense float32 matrices where lowered,
    the literal series elsewhere) is >= the spectral norm of that operator's Jacobian,
    evaluated in float64 on the float32 matrices and filters cast exactly (the MaxMin
    activations are permutations at a point, so the norm is close to the bound)."""
    import copy

    torch.manual_seed(1)
    model = create_model("lipconvnet-5", width=4).eval()
    network = lowered_network(model)
    assert network.dense_layers
    plain, _ = lower_body(model, (3, 32, 32), dense_max_bytes(network.dense_max_mib), plain=True)
    plain = copy.deepcopy(plain).double().eval()
    assert sorted(n for n, m in plain.named_children() if isinstance(m, DenseOperator)) == network.dense_layers
    bound = lowered_upper_bound(model, network)[0]
    x = torch.rand(1, 3, 32, 32, dtype=torch.float64)
    J = torch.autograd.functional.jacobian(lambda v: plain(v.view(1, 3, 32, 32)).flatten(), x.flatten(),
                                           vectorize=True)
    norm = float(torch.linalg.matrix_norm(J, ord=2))
    assert norm <= bound
    assert norm >= 0.5 * bound  # a real check: the Jacobian comes close to the bound


@pytest.mark.usefixtures("memo_soc_build")  # repeated builds of the same layers
def test_pays_off_rule_and_the_inputs_it_is_sized_for() -> None:
    """A layer is lowered only where inputs x FLOP saved >= BUILD_FLOP_WEIGHT x build FLOP:
    few inputs -> every layer literal (same network as the series), many -> dense layers."""
    from lipcli.sdk.lowering import BUILD_FLOP_WEIGHT, pays_off

    assert pays_off(None, 10, 1, 10**12)
    budget = 100 * (10 - 1) // BUILD_FLOP_WEIGHT  # 100 inputs save 9 operations each
    assert 100 * 9 % BUILD_FLOP_WEIGHT == 0
    assert pays_off(100, 10, 1, budget)
    assert not pays_off(100, 10, 1, budget + 1)
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4).eval()
    assert lowered_network(model, inputs=10).dense_layers == []
    many = lowered_network(model, inputs=10**6).dense_layers
    assert many and many == lowered_network(model).dense_layers
    few = lowered_network(model, inputs=2000).dense_layers
    assert set(few) < set(many)  # only the cheapest builds pay off on 2,000 inputs
