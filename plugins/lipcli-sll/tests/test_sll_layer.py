"""SLL convolution: the T formula, the verified bound against dense Jacobians and Lipschitz
ratios (random, perturbed and briefly trained parameters; float64 and float32 parameters),
gradients, lipcli's conformance checks, the channel handling and a wrong layer being caught."""

from __future__ import annotations

import pytest
import torch

import lipcli_sll.plugin as plugin
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import check_conv_spec, perturbed_copies, randomise_parameters
from lipcli.testing.conv import jacobian_singular_values, pair_ratio
from lipcli_sll import SLLConv, sll_residual, sll_scale, sll_t

#: (in, out, kernel, stride, size): inner, stem (in < out), stride-2 C -> 4C (3x3 and the
#: 1x1 block), 3x3 on the rearranged 1x1 image, 1x1 filters on 1x1 images, 5x5, in > out
CASES = [(4, 4, 3, 1, 6), (3, 4, 3, 1, 6), (4, 16, 3, 2, 6), (4, 16, 1, 2, 2),
         (4, 16, 3, 2, 2), (8, 8, 1, 1, 1), (4, 4, 5, 1, 5), (8, 4, 3, 1, 4)]


def randomised(layer: SLLConv, seed: int, scale: float = 1.0) -> SLLConv:
    """A float64 eval layer with every parameter ``scale · N(0, 1)`` (q far from 1 too)."""
    return randomise_parameters(layer.double().eval(), seed, scale)


def brute_force_t(weight: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """T_i = sum_{j, delta} |sum_{c, a} K[i,c,a] K[j,c,a+delta]| q_j / q_i with explicit loops."""
    h, _, k, _ = weight.shape
    q = log_q.exp()
    t = torch.zeros(h, dtype=torch.float64)
    for i in range(h):
        for j in range(h):
            for dy in range(1 - k, k):
                for dx in range(1 - k, k):
                    s = 0.0
                    for a in range(k):
                        for b in range(k):
                            if 0 <= a + dy < k and 0 <= b + dx < k:
                                s += float((weight[i, :, a, b] * weight[j, :, a + dy, b + dx]).sum())
                    t[i] += abs(s) * q[j] / q[i]
    return t


class Nonlinear(torch.nn.Module):
    """A function as a module that says it is not affine (Jacobians at several points)."""

    lip_affine = False

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def worst_ratio(layer, shape: tuple[int, int, int], seed: int) -> float:
    """Largest Jacobian spectral norm (at 0 and random points) and pair ratio, float64."""
    gen = torch.Generator().manual_seed(seed)
    if not isinstance(layer, torch.nn.Module):
        layer = Nonlinear(layer)
    assert layer.lip_affine is False
    svals = jacobian_singular_values(layer, shape, torch.float64, gen, points=4)
    return max(max(float(v.max()) for v in svals), pair_ratio(layer, shape, gen, pairs=12))


@pytest.mark.parametrize("k", [1, 3])
def test_t_matches_the_papers_formula(k):
    gen = torch.Generator().manual_seed(k)
    w = torch.randn(5, 3, k, k, generator=gen, dtype=torch.float64)
    log_q = torch.randn(5, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(sll_t(w, log_q), brute_force_t(w, log_q), rtol=1e-12, atol=0)


def test_layer_is_the_papers_residual_map():
    """h(x) = x - 2 W T^-1 relu(W^T x + b), W^T the zero-padded convolution, as dense matrices."""
    layer = randomised(SLLConv(3, 3, 3, 1), seed=1)
    n = 5
    eye = torch.eye(3 * n * n, dtype=torch.float64).view(-1, 3, n, n)
    C = torch.nn.functional.conv2d(eye, layer.weight, padding=1).reshape(3 * n * n, -1).T  # W^T
    t = brute_force_t(layer.weight.detach(), layer.log_q.detach())
    x = torch.randn(2, 3, n, n, dtype=torch.float64)
    pre = x.reshape(2, -1) @ C.T + layer.bias.detach().repeat_interleave(n * n)
    expected = x.reshape(2, -1) - 2 * (torch.relu(pre) / t.repeat_interleave(n * n)) @ C
    with torch.no_grad():
        torch.testing.assert_close(layer(x).reshape(2, -1), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
def test_jacobians_and_ratios_below_the_bound(cin, cout, k, stride, size):
    """float64, random dense parameters and every perturbation lipcli's promise checks use
    (normal, large, negative, a few Adam steps): Jacobians at 0 and random points and the
    ratio on random pairs stay below the declared bound, which is <= 1 + 1e-9."""
    layer = randomised(SLLConv(cin, cout, k, stride), seed=cin * 100 + cout + k)
    shape = (cin, size, size)
    copies = [("random", layer), *perturbed_copies(layer, shape, seed=k + size)]
    assert len(copies) == 5
    for i, (how, moved) in enumerate(copies):
        bound = moved.lipschitz_upper_bound()
        assert bound <= 1 + 1e-9, (how, bound)
        worst = worst_ratio(moved, shape, seed=i)
        assert worst <= bound * (1 + 1e-12), (how, worst, bound)
        assert worst > 0.99, (how, worst)  # the identity part: not trivially small


def test_the_residual_branch_is_not_negligible():
    """Where the ReLU is active the Jacobian I - 2 W S D W^T has singular values well below 1
    (so the bound is tested on a real contraction, not on the identity)."""
    layer = randomised(SLLConv(4, 4, 3, 1), seed=3)
    gen = torch.Generator().manual_seed(0)
    svals = jacobian_singular_values(layer, (4, 6, 6), torch.float64, gen, points=3)
    assert min(float(v.min()) for v in svals[1:]) < 0.5


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_float32_bound_covers_the_exact_map_of_the_float32_numbers(scale):
    """The float32 layer's bound covers the map computed in float64 from its float32 filter,
    bias and cached float32 scales (cast exactly)."""
    layer = SLLConv(6, 6, 3, 1).eval()
    gen = torch.Generator().manual_seed(int(scale))
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen))
    bound = layer.lipschitz_upper_bound()
    assert 1.0 <= bound < 1.0 + 1e-4
    w, b, s = (t.detach().double() for t in (layer.weight, layer.bias, layer.eval_scale()))
    exact = lambda x: sll_residual(x, w, b, s)  # noqa: E731
    assert worst_ratio(exact, (6, 5, 5), seed=1) <= bound * (1 + 1e-12)
    # and those scales are what the float32 layer applies
    x = torch.randn(2, 6, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).double(), exact(x.double()), rtol=1e-5, atol=1e-5)


