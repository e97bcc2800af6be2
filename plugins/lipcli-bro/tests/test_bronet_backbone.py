"""The BRONet backbone's quasi-residual BRO filter and centring (:mod:`lipcli_bro.backbone`,
``bronet:quasi_residual=true,centering=true``): the authors' parameters, unfolded, give the
authors' logits; the dense float64 Jacobian stays under the guaranteed bound in training
(batch map) and evaluation; the bound follows ``γ``; the defaults are the old network."""

from __future__ import annotations

import json

import pytest
import torch
from bro_fixture_data import DATA, inputs, record

from lipcli.testing import create_model, guaranteed_upper_bound
from lipcli_bro.backbone import Centering, QuasiResidualBRO
from lipcli_bro.bro import BROConv

ARCH = "bronet:depth=2,width=4,stem_kernel=5,neck_patch=4,dense=2,dense_width=16"
AUTHORS = ARCH + ",quasi_residual=true,centering=true"


#: with the dense layers' quasi-residual parametrisation too: every trained piece as the authors'
AUTHORS_DENSE = AUTHORS + ",dense_quasi_residual=true"


def _model(arch: str = AUTHORS, conv: str = "bro:rank=2,border=zero", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model(arch, conv=conv, head="lln", num_classes=10, mean=(0.5, 0.5, 0.5), std=(1.0, 1.0, 1.0))


def _unfolded_authors_model(dense: bool = False) -> torch.nn.Module:
    """The authors' checkpoint ``bronet_d2_w4_c10`` (trained three steps with their centring)
    loaded parameter by parameter: ``W`` (flipped: their convolution is lipcli's correlation),
    ``γ``, the block bias as the centring's ``β`` and the running mean, nothing folded; with
    ``dense`` the dense layers' ``W`` and ``γ`` too (else their ``X = I + W·γ·n^-1/2`` folded)."""
    sd = torch.load(DATA / "bronet_d2_w4_c10.pt", weights_only=True)["backbone"]
    model = _model(AUTHORS_DENSE if dense else AUTHORS, conv="bro:rank=2,border=zero,ridge=1e-7")
    state = model.state_dict()
    state.update({"body.stem_conv.weight": sd["stem.0.weight"], "body.stem_conv.bias": sd["stem.0.bias"],
                  "body.neck_conv.weight": sd["neck.kernel"], "body.neck_dense.weight": sd["neck.weight"],
                  "body.neck_dense.bias": sd["neck.bias"], "head.weight": sd["head.weight"],
                  "head.bias": sd["head.bias"]})
    X = sd["linear.identity"] + sd["linear.weights"] * sd["linear.gamma"] * 2 ** -0.5
    for j in range(2):
        state[f"body.dense{j + 1}.weight"] = sd["linear.weights"][j] if dense else X[j]
        state[f"body.dense{j + 1}.bias"] = sd["linear.bias"][j]
        if dense:
            state[f"body.dense{j + 1}.gamma"] = sd["linear.gamma"][j]
    for i in range(2):
        b = f"body.block{i + 1}_"
        state[b + "conv.weight"] = sd["conv.weights"][i].flip(-1, -2)
        state[b + "conv.gamma"] = sd["conv.gamma"][i]
        state[b + "center.bias"] = sd["conv.bias"][i]
        state[b + "center.running_mean"] = sd["conv.running_mean"][i]
    model.load_state_dict(state)
    for i in range(2):  # their V₀ is ours (a constant, not loaded)
        assert torch.equal(model.body.get_submodule(f"block{i + 1}_conv").identity, sd["conv.identity"].flip(-1, -2))
    return model.eval()


@pytest.mark.parametrize("dense", [False, True])
def test_the_authors_parameters_unfolded_give_their_logits(dense):
    rec = record("bronet_d2_w4_c10")
    model = _unfolded_authors_model(dense)
    with torch.no_grad():
        logits = model(inputs(rec))
    expected = torch.tensor(rec["logits"])
    assert float((logits - expected).abs().max()) < 1e-5 * float(expected.abs().max())
    # and each piece matters: γ as 1 (their trained γ is not) or the running mean as 0
    for name in ("block1_conv.gamma", "block1_center.running_mean"):
        model = _unfolded_authors_model()
        with torch.no_grad():
            tensor = model.body.get_parameter(name) if "gamma" in name else model.body.get_buffer(name)
            tensor.fill_(1.0 if "gamma" in name else 0.0)  # in place: the caches must notice
            assert float((model(inputs(rec)) - expected).abs().max()) > 1e-4, name


def test_layout_and_parametrisation():
    model = _model()
    names = list(model.body._modules)
    assert names[3:9] == ["block1_conv", "block1_center", "block1_act", "block2_conv", "block2_center", "block2_act"]
    block = model.body.block1_conv
    assert isinstance(block, QuasiResidualBRO) and block.scale == 2 ** -0.5
    assert block.lip_component["name"] == "bro" and not block.bias.requires_grad
    V0 = torch.zeros(4, 2, 3, 3)
    V0[[0, 1], [0, 1], 1, 1] = 1.0
    assert torch.equal(block.identity, V0) and torch.equal(block.gamma, torch.ones(4, 1, 1, 1))
    assert "body.block1_conv.identity" not in model.state_dict()  # a constant, not stored
    torch.testing.assert_close(block.filter(), V0 + block.weight * block.gamma * 2 ** -0.5)
    # the authors' start: W ~ N(0, 1)/(c·9), far below the identity
    assert 0.0 < float(block.weight.detach().abs().max()) < 6.0 / 36


def test_defaults_are_the_old_network():
    model = _model(ARCH)
    assert not any(isinstance(m, (QuasiResidualBRO, Centering)) for m in model.modules())
    assert type(model.body.block1_conv) is BROConv
    assert not any("gamma" in k or "center" in k for k in model.state_dict())


def test_needs_bro():
    with pytest.raises(ValueError, match="use --conv bro"):
        create_model(AUTHORS, conv="soc-fast", head="lln", num_classes=10)


def _move(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Far from the start: large ``W``, ``γ`` of mixed signs, running means and ``β`` moved."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * (3.0 if name.endswith("conv.weight") else 0.3))
        for m in model.modules():
            if isinstance(m, QuasiResidualBRO):
                m.gamma.mul_(torch.tensor([2.0, -0.5, 1.5, -3.0]).view(-1, 1, 1, 1))
            if isinstance(m, Centering):
                m.running_mean.normal_(generator=gen)
    return model.double()


def _batch_norm(model: torch.nn.Module, n: int) -> float:
    x = torch.rand(n, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    J = torch.autograd.functional.jacobian(lambda v: model.features(v.view_as(x)).flatten(), x.flatten())
    return float(torch.linalg.matrix_norm(J, 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_dense_jacobian_under_the_bound_in_train_and_eval(seed):
    model = _move(_model(seed=seed), seed)
    model.eval()
    model.features(torch.rand(1, 3, 32, 32, dtype=torch.float64))  # the BRO layers record their size
    bound = guaranteed_upper_bound(model)[0]
    assert _batch_norm(model, 1) <= bound
    model.train()  # the centring couples the images: the Jacobian of the whole batch's map
    for n in (1, 2):
        assert _batch_norm(model, n) <= bound


def test_centring_in_training_and_evaluation():
    torch.manual_seed(3)
    center = Centering(3).double()
    with torch.no_grad():
        center.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    z = torch.randn(4, 3, 5, 5, dtype=torch.float64) + torch.tensor([3.0, -2.0, 0.0]).view(1, 3, 1, 1)
    y = center.train()(z)
    torch.testing.assert_close(y.mean(dim=(0, 2, 3)), center.bias.detach())
    torch.testing.assert_close(center.running_mean, 0.1 * z.mean(dim=(0, 2, 3)))
    y = center.eval()(z)
    torch.testing.assert_close(y, z + (center.bias - center.running_mean).detach().view(1, 3, 1, 1))
    torch.testing.assert_close(center.export_module()(z), y)


def test_bound_follows_gamma():
    model = _move(_model(), 5).eval()
    model.features(torch.rand(1, 3, 32, 32, dtype=torch.float64))
    block = model.body.block1_conv
    before = block.lipschitz_upper_bound()
    op = block.eval_operator(block.bound_size())
    with torch.no_grad():
        block.gamma.mul_(4.0)  # in place: the caches must notice
    assert not torch.equal(block.eval_operator(block.bound_size()), op)
    after = block.lipschitz_upper_bound()
    assert after == block.operator_bound(block.eval_operator(block.bound_size()), block.bound_size())
    assert before >= 1.0 - 1e-9 and after >= 1.0 - 1e-9 and _batch_norm(model, 1) <= guaranteed_upper_bound(model)[0]


@pytest.mark.parametrize("dense", [False, True])
def test_training_forward_is_the_authors(dense):
    """One training-mode forward (centring on the batch mean) gives the logits and running
    means the authors' ``BRONet.train()`` forward gave on the same checkpoint and inputs
    (``tools/make_import_fixtures_bronet.py train-forward``)."""
    rec = json.loads((DATA / "bronet_d2_w4_c10.train.json").read_text())
    model = _unfolded_authors_model(dense).train()
    with torch.no_grad():
        logits = model(inputs(rec))
    expected = torch.tensor(rec["train_logits"])
    assert float((logits - expected).abs().max()) < 1e-5 * float(expected.abs().max())
    means = torch.stack([model.body.block1_center.running_mean, model.body.block2_center.running_mean])
    torch.testing.assert_close(means, torch.tensor(rec["running_mean_after"]), rtol=1e-5, atol=1e-6)
    # the eval-mode logits differ: the batch mean is not the running mean
    assert float((model.eval()(inputs(rec)).detach() - expected).abs().max()) > 1e-4


def test_dense_quasi_residual_layers():
    """``X = I + (W ⊙ γ)·n^-1/2`` with the authors' start; the bound covers the dense Jacobian
    after γ and W move; off by default (the old layers and state)."""
    from lipcli_liresnet.cholesky import CholeskyLinear

    model = _model(AUTHORS_DENSE)
    layer = model.body.dense1
    assert isinstance(layer, CholeskyLinear) and layer.quasi_residual_scale == 2 ** -0.5
    assert torch.equal(layer.gamma, torch.ones(16, 1)) and "body.dense1.gamma" in model.state_dict()
    assert "body.dense1.identity" not in model.state_dict()  # a constant, not stored
    torch.testing.assert_close(layer.source(), torch.eye(16) + layer.weight * layer.gamma * 2 ** -0.5)
    assert model.body.neck_dense.quasi_residual_scale is None  # the neck's dense layer is plain, as theirs
    assert _model().body.dense1.quasi_residual_scale is None
    moved = _move(_model(AUTHORS_DENSE, seed=3), 3).eval()
    with torch.no_grad():
        moved.body.dense1.gamma.mul_(torch.linspace(-3.0, 3.0, 16, dtype=torch.float64).view(-1, 1))
    moved.features(torch.rand(1, 3, 32, 32, dtype=torch.float64))
    assert _batch_norm(moved, 1) <= guaranteed_upper_bound(moved)[0]
    with pytest.raises(ValueError, match="square"):
        CholeskyLinear(4, 6, quasi_residual_scale=0.5)
