"""Training-loss plugins (``lip_losses``): the built-ins' maths and gradients, reductions to
cross-entropy, the resolution of ``--loss``, and a third-party loss trained end to end."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lipcli.sdk.hookspecs import hookimpl
from lipcli.builtins.crc.head import MLPHead
from lipcli.builtins.lln.head import LLNHead
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.losses import LossContext, LossOutput
from lipcli.host.plugins import create_host, get_registry
from lipcli.sdk.specs import LossSpec, Param
from lipcli.testing import check_component_spec

REG = get_registry()
STD = (0.5, 0.25, 0.5)


class Tiny(nn.Module):
    """The architecture protocol on flat inputs: features = a linear map, then the head."""

    def __init__(self, head: nn.Module, d_in: int = 7, d_feat: int = 5) -> None:
        super().__init__()
        self.body = nn.Linear(d_in, d_feat)
        self.head = head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def tiny(head: str = "lln", classes: int = 4, seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    h = LLNHead(5, classes) if head == "lln" else MLPHead(5, classes, hidden=6)
    return Tiny(h).double()


def build(choice: str, model: nn.Module, classes: int = 4, **context) -> nn.Module:
    comp = REG.component("loss", choice)
    ctx = LossContext(model=model, num_classes=classes, dataset="digits", mean=(0.0,) * 3, std=STD,
                      **context)
    return comp.build(ctx)


def gradcheck_loss(loss: nn.Module, model: nn.Module, n: int = 6, classes: int = 4,
                   fast_mode: bool = False) -> None:
    """float64 gradcheck of ``loss(model, x, y).loss`` w.r.t. the inputs and every parameter
    (``fast_mode``: torch's check of a random projection ``vᵀJu`` of each Jacobian, two loss
    evaluations per tensor instead of two per element)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.arange(n) % classes
    names = [name for name, _ in model.named_parameters()]
    values = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    for name in names:  # the parameters become plain tensors that gradcheck perturbs
        owner, _, leaf = name.rpartition(".")
        mod = model.get_submodule(owner)
        del mod._parameters[leaf]
        setattr(mod, leaf, None)

    def f(x, *params):
        for name, value in zip(names, params):
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, value)
        torch.manual_seed(0)
        return loss(model, x, y).loss

    assert torch.autograd.gradcheck(f, (x, *values), eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=fast_mode)


@pytest.mark.parametrize("spec", [s for s in REG.specs("loss")], ids=lambda s: s.name)
def test_builtin_loss_specs_conform(spec):
    assert isinstance(spec, LossSpec)
    check_component_spec(spec)


@pytest.mark.parametrize("choice, head", [
    ("ce", "lln"), ("ce", "mlp"), ("cr:gamma=0.7", "lln"), ("margin-offset", "lln"),
    ("margin-offset:eps=0.3,temperature=2", "mlp"),
    # the attack point carries no gradient by design (the identity map, paper §5), so the
    # gradient is checked without the attack; the curvature term after its power iteration
    # has converged (v held constant is then exact: the envelope theorem)
    ("crc-lip:radius=0,gamma=0.5,power_steps=400", "mlp"),
    ("crc-lip:radius=0,gamma=0.5,power_steps=400,classes=2", "mlp"),
])
def test_gradients_float64(choice, head):
    model = tiny(head)
    loss = build(choice, model, refresh_steps=2000).eval()
    out = loss(model, torch.randn(6, 7, dtype=torch.float64), torch.arange(6) % 4)
    assert isinstance(out, LossOutput) and out.loss.dim() == 0 and out.logits.shape == (6, 4)
    # CRC-Lip runs 400 power steps per evaluation: a random projection of every Jacobian
    # (catches a wrong gradient as surely, 8x less work) instead of one column per element
    gradcheck_loss(loss, model, fast_mode=choice.startswith("crc-lip"))


@pytest.mark.parametrize("zero", ["cr:gamma=0", "margin-offset:eps=0,temperature=1"])
def test_cr_and_offset_reduce_to_ce_at_zero(zero):
    model = tiny("lln")
    x, y = torch.randn(8, 7, dtype=torch.float64), torch.arange(8) % 4
    results = []
    for choice in ("ce", zero):
        model.zero_grad()
        out = build(choice, model)(model, x, y)
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = results
    assert torch.equal(a, b) and all(torch.equal(u, v) for u, v in zip(ga, gb))
    # and a non-zero weight or offset changes the loss
    other = zero.replace("gamma=0", "gamma=1").replace("eps=0", "eps=0.5")
    assert not torch.equal(build(other, model)(model, x, y).loss.detach(), a)


def test_margin_offset_formula():
    model = tiny("lln")
    x, y = torch.randn(5, 7, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0])
    loss = build("margin-offset:eps=0.2,temperature=0.5", model)
    offset = math.sqrt(2) * 0.2 / min(STD)
    logits = model(x)
    expected = 0.0
    for i in range(5):  # tau * CE((f - u e_l) / tau) written out per example
        z = logits[i].clone()
        z[y[i]] -= offset
        z = z / 0.5
        expected += 0.5 * (torch.logsumexp(z, 0) - z[y[i]]) / 5
    assert loss(model, x, y).loss.item() == pytest.approx(expected.item(), rel=1e-12)