def test_a_too_large_scale_raises_the_bound():
    """The bound is computed for the scales actually used: ten times them (verified rho about
    10) gives about 19, and with every hidden unit active a Jacobian then exceeds 1."""
    from lipcli_sll import sll_bound

    layer = randomised(SLLConv(4, 4, 3, 1), seed=5)
    s = layer.eval_scale()
    assert sll_bound(layer.weight, s, layer.log_q) <= 1 + 1e-9
    tenfold = sll_bound(layer.weight, 10 * s, layer.log_q)
    assert 18.9 < tenfold <= 19.0 + 1e-9
    w, b = layer.weight.detach(), torch.full_like(layer.bias.detach(), 100.0)
    worst = worst_ratio(lambda x: sll_residual(x, w, b, 10 * s), (4, 6, 6), seed=2)
    assert 1.01 < worst <= tenfold


def test_gradients_match_finite_differences():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    log_q = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)

    def fn(x, w, b, log_q):
        return sll_residual(x, w, b, sll_scale(w, log_q))

    assert torch.autograd.gradcheck(fn, (x, w, b, log_q), eps=1e-6, atol=1e-6)
    layer = SLLConv(4, 16, 3, 2).double()
    assert torch.autograd.gradcheck(layer, (torch.randn(1, 4, 4, 4, dtype=torch.float64,
                                                        requires_grad=True),), eps=1e-6, atol=1e-6)


def test_eval_scale_is_cached_and_follows_the_parameters():
    layer = SLLConv(4, 4).eval()
    first, bound = layer.eval_scale(), layer.lipschitz_upper_bound()
    assert layer.eval_scale() is first and layer.lipschitz_upper_bound() == bound
    with torch.no_grad():
        layer.weight.mul_(2.0)
    assert layer.eval_scale() is not first
    torch.testing.assert_close(layer.eval_scale(), first / 4)


@pytest.mark.parametrize("cin, cout, stride", [(8, 4, 1), (4, 8, 2), (3, 2, 1)])
def test_more_channels_than_outputs_keep_the_first_ones(cin, cout, stride):
    """The fallback for a channel reduction: the residual on all channels, then a projection."""
    layer = randomised(SLLConv(cin, cout, 3, stride), seed=cin + cout)
    assert layer.weight.shape[1] == cin * stride**2
    x = torch.randn(2, cin, 4, 4, dtype=torch.float64)
    z = torch.nn.functional.pixel_unshuffle(x, stride)
    full = sll_residual(z, layer.weight, layer.bias, layer.eval_scale())
    with torch.no_grad():
        torch.testing.assert_close(layer(x), full[:, :cout], rtol=0, atol=0)
    assert worst_ratio(layer, (cin, 4, 4), seed=0) <= layer.lipschitz_upper_bound() * (1 + 1e-12)


def test_inline_params():
    spec = plugin.sll_spec()
    layer = spec.factory(4, 4, 1, 1, **spec.resolve_params({"kernel": 3, "inner_factor": 2}))
    assert tuple(layer.weight.shape) == (8, 4, 3, 3)
    with pytest.raises(ValueError, match=r"kernel must be an odd number in 1\.\.15 \(or 0\)"):
        spec.resolve_params({"kernel": 2})  # the declared range, before any layer is built
    with pytest.raises(ValueError, match="odd kernel"):
        spec.factory(4, 4, 3, 1, kernel=2)


@pytest.mark.parametrize("params", [None, {"kernel": 3, "inner_factor": 2}])
def test_conformance_checks_pass(params):
    reports = check_conv_spec(plugin.sll_spec(), params=params)
    assert len(reports) == 7 and all(r.sigma_max <= r.bound <= 1 + 1e-9 for r in reports)


class _UnscaledSLL(SLLConv):
    """Deliberately wrong: T omitted (scale 1), yet the bound method says 1."""

    def forward(self, x):
        return sll_residual(self.rearrange(x), self.weight, self.bias, torch.ones_like(self.bias))

    def lipschitz_upper_bound(self) -> float:
        return 1.0


def test_a_layer_without_the_normalisation_is_caught():
    def factory(*args):
        layer = _UnscaledSLL(*args)
        with torch.no_grad():
            layer.weight.normal_()
        return layer

    wrong = ConvSpec(name="sll-wrong", factory=factory, description="SLL without T")
    with pytest.raises(AssertionError, match="declared bound"):
        check_conv_spec(wrong, cases=[(4, 4, 3, 1, 6)])
