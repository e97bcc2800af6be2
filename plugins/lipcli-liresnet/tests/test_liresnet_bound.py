"""The guaranteed bounds of lipcli-liresnet against dense float64 Jacobians: the Fourier bound
of a zero-padded convolution (≥ its norm, and within 1e-5 of the circular convolution's norm,
which it computes), the residual block ``x + W ∗ x`` and whole networks (several random
initialisations, large residual weights, and after a few SGD steps)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.testing import create_model, guaranteed_upper_bound, plugin_registry
from lipcli_liresnet import plugin as liresnet_plugin
from lipcli_liresnet.fourier import zero_padded_conv_norm_upper_bound
from lipcli_liresnet.residual import ResidualConv


def registry():
    extra = [("liresnet", liresnet_plugin)]
    for name, module in (("aol", "lipcli_aol.plugin"), ("cayley", "lipcli_cayley.plugin"),
                         ("bcop", "lipcli_bcop.plugin")):
        try:
            extra.append((name, __import__(module, fromlist=["plugin"])))
        except ImportError:
            pass
    return plugin_registry(*extra)


def dense_norm(fn, shape) -> float:
    """Spectral norm of the float64 Jacobian of ``fn`` at a random point (exact for linear
    maps)."""
    x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    J = torch.autograd.functional.jacobian(lambda v: fn(v.view(shape)).flatten(), x.flatten())
    return float(torch.linalg.matrix_norm(J, 2))


@pytest.mark.parametrize("o,i,k,n,m", [(3, 3, 3, 5, 5), (4, 2, 3, 6, 4), (2, 5, 3, 4, 4),
                                       (3, 3, 5, 6, 6), (3, 3, 1, 3, 3)])
def test_fourier_bound_dominates_and_is_the_circular_norm(o, i, k, n, m):
    gen = torch.Generator().manual_seed(o + 10 * i + n)
    K = torch.randn(o, i, k, k, generator=gen, dtype=torch.float64)
    p = k // 2
    bound = zero_padded_conv_norm_upper_bound(K, (n, m))
    exact = dense_norm(lambda x: F.conv2d(x, K, padding=p), (1, i, n, m))
    N, M = n + k - 1, m + k - 1
    circular = dense_norm(lambda x: F.conv2d(F.pad(x, (p, p, p, p), mode="circular"), K), (1, i, N, M))
    assert bound >= exact
    assert bound >= circular and bound <= circular * (1 + 1e-5)


def test_fourier_bound_refuses_bad_filters():
    with pytest.raises(ValueError):
        zero_padded_conv_norm_upper_bound(torch.ones(2, 2, 2, 2), (4, 4))
    with pytest.raises(ValueError):
        zero_padded_conv_norm_upper_bound(torch.full((2, 2, 3, 3), float("nan")), (4, 4))


@pytest.mark.parametrize("scale", [1.0, 30.0, -30.0])
def test_residual_block_bound(scale):
    torch.manual_seed(int(abs(scale)))
    block = ResidualConv(3, (5, 5), init_scale=scale).double()
    exact = dense_norm(block, (1, 3, 5, 5))
    bound = block.lipschitz_upper_bound()
    assert exact <= bound <= exact * 1.5  # the zero-padded norm is below the torus norm
    assert block.lipschitz_estimate(iters=200) <= bound
    # the cache follows the weights
    with torch.no_grad():
        block.weight.mul_(2.0)
    assert block.lipschitz_upper_bound() >= dense_norm(block, (1, 3, 5, 5))


def test_residual_training_estimate_is_differentiable_and_converges():
    torch.manual_seed(0)
    block = ResidualConv(3, (5, 5), init_scale=20.0).double()
    block.refresh(300)
    value = block.train().training_lipschitz()
    value.backward()
    assert block.weight.grad is not None and block.weight.grad.abs().sum() > 0
    exact = dense_norm(block, (1, 3, 5, 5))
    assert abs(float(value.detach()) - exact) <= 1e-6 * exact


def features_norm(model) -> float:
    body = model.body
    x = torch.rand(1, model.in_channels, *model.image_size, dtype=torch.float64,
                   generator=torch.Generator().manual_seed(7))
    J = torch.autograd.functional.jacobian(lambda v: body(v.view_as(x)).flatten(), x.flatten())
    return float(torch.linalg.matrix_norm(J, 2))


@pytest.mark.parametrize("conv,block,head", [
    ("soc-fast", "residual", "lln"), ("soc", "conv", "lln"), ("aol", "residual", "mlp"),
    ("cayley", "residual", "lln"), ("bcop", "conv", "lln"),
])
def test_network_bound_dominates_the_jacobian(conv, block, head):
    reg = registry()
    if conv not in reg.names("conv"):
        pytest.skip(f"{conv} not available")
    for seed in range(2):
        torch.manual_seed(seed)
        model = create_model("liresnet", conv=conv, head=head, depth=2, width=2, dense=1,
                             block=block, num_classes=4, registry=reg)
        for module in model.modules():
            if isinstance(module, ResidualConv):
                with torch.no_grad():
                    module.weight.mul_(40.0)  # make the residual factors matter
        model = model.double().eval()
        with torch.no_grad():
            model(torch.zeros(1, 3, 32, 32, dtype=torch.float64))  # Cayley records its image size
        bound = guaranteed_upper_bound(model)[0]
        assert features_norm(model) <= bound
    # a few SGD steps
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.rand(4, 3, 32, 32, dtype=torch.float64, generator=gen)
        loss = F.cross_entropy(model(x), torch.tensor([0, 1, 2, 3]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert features_norm(model) <= guaranteed_upper_bound(model)[0]


def test_layout_sizes_and_heads():
    reg = registry()
    model = create_model("liresnet", depth=3, width=4, dense=2, num_classes=10, registry=reg)
    names = [n for n, _ in model.body.named_children()]
    assert names[:3] == ["normalize", "stem_conv", "stem_act"]
    assert sum(n.endswith("_res") for n in names) == 3 and model.feature_dim == 32
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    mlp = create_model("liresnet", head="mlp", depth=1, width=4, dense=1, num_classes=10, registry=reg)
    assert mlp.feature_dim == 64 and mlp(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    big = create_model("liresnet", depth=1, width=2, dense=0, image_size=(64, 64), num_classes=3, registry=reg)
    assert "stem_down1" in names + [n for n, _ in big.body.named_children()]
    assert big(torch.rand(1, 3, 64, 64)).shape == (1, 3)
    with pytest.raises(ValueError, match="32·2\\^k"):
        create_model("liresnet", depth=1, width=2, image_size=(48, 48), registry=reg)
    with pytest.raises(ValueError, match="depth"):
        create_model("liresnet", depth=0, registry=reg)
    with pytest.raises(ValueError):
        model(torch.rand(1, 3, 64, 64))
