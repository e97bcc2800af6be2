"""The EMMA loss: a hand-computed example, gradients against finite differences where the
clip factors are constant, the Lipschitz constants of logit differences from an LLN head and
the architecture's training estimate, training steps through a LiResNet, and the command line
refusing bad parameters with one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.losses import LossContext, TrainProgress, emma_logits, logit_difference_lipschitz
from lipcli.testing import check_component_spec, create_model, plugin_registry, read_model_metadata, registered, run_lip
from lipcli_liresnet import plugin as liresnet_plugin
from lipcli_liresnet.emma import emma_factory


def test_hand_computed_example():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0])
    K = torch.tensor([[0.0, 2.0, 1.0], [2.0, 0.0, 3.0], [1.0, 3.0, 0.0]], dtype=torch.float64)
    K2 = K.clone()
    K2[0, 2] = 2.0  # only the label rows are read: row 0 for both examples
    out = emma_logits(logits, labels, K2, eps=0.5, min_ratio=0.1)
    # example 1: margins 1, 2 against K 2, 2: radii 1/2·... ratios clip(1/(2·0.5)) = 1, clip(2/(2·0.5)) = 1
    # example 2: misclassified (margins -3, 0): ratios clipped to min_ratio 0.1
    expected = torch.tensor([[0.0, -1.0 + 1.0 * 0.5 * 2.0, -2.0 + 1.0 * 0.5 * 2.0],
                             [0.0, 3.0 + 0.1 * 0.5 * 2.0, 0.0 + 0.1 * 0.5 * 2.0]], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-15)
    ce = F.cross_entropy(out, labels)
    hand = (math.log(1 + 1 + math.exp(-1.0)) + math.log(1 + math.exp(3.1) + math.exp(0.1))) / 2
    assert abs(float(ce) - hand) < 1e-12
    # an unclipped ratio: margin 0.5 against K 2 at eps 0.5 -> ratio 0.5, the class is raised to a tie
    tie = emma_logits(torch.tensor([[0.5, 0.0]], dtype=torch.float64), torch.tensor([0]),
                      torch.tensor([[0.0, 2.0], [2.0, 0.0]], dtype=torch.float64), eps=0.5, min_ratio=0.01)
    torch.testing.assert_close(tie, torch.zeros(1, 2, dtype=torch.float64), rtol=0, atol=1e-15)


def test_gradient_matches_finite_differences_where_clips_are_constant():
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 1, 2, 1])
    # margins far from eps·K (ratios clipped at 1) or negative (clipped at min_ratio)
    logits = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    logits[torch.arange(4), labels] += torch.tensor([20.0, -20.0, 20.0, 20.0], dtype=torch.float64)
    rows = torch.randn(3, 5, generator=gen, dtype=torch.float64)

    def loss(logits, rows):
        K = torch.cdist(rows, rows)
        return F.cross_entropy(emma_logits(logits, labels, K, eps=0.3, min_ratio=0.05), labels)

    assert torch.autograd.gradcheck(loss, (logits.requires_grad_(), rows.requires_grad_()))


def test_unclipped_gradient_treats_the_ratio_as_constant():
    logits = torch.tensor([[0.5, 0.0, 0.2]], dtype=torch.float64, requires_grad=True)
    K = torch.tensor([[0.0, 2.0, 3.0]] * 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0])
    F.cross_entropy(emma_logits(logits, labels, K, eps=0.5, min_ratio=0.01), labels).backward()
    # the label entry: 0 / (0·eps) clipped up to min_ratio (its K is 0 in use)
    ratio = torch.tensor([0.01, 0.5 / (2 * 0.5), 0.3 / (3 * 0.5)], dtype=torch.float64)
    l2 = logits.detach().clone().requires_grad_()
    K2 = K.detach().clone().requires_grad_()
    shifted = l2 - l2[:, :1]
    F.cross_entropy(shifted + ratio * 0.5 * K2[0], labels).backward()
    torch.testing.assert_close(logits.grad, l2.grad)
    torch.testing.assert_close(K.grad, K2.grad)


def registry():
    return plugin_registry(("liresnet", liresnet_plugin))


def context(model, num_classes=10):
    return LossContext(model=model, num_classes=num_classes, dataset="digits",
                       mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 0.5))


def test_pair_constants_from_lln_rows_and_training_estimate():
    torch.manual_seed(0)
    model = create_model("liresnet", depth=2, width=4, dense=1, num_classes=5, registry=registry(),
                         mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 0.5)).eval()
    feats = model.features(torch.rand(3, 3, 32, 32))
    K = logit_difference_lipschitz(model, feats, context(model, 5))
    W = model.head.normalized_weight().detach()
    L = float(model.lipschitz_training_estimate().detach())
    blocks = [m.training_lipschitz().item() for m in model.body if hasattr(m, "training_lipschitz")]
    assert abs(L - 4.0 * math.prod(blocks)) <= 1e-5 * L
    torch.testing.assert_close(K.detach(), torch.cdist(W, W) * L, rtol=1e-5, atol=1e-6)


def test_emma_trains_a_liresnet_and_refuses_a_non_affine_head():
    torch.manual_seed(0)
    reg = registry()
    model = create_model("liresnet", depth=2, width=4, dense=1, num_classes=10, registry=reg)
    loss = emma_factory(context(model), eps=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.rand(8, 3, 32, 32), torch.arange(8) % 10
    model.train()
    out = loss(model, x, y)
    opt.zero_grad()
    out.loss.backward()
    residual = model.body.block1_res.weight.grad
    assert residual is not None and residual.abs().sum() > 0 and out.logits.shape == (8, 10)
    assert set(out.parts) == {"pair_lipschitz"}
    mlp = create_model("liresnet", head="mlp", depth=1, width=4, dense=1, num_classes=10, registry=reg)
    with pytest.raises(LipUsageError, match="affine head"):
        emma_factory(context(mlp))(mlp, x, y)
    for bad in ({"eps": 0.0}, {"eps": -1.0}, {"min_ratio": 0.0}, {"min_ratio": 1.5}):
        with pytest.raises(ValueError):
            emma_factory(context(model), **bad)


@pytest.fixture
def liresnet_registered():
    with registered(("test-liresnet", liresnet_plugin)):
        yield


@pytest.mark.parametrize("spec, message", [
    ("emma:eps=-1", "eps must be in (0, 64]"),
    ("emma:min_ratio=2", "min_ratio must be in (0, 1]"),
    ("emma:eps=abc", "eps: expected float"),
    ("emma:radius=1", "no parameter 'radius'"),
])
def test_cli_refuses_bad_parameters_in_one_line(liresnet_registered, tmp_path, spec, message):
    result = run_lip(["train", "--dataset", "digits", "--arch", "liresnet:depth=1,width=2",
                      "--loss", spec, "--epochs", "1", "--out", str(tmp_path / "m.safetensors")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


def test_specs_conform():
    check_component_spec(liresnet_plugin.liresnet_spec())
    check_component_spec(liresnet_plugin.emma_spec())


def authors_eps(epoch, epochs, eps, min_eps, max_eps):
    """hukkai/liresnet ``train.py`` lines 115-119 (``eps_fn``), written out:
    ratio = min(epoch / epochs * 2, 1); ratio = min_eps + (max_eps - min_eps) * ratio; eps * ratio."""
    ratio = min(epoch / epochs * 2, 1)
    ratio = min_eps + (max_eps - min_eps) * ratio
    return eps * ratio


@pytest.mark.parametrize("epochs", [800, 7, 2])
def test_eps_schedule_is_the_authors_formula(epochs):
    torch.manual_seed(0)
    model = create_model("liresnet", depth=1, width=2, dense=1, num_classes=10, registry=registry())
    base = 36 / 255
    # the authors' CIFAR-10 values (configs/cifar10.yaml: eps, min_eps 0.1, max_eps 3.0)
    loss = emma_factory(context(model), eps=base, min_eps=0.1, max_eps=3.0, ramp=0.5)
    x, y = torch.rand(4, 3, 32, 32), torch.arange(4)
    assert float(loss.ramp.current) == authors_eps(0, epochs, base, 0.1, 3.0)  # before any epoch
    for epoch in sorted({0, 1, epochs // 4, epochs // 2 - 1, epochs // 2, epochs - 1}):
        loss.begin_epoch(TrainProgress(epoch, epochs))
        expected = authors_eps(epoch, epochs, base, 0.1, 3.0)
        assert float(loss.ramp.current) == expected
        out = loss(model.eval(), x, y)
        assert float(out.parts["eps"]) == expected
        K = logit_difference_lipschitz(model, model.features(x), context(model))
        reference = F.cross_entropy(emma_logits(model(x), y, K, expected, 0.01), y)
        torch.testing.assert_close(out.loss, reference, rtol=1e-6, atol=1e-7)
    assert loss.resolved_params() == {"eps": base, "min_eps": 0.1, "max_eps": 3.0, "ramp": 0.5, "min_ratio": 0.01}
    # the default: a fixed eps (the same float as before the schedule existed), nothing extra logged
    fixed = emma_factory(context(model), eps=0.3)
    fixed.begin_epoch(TrainProgress(5, 10))
    assert fixed.ramp.value() == 0.3 and isinstance(fixed.ramp.value(), float)
    assert set(fixed(model, x, y).parts) == {"pair_lipschitz"}
    for bad in ({"min_eps": -1.0}, {"ramp": 1.5}):
        with pytest.raises(ValueError):
            emma_factory(context(model), **bad)


def test_train_loop_gives_the_loss_its_epoch(liresnet_registered, tmp_path):
    """``lip train`` calls ``begin_epoch``: the logged ``train_eps`` of each epoch is the
    formula's; the authors' block and shapes train, save, load and certify (no attack below a
    certified radius)."""
    out = tmp_path / "m.safetensors"
    arch = ("liresnet:depth=2,width=2,dense=1,gamma=true,depth_scale=true,centering=true,"
            "stem_kernel=5,neck=patch,dense_width=16,features=act")
    result = run_lip(["train", "--dataset", "digits", "--arch", arch,
                      "--loss", "emma:min_eps=0.1,max_eps=3,ramp=0.5", "--epochs", "3",
                      "--optimizer", "nadam", "--lr", "0.001", "--weight-decay", "0", "--grad-clip", "3",
                      "--batch-size", "16", "--limit-train", "32", "--limit-test", "8",
                      "--no-lipschitz-estimate", "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = read_model_metadata(out)
    assert meta["config"]["arch"]["params"]["centering"] is True
    history = meta["training"]["history"]
    assert len(history) == 3
    for epoch, record in enumerate(history):
        assert math.isclose(record["train_eps"], authors_eps(epoch, 3, 36 / 255, 0.1, 3.0), rel_tol=1e-12)
        assert math.isfinite(record["train_loss"])
    cert = run_lip(["certify", str(out), "--limit", "8", "--attack", "--json", "--no-write", "-q"])
    assert cert.exit_code == 0, cert.output
    summary = json.loads(cert.stdout)
    assert summary["sound"] is True and summary["violations"] == 0
