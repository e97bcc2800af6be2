"""SOC layer (SPEC §1, §5): orthogonality by dense Jacobians, adjoint/skew identities, the
fast gradient against closed forms and autograd, Lipschitz bounds, state round trips."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.functional import jacobian

from lipcli.builtins.soc import filters, series, settings
from lipcli.builtins.soc import layer as soc_layer
from lipcli.builtins.soc import plugin as soc_plugin
from lipcli.builtins.soc.filters import transpose_filter
from lipcli.builtins.soc.layer import SOC
from lipcli.builtins.soc.plugin import lip_convolutions
from lipcli.builtins.soc.series import soc_series, soc_series_fast, truncated_exp_norm_bound
from lipcli.numerics.conv import conv_reshape
from lipcli.sdk.specs import ConvSpec


def make_layer(c_in, c_out, k, s, seed=0, dtype=torch.float64, **kw) -> SOC:
    torch.manual_seed(seed)
    layer = SOC(c_in, c_out, k, s, **kw).to(dtype)
    layer.refresh(50)
    return layer


def dense_jacobian(layer: SOC, shape: tuple[int, int, int]) -> torch.Tensor:
    """Jacobian of the (affine) layer: push the identity basis through it in one batch and
    subtract the bias response (cross-checked against autograd in a test below)."""
    n = math.prod(shape)
    basis = torch.eye(n, dtype=torch.float64).view(n, *shape)
    with torch.no_grad():
        out = layer(basis) - layer(torch.zeros((1, *shape), dtype=torch.float64))
    return out.reshape(n, -1).T


def test_dense_jacobian_helper_matches_autograd():
    layer = make_layer(2, 8, 3, 2).eval()
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    J = jacobian(lambda t: layer(t), x).reshape(-1, 32)
    torch.testing.assert_close(dense_jacobian(layer, (2, 4, 4)), J, rtol=1e-12, atol=1e-12)


def dense_conv_operator(kernel: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """Matrix of x ↦ conv2d(x, kernel, padding=k//2) on (in, H, W); differentiable in kernel."""
    o, i, kh, _ = kernel.shape
    n = i * H * W
    basis = torch.eye(n, dtype=kernel.dtype).view(n, i, H, W)
    return F.conv2d(basis, kernel, padding=kh // 2).reshape(n, -1).T


def spectral_norm(M: torch.Tensor) -> float:
    return float(torch.linalg.svdvals(M)[0])


# ---------------------------------------------------------------- filter identities
@pytest.mark.parametrize("shape", [(5, 3, 3, 3), (3, 5, 1, 1), (4, 4, 5, 5)])
def test_transpose_filter_is_the_adjoint(shape):
    gen = torch.Generator().manual_seed(0)
    K = torch.randn(shape, generator=gen, dtype=torch.float64)
    o, i, k, _ = shape
    x = torch.randn(2, i, 6, 7, generator=gen, dtype=torch.float64)
    y = torch.randn(2, o, 6, 7, generator=gen, dtype=torch.float64)
    lhs = (F.conv2d(x, K, padding=k // 2) * y).sum()
    rhs = (x * F.conv2d(y, transpose_filter(K), padding=k // 2)).sum()
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)
    assert transpose_filter(K).shape == (i, o, k, k)
    assert torch.equal(transpose_filter(K)[1, 2, 0, k - 1], K[2, 1, k - 1, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(40, 40, 3, 3), (30, 30, 1, 1), (24, 24, 5, 5)])
def test_minus_transpose_matches_direct_formula(shape, dtype):
    """Bit-identical to ``X − T(X)`` (so the skew filter is exactly skew) whichever path
    is taken; with a scale, equal up to rounding."""
    gen = torch.Generator().manual_seed(2)
    X = torch.randn(shape, generator=gen, dtype=dtype)
    direct = X - transpose_filter(X)
    got = filters._minus_transpose(X)
    assert torch.equal(got, direct)
    assert torch.equal(transpose_filter(got), -got)
    assert got.is_contiguous()
    assert got._base is None  # not a view: _NormalisedSkew scales it in place
    scale = torch.tensor(0.37, dtype=dtype)
    torch.testing.assert_close(filters._minus_transpose(X, scale), direct * scale)


def test_minus_transpose_falls_back_when_matmul_precision_is_reduced():
    """The batched-product form is exact only for full-precision products: with a reduced
    float32 matmul precision the plain subtraction is used (still bit-identical)."""
    X = torch.randn(16, 16, 3, 3, generator=torch.Generator().manual_seed(3))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert not filters._exact_cpu_matmul()
        assert torch.equal(filters._minus_transpose(X), X - transpose_filter(X))
    finally:
        torch.set_float32_matmul_precision(before)
    assert filters._exact_cpu_matmul()


@pytest.mark.parametrize("k", [1, 3])
def test_skew_filter_gives_a_skew_operator(k):
    layer = make_layer(4, 6, k, 1)
    S = layer.skew_filter()
    assert torch.equal(transpose_filter(S), -S)  # exactly, also in floating point
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 5, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(3, 6, 5, 5, generator=gen, dtype=torch.float64)
    Sx = F.conv2d(x, S, padding=k // 2)
    Sy = F.conv2d(y, S, padding=k // 2)
    torch.testing.assert_close((Sx * y).sum(), -(x * Sy).sum(), rtol=1e-12, atol=1e-12)
    # S = A / sigma with sigma = the smallest power estimate of the four reshape norms
    reshape_norms = [spectral_norm(conv_reshape(S, r)) for r in range(4)]
    assert min(reshape_norms) == pytest.approx(1.0, abs=1e-6)


def test_pixel_unshuffle_channel_order():
    x = torch.arange(2 * 4 * 4, dtype=torch.float64).view(1, 2, 4, 4)
    y = F.pixel_unshuffle(x, 2)
    c, i, j, r, q = 1, 1, 0, 1, 0
    assert y[0, 4 * c + 2 * i + j, r, q] == x[0, c, 2 * r + i, 2 * q + j]


# ---------------------------------------------------------------- orthogonality
CONFIGS = [
    # c_in, c_out, k, stride, H  (square: c_out * (H/s)^2 == c_in * H^2)
    (4, 4, 3, 1, 6),
    (4, 4, 1, 1, 6),
    (2, 8, 3, 2, 8),
    (4, 6, 3, 1, 6),  # channel padding: c_in < C
    (6, 4, 3, 1, 6),  # truncation: c_out < C
    (2, 6, 3, 2, 8),  # stride 2 + truncation
    (3, 16, 1, 2, 6),  # stride 2 + padding (C = 16 > 12)
]


@pytest.mark.parametrize("c_in,c_out,k,s,H", CONFIGS)
def test_dense_jacobian_is_orthogonal_at_eval_terms(c_in, c_out, k, s, H):
    layer = make_layer(c_in, c_out, k, s).eval()
    J = dense_jacobian(layer, (c_in, H, H))
    sv = torch.linalg.svdvals(J)
    assert float(sv.max()) <= 1 + 1e-6
    if J.shape[0] == J.shape[1]:
        assert float((sv - 1).abs().max()) <= 1e-6
    elif c_out == layer.channels:  # zero padding only: an isometry on the input space
        assert float((sv - 1).abs().max()) <= 1e-6
    # the guaranteed bound dominates the true norm, the estimate does not exceed it by much
    true = float(sv.max())
    assert layer.lipschitz_upper_bound() >= true
    assert layer.lipschitz_estimate((c_in, H, H), iters=30) <= true * (1 + 1e-9)


@pytest.mark.parametrize("terms", [2, 3, 5])
def test_lipschitz_upper_bound_dominates_with_few_terms_and_no_refresh(terms):
    """Few series terms and un-refreshed power vectors (σ underestimated, ‖S‖ large): the
    layer is then far from orthogonal, and the bound must still hold."""
    torch.manual_seed(3)
    layer = SOC(4, 4, 3, 1, eval_terms=terms).double().eval()
    J = dense_jacobian(layer, (4, 5, 5))
    true = spectral_norm(J)
    bound = layer.lipschitz_upper_bound()
    assert bound >= true
    S = layer.skew_filter()
    b = layer.spectral_bound()
    assert b >= spectral_norm(dense_conv_operator(S, 5, 5))


def test_truncated_exp_norm_bound():
    gen = torch.Generator().manual_seed(4)
    X = torch.randn(30, 30, generator=gen, dtype=torch.float64)
    K = X - X.T
    for scale in (0.1, 1.0, 3.0, 10.0):
        S = K * (scale / spectral_norm(K))
        for T in (2, 6, 15):
            P = sum(torch.linalg.matrix_power(S, j) / math.factorial(j) for j in range(T))
            assert truncated_exp_norm_bound(scale, T) >= spectral_norm(P)
    # geometric tail formula and fallback
    b, T = 3.0, 15
    tail = b**T / math.factorial(T) / (1 - b / (T + 1))
    assert truncated_exp_norm_bound(b, T) == pytest.approx(1 + tail, rel=1e-11)
    assert truncated_exp_norm_bound(20.0, 6) == pytest.approx(
        sum(20.0**j / math.factorial(j) for j in range(6)), rel=1e-11
    )
    assert truncated_exp_norm_bound(0.0, 15) >= 1.0


# ---------------------------------------------------------------- fast gradient
def pair(c_in, c_out, k, s, dtype, **kw) -> tuple[SOC, SOC]:
    fast = make_layer(c_in, c_out, k, s, dtype=dtype, fast_grad=True, **kw)
    exact = make_layer(c_in, c_out, k, s, dtype=dtype, fast_grad=False, **kw)
    exact.load_state_dict(fast.state_dict())
    return fast, exact


def assert_same_up_to_rounding(a: torch.Tensor, b: torch.Tensor, ulps: int = 4) -> None:
    """Equal, or within a few float32 units of the largest magnitude: the two gradient modes
    compute the same forward, but oneDNN may run the fused convolution-plus-add of one of
    them with another kernel than the plain convolution of the other depending on the
    threads it gets (seen for the 1x1 filter with one thread and on a loaded CPU: 1-2 ulp)."""
    if torch.equal(a, b):
        return
    tol = ulps * torch.finfo(a.dtype).eps * b.abs().max().item()
    torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.parametrize("c_in,c_out,k,s,hw", [
    (3, 8, 3, 1, 8),    # activations outnumber the filter: 1/i on the filter, fused add
    (4, 16, 3, 2, 8),   # filter larger: 1/i on the convolution output
    (8, 8, 1, 1, 8),    # 1×1 filter, fused add
    (8, 8, 1, 1, 1),    # 1×1 filter on 1×1 images: matrix products (addmm)
    (16, 64, 1, 2, 2),  # 1×1, stride 2 onto 1×1 images
])
def test_fast_forward_equal_and_input_grad_exact(c_in, c_out, k, s, hw):
    fast, exact = pair(c_in, c_out, k, s, torch.float32)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, c_in, hw, hw, generator=gen)
    for mode in ("train", "eval"):
        fast.train(mode == "train")
        exact.train(mode == "train")
        xf = x.clone().requires_grad_(True)
        xe = x.clone().requires_grad_(True)
        zf, ze = fast(xf), exact(xe)
        assert_same_up_to_rounding(zf, ze)
        g = torch.randn(zf.shape, generator=gen)
        (zf * g).sum().backward()
        (ze * g).sum().backward()
        torch.testing.assert_close(xf.grad, xe.grad, rtol=1e-5, atol=1e-6)
        for name in ("power_u0", "power_v1", "power_u2", "power_v3"):
            assert torch.equal(getattr(fast, name), getattr(exact, name))
    with torch.no_grad():  # eval under no_grad uses the cache: still the same values
        assert_same_up_to_rounding(fast(x), exact(x))


@pytest.mark.skipif(not series.FUSED_CONV_ADD, reason="no oneDNN fused convolution here")
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("k,fmt", [(3, torch.channels_last), (3, torch.contiguous_format),
                                   (1, torch.channels_last)])
def test_fused_convolution_add_equals_convolution_then_add(sign, k, fmt):
    """The fused oneDNN ``other ± conv(u, K)`` gives the very values of ``conv2d`` followed
    by the add/sub (this is what keeps the two gradient modes bit-identical)."""
    gen = torch.Generator().manual_seed(11)
    u = torch.randn(6, 16, 9, 9, generator=gen).contiguous(memory_format=fmt)
    other = torch.randn(6, 16, 9, 9, generator=gen).contiguous(memory_format=fmt)
    K = torch.randn(16, 16, k, k, generator=gen) / 7
    y = F.conv2d(u, K, padding=k // 2)
    want = other + y if sign > 0 else y - other
    got = series._conv_plus(u, K, other, k // 2, sign=sign)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fused", [True, False])
def test_flop_counter_counts_every_convolution_of_the_eval_series(monkeypatch, fused):
    """torch's flop counter (what ``lip bench certify`` reports) sees every convolution of
    the eval series, also where they run as oneDNN's fused convolution-plus-add."""
    from torch.utils.flop_counter import FlopCounterMode

    if fused and not series.FUSED_CONV_ADD:
        pytest.skip("no oneDNN fused convolution here")
    monkeypatch.setattr(series, "FUSED_CONV_ADD", fused)
    C, hw, batch = 4, 16, 3  # activations outnumber the filter entries: the fused path on CPU
    layer = SOC(C, C, 3).eval()
    x = torch.randn(batch, C, hw, hw)
    with torch.no_grad():
        layer(x)  # the eval filter is cached on the first call
        with FlopCounterMode(display=False) as counter:
            layer(x)
    assert counter.get_total_flops() == 2 * (layer.eval_terms - 1) * C * C * 9 * hw * hw * batch
    ops = {str(op) for op in counter.get_flop_counts()["Global"]}
    assert ("mkldnn._convolution_pointwise" in ops) == fused, ops  # the path under test ran


def test_eval_on_an_eval_layer_keeps_the_cached_filter_and_bound():
    """``.eval()`` on an eval layer (the lowered network calls it) keeps the cached filter and
    bound, so a lowering's matrix and its bound come from one filter; a mode change drops them."""
    layer = SOC(4, 4, 3).eval()
    S, bound = layer.skew_filter(), layer.lipschitz_upper_bound()
    layer.eval()
    assert layer.skew_filter() is S and layer._bound_cache is not None
    layer.train()
    assert layer._op_cache is None and layer._bound_cache is None
    layer.eval()
    assert layer.skew_filter() is not S and layer.lipschitz_upper_bound() == bound


def test_soc_caches_on_lipconvbase_and_its_bound_follows_eval_terms():
    """SOC is a LipConvBase (one cache and invalidation for every convolution), keeps its
    parameter order (weight, bias: optimiser states of checkpoints) and a changed
    ``eval_terms`` recomputes the cached bound instead of returning the stale one."""
    from lipcli.sdk.convbase import LipConvBase

    layer = SOC(4, 4, 3).eval()
    assert isinstance(layer, LipConvBase)
    assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
    b = layer.spectral_bound()
    bound15 = layer.lipschitz_upper_bound()
    assert bound15 == truncated_exp_norm_bound(b, 15)
    layer.eval_terms = 6
    bound6 = layer.lipschitz_upper_bound()
    assert bound6 == truncated_exp_norm_bound(b, 6) and bound6 > bound15


class _FakeInput:
    """Stands in for a tensor where only ``device`` and ``shape`` are read (no GPU here)."""

    def __init__(self, device: str, shape: tuple[int, ...]) -> None:
        self.device, self.shape = torch.device(device), shape


@pytest.mark.parametrize("cuda_flag", [True, False])
def test_working_memory_format_per_device(monkeypatch, cuda_flag):
    """CUDA: channels-last exactly when ``CUDA_CHANNELS_LAST`` (the default); CPU: from
    ``CHANNELS_LAST_MIN_PIXELS`` pixels on, whatever the CUDA setting."""
    monkeypatch.setattr(settings, "CUDA_CHANNELS_LAST", cuda_flag)
    want_cuda = torch.channels_last if cuda_flag else torch.contiguous_format
    for hw in (1, 2, 32):
        assert series._working_format(_FakeInput("cuda", (4, 8, hw, hw))) == want_cuda
    threshold = settings.CHANNELS_LAST_MIN_PIXELS
    assert threshold is not None
    side = math.isqrt(threshold)
    assert series._working_format(torch.empty(2, 4, side, side)) == torch.channels_last
    assert series._working_format(torch.empty(2, 4, side - 1, side - 1)) == torch.contiguous_format
    assert settings.CUDA_CHANNELS_LAST is cuda_flag


def test_cuda_channels_last_default_and_environment_switch():
    """On by default; ``LIPCLI_CUDA_CHANNELS_LAST=0`` turns it off (read once, when the SOC
    built-in is imported: checked in a fresh interpreter, with the series' layout).  One
    interpreter for the four values: before each, every ``lipcli`` module is dropped from
    ``sys.modules``, so that the built-in is imported afresh (torch stays loaded)."""
    import json
    import os
    import subprocess
    import sys

    cases = [(None, True), ("1", True), ("0", False), ("false", False)]
    env = {k: v for k, v in os.environ.items() if k != "LIPCLI_CUDA_CHANNELS_LAST"}
    probe = (
        "import json, os, sys\n"
        "import torch\n"
        "class Cuda:\n"
        "    device, shape = torch.device('cuda'), (2, 4, 8, 8)\n"
        "for value in json.loads(sys.argv[1]):\n"
        "    for name in [m for m in sys.modules if m == 'lipcli' or m.startswith('lipcli.')]:\n"
        "        del sys.modules[name]\n"
        "    os.environ.pop('LIPCLI_CUDA_CHANNELS_LAST', None)\n"
        "    if value is not None:\n"
        "        os.environ['LIPCLI_CUDA_CHANNELS_LAST'] = value\n"
        "    from lipcli.builtins.soc import series, settings\n"
        "    print(settings.CUDA_CHANNELS_LAST, series._working_format(Cuda()) == torch.channels_last)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, json.dumps([value for value, _ in cases])], env=env,
        capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()
    # per value: the setting, and the layout the series then uses
    assert out == [f"{expected} {expected}" for _, expected in cases]


def test_the_environment_is_read_in_one_place():
    """Only :mod:`lipcli.builtins.soc.settings` reads ``LIPCLI_CUDA_CHANNELS_LAST``."""
    import pathlib

    import lipcli

    root = pathlib.Path(lipcli.__file__).parent
    readers = sorted(
        str(p.relative_to(root)) for p in root.rglob("*.py")
        if "LIPCLI_CUDA_CHANNELS_LAST" in p.read_text(encoding="utf-8")
    )
    assert readers == ["builtins/soc/settings.py"]


@pytest.mark.parametrize("c,k,hw", [(8, 3, 8), (8, 1, 8), (16, 3, 2), (8, 1, 1)])
def test_fused_and_plain_fast_gradients_agree(monkeypatch, c, k, hw):
    """float32: the fast gradient computed with fused convolution-plus-add steps agrees with
    the one computed with separate convolutions and adds (values, input and filter
    gradients; without fusion the factor 1/i is applied to the convolution output instead
    of the filter, so only up to rounding)."""
    S = make_layer(c, c, k, 1, dtype=torch.float32).skew_filter().clone()
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(5, c, hw, hw, generator=gen)
    g = torch.randn(5, c, hw, hw, generator=gen)
    results = []
    for fused in (True, False):
        monkeypatch.setattr(series, "FUSED_CONV_ADD", fused and series.FUSED_CONV_ADD)
        xr, Sr = x.clone().requires_grad_(True), S.clone().requires_grad_(True)
        z = soc_series_fast(xr, Sr, 6)
        (z * g).sum().backward()
        results.append((z.detach(), xr.grad, Sr.grad))
    (z1, gx1, gS1), (z2, gx2, gS2) = results
    torch.testing.assert_close(z1, z2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gx1, gx2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gS1, gS2, rtol=1e-5, atol=1e-5)


def test_blocked_minus_transpose_is_bit_identical():
    gen = torch.Generator().manual_seed(13)
    for C in (512, 520):  # any size above the threshold
        X = torch.randn(C, C, 1, 1, generator=gen)
        X0 = X.clone()
        assert X.numel() >= filters._TILE_MIN_ENTRIES  # the blocked path is taken
        want = X - transpose_filter(X)
        assert torch.equal(filters._minus_transpose(X), want)
        assert torch.equal(filters._minus_transpose(X, 0.25), want * 0.25)
        assert torch.equal(X, X0)  # the scaled form scales its copy, not X
        assert filters._minus_transpose(X)._base is None  # not a view: SOC scales it in place


def test_fast_input_gradient_float64_matches_autograd():
    gen = torch.Generator().manual_seed(6)
    S = make_layer(5, 5, 3, 1).skew_filter()
    x = torch.randn(2, 5, 6, 6, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 5, 6, 6, generator=gen, dtype=torch.float64)
    for terms in (2, 6, 15):
        xf = x.clone().requires_grad_(True)
        xe = x.clone().requires_grad_(True)
        (soc_series_fast(xf, S, terms) * g).sum().backward()
        (soc_series(xe, S, terms) * g).sum().backward()
        torch.testing.assert_close(xf.grad, xe.grad, rtol=1e-12, atol=1e-12)


def test_gradcheck_fast_input_gradient():
    S = make_layer(3, 3, 3, 1).skew_filter()
    x = torch.randn(1, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: soc_series_fast(t, S, 6), (x,))


@pytest.mark.parametrize("terms", [2, 4, 6])
def test_filter_gradients_match_closed_forms(terms):
    """Dense check: fast = Σ_{a,b≤T−2} (Sᵀ)^a g (S^b x)ᵀ/((a+1)!(b+1)!), exact = Σ_{a+b≤T−2}
    (Sᵀ)^a g (S^b x)ᵀ/(a+b+1)!, both pulled back to the filter through S ↦ dense(S)."""
    C, H = 3, 4
    S = make_layer(C, C, 3, 1).skew_filter().clone()
    gen = torch.Generator().manual_seed(7)
    N = 3
    x = torch.randn(N, C, H, H, generator=gen, dtype=torch.float64)
    g = torch.randn(N, C, H, H, generator=gen, dtype=torch.float64)
    Sr = S.clone().requires_grad_(True)
    D = dense_conv_operator(Sr, H, H)
    Dd = D.detach()
    X = x.reshape(N, -1).T
    G = g.reshape(N, -1).T
    powS = [torch.linalg.matrix_power(Dd, j) for j in range(terms)]
    fast_dense = torch.zeros_like(Dd)
    exact_dense = torch.zeros_like(Dd)
    for a in range(terms - 1):
        for b in range(terms - 1):
            outer = (powS[a].T @ G) @ (powS[b] @ X).T
            fast_dense += outer / (math.factorial(a + 1) * math.factorial(b + 1))
            if a + b <= terms - 2:
                exact_dense += outer / math.factorial(a + b + 1)
    (want_fast,) = torch.autograd.grad((fast_dense * D).sum(), Sr, retain_graph=True)
    (want_exact,) = torch.autograd.grad((exact_dense * D).sum(), Sr)

    Sf = S.clone().requires_grad_(True)
    (soc_series_fast(x, Sf, terms) * g).sum().backward()
    torch.testing.assert_close(Sf.grad, want_fast, rtol=1e-10, atol=1e-10)
    Se = S.clone().requires_grad_(True)
    (soc_series(x, Se, terms) * g).sum().backward()
    torch.testing.assert_close(Se.grad, want_exact, rtol=1e-10, atol=1e-10)
    if terms == 2:
        torch.testing.assert_close(Sf.grad, Se.grad)


def reference_forward(layer: SOC, x: torch.Tensor, r: int) -> torch.Tensor:
    """Independent SOC forward from the layer's current buffers (SPEC §1.2–1.4): the skew
    filter, σ = u_rᵀ R_r(A) v_r for the reshape r the layer chose (checked to be the
    minimum of the four up to rounding), dense power sum Σ S^j x/j!."""
    W = layer.weight
    A = 0.5 * (W - W.transpose(0, 1).flip(2, 3))
    sig = torch.stack(
        [
            getattr(layer, f"power_u{q}") @ conv_reshape(A, q) @ getattr(layer, f"power_v{q}")
            for q in range(4)
        ]
    )
    assert float(sig[r].detach()) <= float(sig.detach().min()) * (1 + 1e-9)
    S = A / sig[r]
    if layer.stride == 2:
        x = F.pixel_unshuffle(x, 2)
    x = F.pad(x, (0, 0, 0, 0, 0, layer.channels - x.shape[1]))
    terms = layer.train_terms if layer.training else layer.eval_terms
    z, p = x, x
    for j in range(1, terms):
        p = F.conv2d(p, S, padding=layer.kernel_size // 2) / j
        z = z + p
    return z[:, : layer.out_channels] + layer.bias.view(1, -1, 1, 1)


def test_training_forward_and_exact_gradient_match_reference():
    """Power step then σ with vectors held constant; the exact mode equals autograd through
    an independent dense-power implementation (also checks the σ gradient path)."""
    layer = make_layer(3, 8, 3, 2, fast_grad=False).train()
    ref = copy.deepcopy(layer)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 6, 6, generator=gen, dtype=torch.float64)
    before = layer.power_v0.clone()
    z = layer(x)
    assert not torch.equal(layer.power_v0, before)  # one power step per training forward
    with torch.no_grad():
        ref_vecs = {n: b for n, b in layer.named_buffers()}
        for n, b in ref.named_buffers():
            b.copy_(ref_vecs[n])
    zr = reference_forward(ref, x, layer.last_sigma_reshape)
    torch.testing.assert_close(z, zr, rtol=1e-10, atol=1e-10)
    g = torch.randn(z.shape, generator=gen, dtype=torch.float64)
    (z * g).sum().backward()
    (zr * g).sum().backward()
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(layer.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("k", [1, 3])
def test_power_step_matches_direct_power_iteration_on_all_four_reshapes(k):
    """One power step on the four reshapes (R0, R2: v then u; R1, R3: u then v) computed
    directly on materialised reshapes equals the layer's fused implementation."""
    layer = make_layer(3, 5, k, 1)
    D = filters._skew_difference(layer.weight.detach())
    before = {n: b.clone() for n, b in layer.named_buffers()}
    got = layer._power_iterate(D, 1)
    for r in range(4):
        M = conv_reshape(D, r)
        u, v = before[f"power_u{r}"], before[f"power_v{r}"]
        if r in (0, 2):
            v = M.T @ u
            v = v / v.norm()
            u = M @ v
            rho = u.norm()
            u = u / rho
        else:
            u = M @ v
            u = u / u.norm()
            v = M.T @ u
            rho = v.norm()
            v = v / rho
        torch.testing.assert_close(got[r][1], u, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[r][2], v, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[r][0], rho, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[r][0], u @ M @ v, rtol=1e-10, atol=1e-12)
        assert torch.equal(getattr(layer, f"power_u{r}"), got[r][1])


@pytest.mark.parametrize("r", [0, 1, 2, 3])
def test_normalised_skew_gradient_for_each_reshape(r):
    """The hand-written backward of S = D/(uᵀR_r(D)v), D = W − T(W), equals autograd."""
    C, k = 4, 3
    gen = torch.Generator().manual_seed(10 + r)
    W = torch.randn(C, C, k, k, generator=gen, dtype=torch.float64, requires_grad=True)
    rows, cols = conv_reshape(W.detach(), r).shape
    u = torch.randn(rows, generator=gen, dtype=torch.float64)
    v = torch.randn(cols, generator=gen, dtype=torch.float64)
    G = torch.randn(C, C, k, k, generator=gen, dtype=torch.float64)
    D_ref = W - transpose_filter(W)
    S_ref = D_ref / (u @ conv_reshape(D_ref, r) @ v)
    (want,) = torch.autograd.grad((S_ref * G).sum(), W)
    D = filters._skew_difference(W.detach())
    rho = u @ conv_reshape(D, r) @ v
    eu, ev = filters._rank_one_factors(r, u, v, C, k)
    S = filters._NormalisedSkew.apply(W, D, rho, [(eu, ev)])
    torch.testing.assert_close(S, S_ref.detach(), rtol=1e-12, atol=1e-12)
    (got,) = torch.autograd.grad((S * G).sum(), W)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def soc_stack(fast: bool, width: int, seed: int = 0) -> torch.nn.ModuleList:
    """LipConvnet-5-shaped SOC stack (SPEC §3) at a reduced width."""
    torch.manual_seed(seed)
    w = width
    layers = [SOC(3, w, 3, 1, fast_grad=fast)]
    c = w
    for _ in range(4):
        layers.append(SOC(c, 4 * c, 3, 2, fast_grad=fast))
        c = 2 * c
    layers.append(SOC(c, 4 * c, 1, 2, fast_grad=fast))
    mods = torch.nn.ModuleList(layers)
    for m in mods:
        m.refresh(50)
    return mods


def run_stack(layers, head, x):
    h = layers[0](x)
    a, b = h.chunk(2, dim=1)
    h = torch.cat([torch.maximum(a, b), torch.minimum(a, b)], dim=1)
    for layer in layers[1:]:
        h = layer(h)
        a, b = h.chunk(2, dim=1)
        h = torch.maximum(a, b)
    return head(h.flatten(1))


def test_fast_gradient_cosine_on_a_stack():
    width = 8
    fast = soc_stack(True, width)
    exact = soc_stack(False, width)
    exact.load_state_dict(fast.state_dict())
    torch.manual_seed(1)
    head = torch.nn.Linear(32 * width, 10)
    gen = torch.Generator().manual_seed(9)
    x = torch.rand(16, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    F.cross_entropy(run_stack(fast, head, x), y).backward()
    head.zero_grad()
    F.cross_entropy(run_stack(exact, head, x), y).backward()
    flat_f, flat_e = [], []
    for lf, le in zip(fast, exact):
        cos = F.cosine_similarity(lf.weight.grad.flatten(), le.weight.grad.flatten(), dim=0)
        assert float(cos) >= 0.99
        torch.testing.assert_close(lf.bias.grad, le.bias.grad, rtol=1e-4, atol=1e-6)
        flat_f.append(lf.weight.grad.flatten())
        flat_e.append(le.weight.grad.flatten())
    assert float(F.cosine_similarity(torch.cat(flat_f), torch.cat(flat_e), dim=0)) >= 0.99


# ---------------------------------------------------------------- state and caching
def test_state_dict_round_trip():
    src = make_layer(4, 16, 3, 2, seed=1, dtype=torch.float32)
    keys = set(src.state_dict())
    assert {"weight", "bias"} | {f"power_{a}{r}" for a in "uv" for r in range(4)} == keys
    dst = SOC(4, 16, 3, 2, fast_grad=False)  # other gradient mode, other random init
    dst.load_state_dict(src.state_dict())
    x = torch.randn(2, 4, 8, 8)
    src.eval(), dst.eval()
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))
    assert src.lipschitz_upper_bound() == dst.lipschitz_upper_bound()
    src.train(), dst.train()
    assert torch.equal(src(x), dst(x))


def test_eval_cache_reuse_and_invalidation(monkeypatch):
    layer = make_layer(4, 4, 3, 1, dtype=torch.float32).eval()
    calls = []
    original = SOC._compute_S

    def counting(self, steps):
        calls.append(steps)
        return original(self, steps)

    monkeypatch.setattr(SOC, "_compute_S", counting)
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        y1 = layer(x)
        y2 = layer(x)
    assert torch.equal(y1, y2) and len(calls) == 1
    with torch.no_grad():  # an optimiser-style in-place update invalidates the cache
        layer.weight.add_(0.01)
        y3 = layer(x)
    assert len(calls) == 2 and not torch.equal(y1, y3)
    layer.refresh(5)
    with torch.no_grad():
        y4 = layer(x)
    assert len(calls) == 3
    state = copy.deepcopy(layer.state_dict())
    with torch.no_grad():
        layer.weight.mul_(2.0)
    layer.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(layer(x), y4)
    assert len(calls) == 4
    # eval with gradients to the weight recomputes S (same values) and gives weight grads
    y = layer(x)
    assert torch.equal(y.detach(), y4)
    y.sum().backward()
    assert layer.weight.grad is not None and float(layer.weight.grad.abs().sum()) > 0


# ---------------------------------------------------------------- plugin hook
def test_hook_specs_and_factories():
    specs = {spec.name: spec for spec in lip_convolutions()}
    assert set(specs) == {"soc-fast", "soc"}
    for name, fast in (("soc-fast", True), ("soc", False)):
        spec = specs[name]
        assert isinstance(spec, ConvSpec)
        assert "orthogonal" in spec.promises
        params = spec.resolve_params()
        assert params == {"train_terms": 6, "eval_terms": 15, "power_iters": 1}
        assert all(p.help for p in spec.params)
        layer = spec.factory(3, 32, 3, 1, **params)
        assert isinstance(layer, SOC) and layer.fast_grad is fast
        assert layer.weight.shape == (32, 32, 3, 3) and layer.bias.shape == (32,)
    layer = specs["soc-fast"].factory(512, 2048, 1, 2, **specs["soc-fast"].resolve_params())
    assert layer.weight.shape == (2048, 2048, 1, 1)
    assert hasattr(soc_plugin.lip_convolutions, "lipcli_impl")


def test_freshly_built_layer_evaluates_sensibly():
    """A new layer in eval mode (no refresh by the caller) has σ > 0 and an orthogonal-ish S."""
    from lipcli.builtins.soc.layer import SOC

    for seed in range(5):
        torch.manual_seed(seed)
        layer = SOC(16, 16, 3, 1).eval()
        x = torch.randn(2, 16, 8, 8)
        with torch.no_grad():
            y = layer(x) - layer.bias.view(1, -1, 1, 1)
        assert torch.isfinite(y).all()
        ratio = (y.norm() / x.norm()).item()
        assert 0.9 < ratio < 1.1, ratio


def test_device_side_sigma_selection_gives_the_same_values_and_gradients(monkeypatch):
    """The GPU branch of the σ selection (argmin on the device, one-hot rank-one terms) gives
    the host branch's filter and weight gradient exactly (run here on CPU by forcing it)."""
    results = []
    for on_host in (True, False):
        monkeypatch.setattr(soc_layer, "_select_on_host", lambda device, v=on_host: v)
        for k in (1, 3):
            layer = make_layer(6, 6, k, 1, seed=3, dtype=torch.float32).train()
            x = torch.randn(2, 6, 5, 5, generator=torch.Generator().manual_seed(1))
            y = layer(x)
            y.square().sum().backward()
            results.append((y.detach(), layer.weight.grad.clone(), layer.last_sigma_reshape))
    for (y0, g0, r0), (y1, g1, r1) in zip(results[:2], results[2:]):
        assert torch.equal(y0, y1) and torch.equal(g0, g1) and r0 == r1
