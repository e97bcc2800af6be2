"""The guaranteed bounds of lipcli-liresnet against dense float64 Jacobians (the Fourier bound
of a zero-padded convolution has its own tests: tests/numerics/test_conv_fourier.py): the residual block ``x + W ∗ x`` and whole networks (several random
initialisations, large residual weights, and after a few SGD steps)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.testing import create_model, guaranteed_upper_bound, plugin_registry
from lipcli_liresnet import plugin as liresnet_plugin
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
    # each training call advances the kept vector by the authors' num_lc_iter = 10 steps
    fresh = ResidualConv(3, (5, 5), init_scale=20.0).double().train()
    v0 = fresh.power_v.clone()
    fresh.training_lipschitz()
    assert fresh.power_steps == 10
    assert torch.allclose(fresh.power_v, fresh._power_steps(v0.clone(), 10), rtol=0, atol=1e-14)
    assert not torch.allclose(fresh.power_v, fresh._power_steps(v0.clone(), 1), rtol=0, atol=1e-6)


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


def authors_block(width=3, size=(5, 5), seed=0):
    """A block with the authors' options, large weights and γ of mixed signs and sizes."""
    torch.manual_seed(seed)
    block = ResidualConv(width, size, init_scale=30.0, gamma=True, scale=2 ** -0.5 * 1.1,
                         centering=True).double()
    with torch.no_grad():
        block.gamma.copy_(torch.tensor([1.5, -0.7, 3.0, 0.2][:width], dtype=torch.float64))
        block.running_mean.copy_(torch.randn(width, dtype=torch.float64))
    return block


def test_block_with_gamma_scale_and_centring_train_and_eval_bounds():
    block = authors_block()
    # evaluation: the running mean is a constant shift; the bound is ‖I + W_eff‖ on one image
    block.eval()
    exact_eval = dense_norm(block, (1, 3, 5, 5))
    eval_bound = block.lipschitz_upper_bound()
    assert exact_eval <= eval_bound <= exact_eval * 1.5
    x = torch.rand(2, 3, 5, 5, dtype=torch.float64)
    w_eff = block.weight * block.gamma.view(-1, 1, 1, 1) * block.scale
    torch.testing.assert_close(block(x), x + F.conv2d(x, w_eff, block.bias - block.running_mean, padding=1))
    # training: a map of the whole batch (the mean couples the images); dense Jacobian over batches
    block.train()
    for n in (1, 3):
        exact_train = dense_norm(block, (n, 3, 5, 5))
        assert exact_train <= block.lipschitz_upper_bound()
    assert block.lipschitz_upper_bound() >= eval_bound  # √(L² + 1) or 1 + ‖W_eff‖
    # the training map centres per channel over batch and pixels: the branch's mean is b
    y = block(x) - x
    torch.testing.assert_close(y.mean(dim=(0, 2, 3)), block.bias.detach(), rtol=0, atol=1e-12)


def test_centring_can_exceed_the_eval_norm_and_the_bound_still_holds():
    """The train-mode batch map of a 1-channel block on 2 pixels with the antisymmetric branch
    [[0, t], [−t, 0]] has norm² (3 + √5)/2 > 2 = ‖I + W‖² at t = 1 (worked out in the module
    docstring's terms): the train-mode bound must be above the eval one."""
    block = ResidualConv(1, (1, 2), centering=True).double()
    with torch.no_grad():
        block.weight.zero_()
        block.weight[0, 0, 1, 2] = 1.0   # reads the right neighbour: +t
        block.weight[0, 0, 1, 0] = -1.0  # reads the left neighbour: −t
    block.train()
    exact = dense_norm(block, (1, 1, 1, 2))
    assert abs(exact ** 2 - (3 + 5 ** 0.5) / 2) < 1e-12
    assert exact > 2 ** 0.5 and exact <= block.lipschitz_upper_bound()
    block.eval()
    assert abs(dense_norm(block, (1, 1, 1, 2)) - 2 ** 0.5) < 1e-12
    assert 2 ** 0.5 <= block.lipschitz_upper_bound()


