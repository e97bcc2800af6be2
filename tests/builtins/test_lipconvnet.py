"""LipConvnet-n built from the real SOC layers (SPEC §3, §5): layout, shapes, parameter
counts, the Lipschitz bound against a dense Jacobian, and fast vs exact SOC gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lipcli.builtins.activations.plugin import lip_activations
from lipcli.builtins.crc import plugin as crc_plugin
from lipcli.builtins.lln import plugin as lln_plugin
from lipcli.builtins.lipconvnet import DEPTHS, LipConvnet, Normalize
from lipcli.builtins.lipconvnet.plugin import lip_architectures
from lipcli.builtins.pooling.plugin import lip_pools
from lipcli.builtins.soc.plugin import lip_convolutions
from lipcli.sdk.loading import loading_tensors
from lipcli.sdk.specs import ONE_LIPSCHITZ, ArchSpec, Component

ARCHS = {spec.name: spec for spec in lip_architectures()}
CONVS = {spec.name: spec for spec in lip_convolutions()}
ACTS = {spec.name: spec for spec in lip_activations()}
POOLS = {spec.name: spec for spec in lip_pools()}
HEADS = {spec.name: spec for spec in [*lln_plugin.lip_heads(), *crc_plugin.lip_heads()]}


def build(
    depth: int,
    *,
    conv: str = "soc-fast",
    pool: str = "max",
    head: str = "lln",
    width: int = 32,
    num_classes: int = 10,
    head_params: dict | None = None,
    seed: int = 0,
) -> LipConvnet:
    torch.manual_seed(seed)
    arch = ARCHS[f"lipconvnet-{depth}"]
    return Component(arch, arch.resolve_params({"width": width})).build(
        conv=Component(CONVS[conv], CONVS[conv].resolve_params()),
        activation=Component(ACTS["maxmin"]),
        pool=Component(POOLS[pool]),
        head=Component(HEADS[head], HEADS[head].resolve_params(head_params)),
        num_classes=num_classes,
        in_channels=3,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2507, 0.2507, 0.2507),
    )


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def soc_count(c_in: int, c_out: int, k: int, s: int) -> int:
    """SOC parameters (SPEC §1): filter C x C x k x k with C = max(c_out, c_in s²), bias c_out."""
    c = max(c_out, c_in * s * s)
    return c * c * k * k + c_out


def expected_count(depth: int, *, head: str, pool: str, w: int = 32, classes: int = 10,
                   hidden: int = 4096) -> int:
    """Parameter count of LipConvnet-depth from the SPEC §3 layout."""
    b = depth // 5
    total = soc_count(3, w, 3, 1)
    c = w
    for _ in range(4):
        total += (b - 1) * soc_count(c, c, 3, 1) + soc_count(c, 4 * c, 3, 2)
        total += 2 * c if pool == "projection" else 0  # one theta per pooled channel
        c *= 2
    total += soc_count(c, 4 * c, 1, 2) + (b - 1) * soc_count(4 * c, 4 * c, 1, 1)
    if head == "lln":
        total += 2 * c if pool == "projection" else 0
        total += 2 * c * classes + classes
    else:
        total += 4 * c * hidden + hidden + hidden * classes + classes
    return total


# ---------------------------------------------------------------------------------------------
# registration and layout


def test_registered_architectures() -> None:
    assert DEPTHS == (5, 10, 15, 20, 25, 30, 35, 40)
    for family in ("lipconvnet", "lipresnet"):  # lipresnet-<n>: tests/builtins/test_lipresnet.py
        names = [n for n in ARCHS if n.startswith(f"{family}-")]
        assert sorted(names, key=lambda n: int(n.split("-")[1])) == [f"{family}-{n}" for n in DEPTHS]
    assert len(ARCHS) == 2 * len(DEPTHS)
    for spec in ARCHS.values():
        assert isinstance(spec, ArchSpec)
        assert spec.param("width").default == 32 and spec.param("width").type is int
    assert {"soc", "soc-fast"} <= set(CONVS)


def _stage_shapes(model: LipConvnet, x: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """Output shape (no batch dim) of every body child, from a real no-grad forward."""
    seen: dict[str, tuple[int, ...]] = {}
    hooks = [
        child.register_forward_hook(lambda m, i, o, n=name: seen.__setitem__(n, tuple(o.shape[1:])))
        for name, child in model.body.named_children()
    ]
    try:
        with torch.no_grad():
            logits = model(x)
    finally:
        for h in hooks:
            h.remove()
    seen["head"] = tuple(logits.shape[1:])
    return seen


def test_parameter_counts_and_shapes_at_full_width() -> None:
    # Hand derivation (w = 32, 10 classes), SOC = C²k² + c_out with C = max(c_out, c_in s²):
    #   stem 3->32 k3 s1: 32²·9+32 = 9,248
    #   downs 32->128, 64->256, 128->512, 256->1024 (k3 s2): 147,584 + 590,080 + 2,359,808
    #     + 9,438,208; block-5 down 512->2048 (k1 s2): 2048²+2048 = 4,196,352
    #   LLN 1024·10+10 = 10,250                      => LipConvnet-5 + LLN = 16,751,530
    #   b = 4 adds 3 x (9,248 + 36,928 + 147,584 + 590,080 + 4,196,352) = 14,940,576
    #                                                => LipConvnet-20 + LLN = 31,692,106
    #   b = 2 adds 4,980,192 to the convs (21,721,472); MLP 2048·4096+4096+4096·10+10
    #     = 8,433,674                                => LipConvnet-10 + MLP = 30,155,146
    #   projection pooling adds one theta per pooled channel: 64+128+256+512 (+1024 with LLN)
    # Built as the model loader builds (loading_tensors: SOC skips its 50 start-up power
    # steps, which register no parameter and change no shape): the counts and shapes are
    # those of a freshly built model, at a fraction of the time.
    cases = [
        (5, "lln", "max", 16_751_530, 16.75),
        (20, "lln", "max", 31_692_106, 31.69),
        (10, "mlp", "max", 30_155_146, 30.16),
        (10, "mlp", "projection", 30_156_106, 30.16),
        (5, "lln", "projection", 16_751_530 + 1984, 16.75),
    ]
    x = torch.rand(1, 3, 32, 32)
    for depth, head, pool, exact, millions in cases:
        with loading_tensors():
            model = build(depth, head=head, pool=pool)
        assert n_params(model) == exact == expected_count(depth, head=head, pool=pool)
        assert round(exact / 1e6, 2) == millions
        if (depth, pool) in ((5, "max"), (10, "projection")):
            # documented shapes: 32@32² -> 64@16² -> 128@8² -> 256@4² -> 512@2² -> 1024/2048
            model.eval()
            seen = _stage_shapes(model, x)
            assert seen["stem_act"] == (32, 32, 32)
            assert [seen[f"block{k}_pool"] for k in range(1, 5)] == [
                (64, 16, 16), (128, 8, 8), (256, 4, 4), (512, 2, 2)]
            assert seen["flatten"] == ((1024,) if head == "lln" else (2048,))
            assert seen["head"] == (10,)
            assert seen == {name: out for name, _, out in model.describe()}
        del model


def _check_model(model: LipConvnet, width: int, head: str) -> None:
    """Documented shapes, train/eval forward + backward, protocol attributes."""
    d = 32 * width if head == "lln" else 64 * width
    assert model.feature_dim == d
    body = list(model.body.children())
    assert isinstance(body[0], Normalize) and isinstance(body[-1], nn.Flatten)
    # every module built from a component carries its spec's promises
    for name, child in model.body.named_children():
        assert isinstance(getattr(child, "lip_promises", None), tuple), name
    assert hasattr(model.head, "lip_promises")
    # stage outputs: w@32² -> 2w@16² -> 4w@8² -> 8w@4² -> 16w@2² -> D
    shapes = {name: out for name, _, out in model.describe()}
    assert shapes["stem_act"] == (width, 32, 32)
    for k in range(1, 5):
        assert shapes[f"block{k}_pool"] == (width * 2**k, 32 >> k, 32 >> k)
    assert shapes["flatten"] == (d,)
    assert model.describe()[-1] == ("head", (d,), (10,))
    # describe() agrees with the real tensors
    seen: dict[str, tuple[int, ...]] = {}
    hooks = [
        child.register_forward_hook(lambda m, i, o, n=name: seen.__setitem__(n, tuple(o.shape[1:])))
        for name, child in model.body.named_children()
    ]
    x = torch.rand(2, 3, 32, 32)
    y = torch.randint(0, 10, (2,))
    for train in (True, False):
        model.train(train)
        model.zero_grad(set_to_none=True)
        seen.clear()
        logits = model(x)  # once: a training forward also steps the power iteration
        assert logits.shape == (2, 10)
        assert seen["flatten"] == (d,)
        F.cross_entropy(logits, y).backward()
        if not train:
            with torch.no_grad():
                assert torch.equal(model.head(model.features(x)), logits)
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert seen == {name: out for name, _, out in model.describe()[:-1]}
    for h in hooks:
        h.remove()


@pytest.mark.parametrize("depth", DEPTHS)
def test_every_depth_small_width(depth: int) -> None:
    # odd multiples of 5: projection pool + LLN; even: max pool + MLP head
    head = "lln" if depth % 10 else "mlp"
    model = build(depth, width=4, pool="projection" if depth % 10 else "max", head=head,
                  head_params={"hidden": 64} if head == "mlp" else None)
    _check_model(model, 4, head)
    b = depth // 5
    n_convs = sum(1 for n, _ in model.body.named_children() if "conv" in n or "down" in n)
    assert n_convs == depth + 1 == 1 + 5 * b


@pytest.mark.slow
@pytest.mark.parametrize("depth", DEPTHS)
def test_every_depth_full_width(depth: int) -> None:
    for head, pool in (("lln", "max"), ("mlp", "projection")):
        model = build(depth, head=head, pool=pool)
        assert n_params(model) == expected_count(depth, head=head, pool=pool)
        _check_model(model, 32, head)
        del model


def test_block5_layout() -> None:
    """Block 5: down conv, then b-1 1x1 convs, activation between them, pool/act at the end."""
    model = build(15, width=2)
    names = [n for n, _ in model.body.named_children()]
    tail = names[names.index("block5_down"):]
    assert tail == ["block5_down", "block5_act1", "block5_conv1", "block5_act2", "block5_conv2",
                    "block5_pool", "flatten"]
    model = build(15, width=2, head="mlp", head_params={"hidden": 8})
    assert [n for n, _ in model.body.named_children()][-2] == "block5_act"


def test_protocol_and_helpers() -> None:
    model = build(5, width=4, pool="projection")
    # weight decay exclusions collected with full names
    wd = model.no_weight_decay_parameters()
    assert {"body.block1_pool.theta", "body.block5_pool.theta", "head.bias"} <= wd
    assert "head.weight" not in wd
    assert all(name in dict(model.named_parameters()) for name in wd)
    # promises set from the component specs
    assert model.body.stem_act.lip_promises == ACTS["maxmin"].promises
    assert model.body.block1_pool.lip_promises == POOLS["projection"].promises
    assert model.body.stem_conv.lip_promises == CONVS["soc-fast"].promises
    # refresh_power_iteration reaches every layer with a refresh()
    calls: list[int] = []
    for m in model.modules():
        if callable(getattr(m, "refresh", None)):
            m.refresh = lambda steps, calls=calls: calls.append(steps)  # type: ignore[method-assign]
    model.refresh_power_iteration(7)
    assert calls == [7] * 6  # the 6 SOC layers of LipConvnet-5


def test_create_model_integration_and_state_dict_round_trip() -> None:
    import lipcli

    torch.manual_seed(0)
    model = lipcli.create_model("lipconvnet-10", width=4, pool="projection", head="mlp:hidden=16")
    assert isinstance(model, LipConvnet) and model.depth == 10 and model.width == 4
    assert model.feature_dim == 256 and model.head.fc1.in_features == 256
    assert n_params(model) == expected_count(10, head="mlp", pool="projection", w=4, hidden=16)
    model.eval()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    torch.manual_seed(1)
    clone = lipcli.create_model("lipconvnet-10", width=4, pool="projection", head="mlp:hidden=16")
    clone.load_state_dict(model.state_dict(), strict=True)
    clone.eval()
    with torch.no_grad():
        assert torch.equal(clone(x), ref)
    assert "body.normalize.std" in model.state_dict()
    with pytest.raises(ValueError, match="32, 32"):
        with torch.no_grad():
            model(torch.rand(1, 3, 64, 64))


def test_normalize() -> None:
    norm = Normalize((0.5, 0.25, 0.0), (0.5, 0.25, 2.0)).double()
    x = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    expected = (x - torch.tensor([0.5, 0.25, 0.0]).view(1, 3, 1, 1).double()) / torch.tensor(
        [0.5, 0.25, 2.0]).view(1, 3, 1, 1).double()
    assert torch.allclose(norm(x), expected)
    assert norm.lipschitz_upper_bound() == pytest.approx(4.0)
    assert set(dict(norm.named_buffers())) == {"mean", "std"}
    with pytest.raises(ValueError):
        Normalize((0.0,), (0.0,))
    with pytest.raises(ValueError, match="multiple of 5"):
        LipConvnet(depth=7, conv=None, activation=None, pool=None, head=None,  # type: ignore[arg-type]
                   num_classes=10)


# ---------------------------------------------------------------------------------------------
# soundness of the Lipschitz bound (SPEC §5)


@pytest.mark.parametrize("pool,head", [("max", "lln"), ("projection", "mlp")])
def test_network_bound_dominates_jacobian_norm(pool: str, head: str) -> None:
    """Π over body children of Lip(child) >= ||d features / d x||₂ at random inputs."""
    head_params = {"hidden": 8} if head == "mlp" else None
    # width 2 keeps the dense float64 Jacobian cheap (D = 64 or 128 rows, 3072 columns)
    model = build(5, width=2, pool=pool, head=head, head_params=head_params, seed=3).double()
    model.eval()
    model.refresh_power_iteration(50)
    bound = 1.0
    for child in model.body.children():
        if ONE_LIPSCHITZ in child.lip_promises:
            continue
        bound *= child.lipschitz_upper_bound()
    assert bound == pytest.approx(model.lipschitz_upper_bound(), rel=1e-15)
    assert 0.999999 / 0.2507 <= bound < 1.2 / 0.2507
    for p in model.parameters():
        p.requires_grad_(False)
    d = model.feature_dim
    g = torch.Generator().manual_seed(4)
    for _ in range(1 if head == "mlp" else 2):
        # Jacobian of one input: replicate it d times, backprop the identity (rows of J)
        x = torch.rand(1, 3, 32, 32, dtype=torch.float64, generator=g)
        xs = x.expand(d, -1, -1, -1).clone().requires_grad_(True)
        feats = model.features(xs)
        assert torch.allclose(feats, feats[:1].expand_as(feats), rtol=0, atol=1e-12)
        (jac,) = torch.autograd.grad(feats, xs, torch.eye(d, dtype=torch.float64))
        sigma = float(torch.linalg.matrix_norm(jac.reshape(d, -1), ord=2))
        assert 0 < sigma <= bound


# ---------------------------------------------------------------------------------------------
# fast vs exact SOC gradient in a real network (paper §4)


def test_fast_gradient_close_to_exact_in_lipconvnet5() -> None:
    # width 8: every layer kind of the full network at a tenth of the cost of width 32
    # (filter gradient cosines 0.9976 to 0.9998 here, the threshold is 0.99)
    exact = build(5, conv="soc", seed=1, width=8)
    exact.refresh_power_iteration(50)  # as before training: sigma from converged vectors
    fast = build(5, conv="soc-fast", seed=2, width=8)
    fast.load_state_dict(exact.state_dict())
    g = torch.Generator().manual_seed(5)
    x = torch.rand(8, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (8,), generator=g)
    outs = {}
    for name, model in (("exact", exact), ("fast", fast)):
        model.train()
        logits = model(x)
        F.cross_entropy(logits, y).backward()
        outs[name] = logits.detach()
    assert torch.allclose(outs["exact"], outs["fast"], rtol=1e-5, atol=1e-5)
    fast_params = dict(fast.named_parameters())
    checked = 0
    for name, p in exact.named_parameters():
        q = fast_params[name]
        if p.dim() == 4:  # SOC filters
            a, b = p.grad.double().flatten(), q.grad.double().flatten()
            assert a.norm() > 0
            cos = a @ b / (a.norm() * b.norm())
            assert cos >= 0.99, (name, float(cos))
            checked += 1
        elif name.endswith("bias") or name.startswith("head"):
            # the fast path changes only the filter gradient
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name
    assert checked == 6


def test_the_depth_list_is_written_once():
    """``lip bench``'s default architectures are the registered depths (its settings table spells
    them out only so that ``lip bench --help`` does not import torch)."""
    from lipcli import bench
    from lipcli.builtins.lipconvnet import DEPTHS
    from lipcli.bench.options import DEFAULT_ARCHS

    assert bench.DEFAULT_DEPTHS is DEPTHS
    assert DEFAULT_ARCHS == ",".join(str(d) for d in DEPTHS)
