"""The Logit Annealing loss: a hand-computed example, gradients against finite differences,
the EMMA shift (eps > 0) through an LLN-headed LipConvnet, plain logits (eps = 0) for any head,
and the command line refusing bad parameters with one line."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.losses import LossContext, TrainProgress, emma_logits, logit_difference_lipschitz
from lipcli.testing import check_component_spec, create_model, registered, run_lip
from lipcli_logit_annealing import plugin as la_plugin
from lipcli_logit_annealing.loss import la_factory, logit_annealing


def test_hand_computed_example():
    logits = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    value = logit_annealing(logits, torch.tensor([0]), offset=1.0, temperature=0.5, gamma=2.0)
    # z' = ([2, 1, 0] − [1, 0, 0]) / 0.5 = [2, 2, 0]
    ce = math.log(2.0 + math.exp(-2.0))
    p = math.exp(-ce)
    assert abs(float(value) - 0.5 * (1 - p) ** 2 * ce) < 1e-14
    # gamma 0: the offset cross-entropy times the temperature
    plain = logit_annealing(logits, torch.tensor([0]), offset=1.0, temperature=0.5, gamma=0.0)
    assert abs(float(plain) - 0.5 * ce) < 1e-14
    # alpha (BRONet's LipConvNet FocalLoss alpha): alpha * tau * (1 - p)^gamma * CE
    scaled = logit_annealing(logits, torch.tensor([0]), offset=1.0, temperature=0.5, gamma=2.0, alpha=0.25)
    assert abs(float(scaled) - 0.25 * 0.5 * (1 - p) ** 2 * ce) < 1e-14


def test_alpha_reaches_the_loss_and_is_recorded():
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, num_classes=10).eval()
    x, y = torch.rand(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    plain, quarter = la_factory(context(model), eps=0.0), la_factory(context(model), eps=0.0, alpha=0.25)
    torch.testing.assert_close(quarter(model, x, y).loss, 0.25 * plain(model, x, y).loss)
    assert quarter.resolved_params()["alpha"] == 0.25 and plain.resolved_params()["alpha"] == 1.0
    with pytest.raises(ValueError, match="alpha"):
        la_factory(context(model), alpha=0.0)


def test_gradient_matches_finite_differences():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3, 1])
    assert torch.autograd.gradcheck(
        lambda z: logit_annealing(z, labels, offset=2.0, temperature=0.75, gamma=5.0), (logits,))


def context(model):
    return LossContext(model=model, num_classes=10, dataset="digits", mean=(0.5,) * 3, std=(0.5,) * 3)


def test_loss_on_a_model_matches_the_formula():
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, num_classes=10).eval()
    x, y = torch.rand(6, 3, 32, 32), torch.tensor([0, 1, 2, 3, 4, 5])
    loss = la_factory(context(model), eps=0.3)
    out = loss(model, x, y)
    feats = model.features(x)
    K = logit_difference_lipschitz(model, feats, context(model))
    # a LipConvnet has no training estimate: Lip(g) = 1/min std = 2
    W = model.head.normalized_weight()
    torch.testing.assert_close(K, torch.cdist(W, W) * 2.0, rtol=1e-5, atol=1e-6)
    expected = logit_annealing(emma_logits(model.head(feats), y, K, 0.3, 0.01), y,
                               offset=2.0, temperature=0.75, gamma=5.0)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert model.head.weight.grad.abs().sum() > 0
    # eps = 0: the plain logits, and any head (the CRC-Lip MLP is not affine)
    mlp = create_model("lipconvnet-5", width=4, head="mlp", num_classes=10).eval()
    plain = la_factory(context(mlp), eps=0.0)(mlp, x, y)
    torch.testing.assert_close(plain.loss, logit_annealing(mlp(x), y, offset=2.0, temperature=0.75, gamma=5.0))
    with pytest.raises(LipUsageError, match="affine head"):
        la_factory(context(mlp))(mlp, x, y)
    for bad in ({"temperature": 0.0}, {"offset": -1.0}, {"gamma": -1.0}, {"gamma": 101.0},
                {"eps": -0.1}, {"min_ratio": 0.0}):
        with pytest.raises(ValueError):
            la_factory(context(model), **bad)


@pytest.fixture
def la_registered():
    with registered(("test-logit-annealing", la_plugin)):
        yield


@pytest.mark.parametrize("spec, message", [
    ("la:temperature=0", "temperature must be in (0, 1000]"),
    ("la:gamma=abc", "gamma: expected float"),
    ("la:gamma=1000", "gamma must be in [0, 100]"),
    ("la:tau=1", "no parameter 'tau'"),
])
def test_cli_refuses_bad_parameters_in_one_line(la_registered, tmp_path, spec, message):
    result = run_lip(["train", "--dataset", "digits", "--arch", "lipconvnet-5", "--width", "2",
                      "--loss", spec, "--epochs", "1", "--out", str(tmp_path / "m.safetensors")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


def test_spec_conforms():
    check_component_spec(la_plugin.la_spec())


def authors_eps(epoch, epochs, eps, min_eps_ratio, max_eps_ratio):
    """ntuaislab/BRONet ``bronet/train.py`` lines 174-177 (``eps_fn``), written out:
    ratio = min(epoch / epochs * 2, 1); ratio = min_eps_ratio + (max_eps_ratio - min_eps_ratio) * ratio;
    eps * ratio."""
    ratio = min(epoch / epochs * 2, 1)
    ratio = min_eps_ratio + (max_eps_ratio - min_eps_ratio) * ratio
    return eps * ratio


@pytest.mark.parametrize("epochs", [800, 9])
def test_eps_schedule_is_the_authors_formula(epochs):
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, num_classes=10).eval()
    x, y = torch.rand(6, 3, 32, 32), torch.tensor([0, 1, 2, 3, 4, 5])
    base = 36 / 255
    # bronet/configs/benchmark_reproduce/cifar10.yaml: eps, min_eps_ratio 0.1, max_eps_ratio 3.0
    loss = la_factory(context(model), eps=base, min_eps=0.1, max_eps=3.0, ramp=0.5)
    for epoch in sorted({0, 3, epochs // 2 - 1, epochs // 2, epochs - 1}):
        loss.begin_epoch(TrainProgress(epoch, epochs))
        expected = authors_eps(epoch, epochs, base, 0.1, 3.0)
        out = loss(model, x, y)
        assert float(loss.ramp.current) == expected and float(out.parts["eps"]) == expected
        feats = model.features(x)
        K = logit_difference_lipschitz(model, feats, context(model))
        reference = logit_annealing(emma_logits(model.head(feats), y, K, expected, 0.01), y,
                                    offset=2.0, temperature=0.75, gamma=5.0)
        torch.testing.assert_close(out.loss, reference)
    # ramp = 0: max_eps from the first epoch; the default: fixed eps, nothing extra logged
    at_once = la_factory(context(model), eps=0.2, min_eps=0.5, max_eps=2.0, ramp=0.0)
    at_once.begin_epoch(TrainProgress(0, 10))
    assert float(at_once.ramp.current) == 0.4
    fixed = la_factory(context(model), eps=0.3)
    fixed.begin_epoch(TrainProgress(3, 10))
    assert fixed.ramp.value() == 0.3 and fixed(model, x, y).parts == {}
    assert fixed.resolved_params()["min_eps"] == 1.0