@pytest.mark.parametrize("n", [1, 3])
def test_centring_of_a_nearly_cancelling_branch(n):
    """``W = −0.9·I``: evaluation is ``0.1·x`` (norm 0.1), training is ``0.1·X + 0.9·P X``
    (norm 1: the batch mean passes whole), so the train-mode bound must be about 1, not ``L``;
    ``√(L² + 1)`` is within 1 % of it."""
    block = ResidualConv(2, (3, 3), centering=True).double()
    with torch.no_grad():
        block.weight.zero_()
        block.weight[:, :, 1, 1] = -0.9 * torch.eye(2, dtype=torch.float64)
    block.eval()
    L = block.lipschitz_upper_bound()
    assert abs(dense_norm(block, (1, 2, 3, 3)) - 0.1) < 1e-12 and L < 0.11
    block.train()
    exact = dense_norm(block, (n, 2, 3, 3))
    assert abs(exact - 1.0) < 1e-12
    assert exact <= block.lipschitz_upper_bound() <= 1.01


def test_bound_follows_gamma():
    block = authors_block().eval()
    before = block.lipschitz_upper_bound()
    with torch.no_grad():
        block.gamma.mul_(3.0)  # in place: the cache must notice
    after = block.lipschitz_upper_bound()
    assert after != before and after >= dense_norm(block, (1, 3, 5, 5))
    # an optimiser step on γ alone
    block.weight.requires_grad_(False)
    opt = torch.optim.SGD([block.gamma], lr=1.0)
    block(torch.rand(2, 3, 5, 5, dtype=torch.float64)).pow(2).sum().backward()
    opt.step()
    assert block.lipschitz_upper_bound() != after
    assert block.lipschitz_upper_bound() >= dense_norm(block, (1, 3, 5, 5))
    block.train()  # the mode is part of the cache key
    assert block.lipschitz_upper_bound() >= dense_norm(block, (2, 3, 5, 5))


def test_default_block_is_the_plain_residual():
    """Defaults: no γ, no scale, no centring: the same parameters and buffers and exactly
    ``x + W ∗ x + b`` in both modes (bit-identical)."""
    torch.manual_seed(4)
    block = ResidualConv(3, (5, 5), init_scale=5.0)
    assert set(block.state_dict()) == {"weight", "bias", "power_v"}
    assert block.effective_weight() is block.weight
    x = torch.rand(2, 3, 5, 5)
    with torch.no_grad():
        block.bias.normal_()
    plain = x + F.conv2d(x, block.weight, block.bias, padding=1)
    assert torch.equal(block.train()(x), plain) and torch.equal(block.eval()(x), plain)


def batch_features_norm(model, n) -> float:
    x = torch.rand(n, model.in_channels, *model.image_size, dtype=torch.float64,
                   generator=torch.Generator().manual_seed(8))
    J = torch.autograd.functional.jacobian(lambda v: model.body(v.view_as(x)).flatten(), x.flatten())
    return float(torch.linalg.matrix_norm(J, 2))


@pytest.mark.parametrize("conv", ["aol", "soc-fast"])
def test_network_with_the_authors_block_train_and_eval(conv):
    reg = registry()
    if conv not in reg.names("conv"):
        pytest.skip(f"{conv} not available")
    torch.manual_seed(1)
    model = create_model("liresnet", conv=conv, depth=2, width=2, dense=1, num_classes=4, registry=reg,
                         gamma=True, depth_scale=True, centering=True)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, ResidualConv):
                module.weight.mul_(40.0)
                module.gamma.copy_(torch.tensor([2.0, -0.5]))
    model = model.double()
    if conv == "aol":  # exactly 1-Lipschitz in both modes: the train-mode product is a bound
        model.train()
        assert batch_features_norm(model, 2) <= guaranteed_upper_bound(model)[0]
    model.train()(torch.rand(4, 3, 32, 32, dtype=torch.float64))  # running means move
    model.eval()
    assert any(float(m.running_mean.abs().max()) > 0 for m in model.modules() if isinstance(m, ResidualConv))
    assert features_norm(model) <= guaranteed_upper_bound(model)[0]