def test_cr_certificate_is_the_lln_certificate():
    model = tiny("lln", classes=5)
    loss = build("cr:gamma=1", model, classes=5)
    x, y = torch.randn(9, 7, dtype=torch.float64), torch.arange(9) % 5
    feats = model.features(x)
    logits = model.head(feats)
    cert = loss.certificates(model.head, feats, logits, y)
    w = model.head.normalized_weight()
    for i in range(9):  # min_j (f_l - f_j) / (||w_l - w_j|| L), L = 1 / min(std)
        l = int(y[i])
        ref = min((logits[i, l] - logits[i, j]) / (w[l] - w[j]).norm() * min(STD)
                  for j in range(5) if j != l)
        assert cert[i].item() == pytest.approx(ref.item(), rel=1e-9)
    ce = F.cross_entropy(logits, y)
    assert loss(model, x, y).loss.item() == pytest.approx((ce - F.relu(cert).mean()).item(), rel=1e-12)


def test_cr_rejects_a_head_that_is_not_affine():
    model = tiny("mlp")
    with pytest.raises(LipUsageError, match="needs an affine head"):
        build("cr", model)(model, torch.randn(4, 7, dtype=torch.float64), torch.arange(4))


def test_crc_curvature_needs_an_mlp_head_and_keeps_its_state():
    with pytest.raises(LipUsageError, match="needs an MLP head with fc1/fc2"):
        build("crc-lip", tiny("lln"))
    model = tiny("mlp").float()
    loss = build("crc-lip", model, refresh_steps=3)
    assert set(loss.state_dict()) == {"u"}  # the checkpoint key of older releases
    before = loss.state_dict()["u"].clone()
    loss.end_epoch(model)
    assert not torch.equal(before, loss.state_dict()["u"])
    assert set(build("crc-lip:gamma=0", model).state_dict()) == set()


def test_crc_attack_point_is_detached_and_in_the_ball():
    model = tiny("mlp").float()
    loss = build("crc-lip:radius=0.5,gamma=0", model)
    x, y = torch.randn(6, 7), torch.arange(6) % 4
    torch.manual_seed(3)
    out = loss(model, x, y)
    torch.manual_seed(3)
    feats = model.features(x).detach()
    delta = loss.attack(model.head, feats, y)
    assert float(delta.norm(dim=1).max()) <= 0.5 / min(STD) * (1 + 1e-6)
    assert out.loss.item() == pytest.approx(F.cross_entropy(model.head(feats + delta), y).item(), rel=1e-6)


def test_bad_loss_parameters_are_usage_errors():
    from lipcli.train.objective import build_loss

    model = tiny("mlp")
    ctx = LossContext(model=model, num_classes=4, dataset="digits", mean=(0.0,) * 3, std=STD)
    for choice, message in [("cr:gamma=-1", "gamma must be in [0, 10000]"),
                            ("cr:gamma=nan", "gamma must be in [0, 10000]"),
                            ("margin-offset:eps=inf", "eps must be in [0, 64]"),
                            ("margin-offset:eps=-1", "eps must be in [0, 64]"),
                            ("margin-offset:temperature=-2", "temperature must be in (0, 1000]"),
                            ("crc-lip:radius=inf", "radius must be in [0, 64]"),
                            ("crc-lip:gamma=nan", "gamma must be in [0, 10000]"),
                            ("crc-lip:radius=-1", "radius must be in [0, 64]")]:
        with pytest.raises(LipUsageError, match=re.escape(message)):
            build_loss(REG.component("loss", choice), ctx)


# --------------------------------------------------------------------------------------------
# a third-party loss: registered in-process, trained end to end, recorded in the model file
# --------------------------------------------------------------------------------------------
class _CountingLoss(nn.Module):
    def __init__(self, smoothing: float) -> None:
        super().__init__()
        self.smoothing = smoothing
        self.register_buffer("epochs", torch.zeros((), dtype=torch.int64))

    def forward(self, model, images, labels):
        logits = model(images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.smoothing)
        return LossOutput(loss, logits.detach(), {"smoothed": loss.detach()})

    def end_epoch(self, model):
        self.epochs += 1


class SmoothPlugin:
    @hookimpl
    def lip_losses(self):
        return [LossSpec(name="smooth-ce", description="label-smoothed CE",
                         factory=lambda context, *, smoothing=0.1: _CountingLoss(smoothing),
                         params=(Param(name="smoothing", type=float, default=0.1),))]


def test_third_party_loss_trains_without_changes_to_lipcli(tmp_path):
    from lipcli.host.modelfile import read_metadata
    from lipcli.train import TrainConfig, TrainSummary, read_checkpoint, train

    reg = create_host(autoload=False, extra=[("smooth", SmoothPlugin())]).registry()
    cfg = TrainConfig(dataset="digits", width=4, epochs=2, batch_size=32, limit_train=64,
                      limit_test=16, power_iter_steps=2, lipschitz_estimate=False, device="cpu",
                      loss="smooth-ce:smoothing=0.2")
    summary = train(cfg, out=str(tmp_path / "m.safetensors"), quiet=True, registry=reg)
    assert isinstance(summary, TrainSummary)  # a typed result; its JSON is lip train --json
    assert summary.epochs == 2 and summary.model == str(tmp_path / "m.safetensors")
    assert summary.lipschitz_estimate is None and summary.lipschitz_upper_bound > 1
    assert summary.to_json()["test_accuracy"] == summary.test_accuracy
    meta = read_metadata(tmp_path / "m.safetensors")["training"]
    assert meta["epochs"] == 2 and summary.time_s == meta["time_s"]
    assert meta["loss"]["name"] == "smooth-ce" and meta["loss"]["params"] == {"smoothing": 0.2}
    assert meta["loss"]["provider"] == "smooth" and meta["config"]["loss"] == "smooth-ce:smoothing=0.2"
    assert meta["config"]["grad_clip"] == 0.0
    assert all("train_smoothed" in h for h in meta["history"])
    tensors, ck = read_checkpoint(tmp_path / "m-run" / "checkpoint.safetensors")
    assert int(tensors[ck["loss"]["epochs"]["__tensor__"]]) == 2  # end_epoch ran, state saved