def test_authors_shapes_layout_and_bound():
    reg = registry()
    torch.manual_seed(2)
    model = create_model("liresnet", depth=2, width=2, dense=2, num_classes=4, registry=reg, stem_kernel=5,
                         neck="patch", dense_width=12, features="act")
    names = [n for n, _ in model.body.named_children()]
    assert names[names.index("block2_act") + 1:] == [
        "neck_patch", "neck_conv", "to_vector", "neck_dense", "neck_act",
        "dense1", "dense1_act", "dense2", "features_act", "flatten"]
    assert model.feature_dim == 12 and model.body.stem_conv.kernel_size == 5
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 4)
    # the patch neck is a 4x4 stride-4 convolution: pixel_unshuffle then 1x1
    x = torch.rand(1, 2, 16, 16)
    assert model.body.neck_patch(x).shape == (1, 32, 4, 4)
    model = model.double().eval()
    assert features_norm(model) <= guaranteed_upper_bound(model)[0]
    wide = create_model("liresnet", depth=1, width=2, dense=1, dense_width=20, num_classes=4, registry=reg)
    assert wide.feature_dim == 10 and wide(torch.rand(1, 3, 32, 32)).shape == (1, 4)
    with pytest.raises(ValueError, match="dense_width"):
        create_model("liresnet", depth=1, width=2, dense=0, dense_width=20, registry=reg)


def test_cholesky_layers_train_and_eval():
    """``layers=cholesky`` (the authors' trained layer types): free stem, Cholesky neck and
    quasi-residual Cholesky dense layers; the dense float64 Jacobian stays under the bound in
    training (the batch map, centring on) and evaluation after the parameters move, and the
    training estimate counts the stem by its power iteration (differentiable, below its bound)."""
    from lipcli_liresnet.cholesky import CholeskyLinear, CholeskyPatchConv
    from lipcli_liresnet.free_conv import FreeConv

    reg = registry()
    torch.manual_seed(3)
    model = create_model("liresnet", depth=2, width=2, dense=2, num_classes=4, registry=reg, stem_kernel=5,
                         neck="patch", dense_width=12, features="act", layers="cholesky",
                         gamma=True, depth_scale=True, centering=True)
    names = [n for n, _ in model.body.named_children()]
    assert names[names.index("block2_act") + 1:] == [
        "neck_conv", "neck_flatten", "neck_dense", "neck_act", "dense1", "dense1_act", "dense2", "to_vector",
        "features_act", "flatten"]
    body = model.body
    assert isinstance(body.stem_conv, FreeConv) and isinstance(body.neck_conv, CholeskyPatchConv)
    assert isinstance(body.neck_dense, CholeskyLinear) and body.neck_dense.quasi_residual_scale is None
    assert body.dense1.quasi_residual_scale == body.dense2.quasi_residual_scale == 2 ** -0.5
    with torch.no_grad():
        body.stem_conv.weight.mul_(5.0)  # a stem far from norm 1, so that its factor shows
    estimate = model.lipschitz_training_estimate()
    assert estimate.requires_grad
    # the product of the factors the call used: in eval mode the blocks' estimates read their
    # kept vectors without advancing them, and the stem's is ‖conv(v)‖ of its kept vector
    model.eval()
    parts = body.normalize.lipschitz_upper_bound()
    for m in body:
        if isinstance(m, ResidualConv):
            parts *= float(m.training_lipschitz().detach())
    stem = float(torch.nn.functional.conv2d(body.stem_conv.power_v, body.stem_conv.weight.detach(), stride=2, padding=2).norm())
    assert abs(float(estimate.detach()) - parts * stem) <= 1e-5 * float(estimate.detach())
    assert 2.0 <= stem <= body.stem_conv.lipschitz_upper_bound() * (1 + 1e-6)
    model.train()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model = model.double().train()
    assert batch_features_norm(model, 2) <= guaranteed_upper_bound(model)[0]
    model.eval()
    assert features_norm(model) <= guaranteed_upper_bound(model)[0]
    with pytest.raises(ValueError, match="neck=patch"):
        create_model("liresnet", depth=1, width=2, dense=1, layers="cholesky", registry=reg)
    # with block=conv the backbone stays the --conv component: only the stem is free
    conv_blocks = create_model("liresnet", depth=1, width=2, dense=1, dense_width=12, num_classes=4, registry=reg,
                               block="conv", neck="patch", layers="cholesky")
    assert not isinstance(conv_blocks.body.block1_conv, FreeConv) and isinstance(conv_blocks.body.stem_conv, FreeConv)


def test_block_bound_follows_writes_autograd_does_not_see():
    """A write through ``.data`` does not move the version counters: the cached bound is
    compared by value, so it is recomputed all the same."""
    torch.manual_seed(4)
    block = ResidualConv(3, (5, 5), init_scale=20.0).double()
    before = block.lipschitz_upper_bound()
    block.weight.data.mul_(10.0)
    after = block.lipschitz_upper_bound()
    assert after > 2 * before and after >= dense_norm(block, (1, 3, 5, 5))
