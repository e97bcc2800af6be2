"""BRO convolution: the block reflector (= the paper's formula, unitary, conjugation), the
Fourier assembly, dense-Jacobian orthogonality at random, perturbed and briefly trained
parameters (float64 and float32 cast exactly to float64), gradients vs finite differences,
the verified float32 bound, the rank parameter, conformance and a wrong layer.

Tolerance of "all singular values are 1" in float64: every ``W(f)`` is unitary to a few
``u = 1.1e-16`` times ``c`` (Householder QR), the FFTs add ``O(u log HW)``; on these tiny
layers the measured defect is below ``2e-15``, so ``1e-9`` leaves a margin of 10⁵ while still
catching any real defect (a non-orthogonal variant is off by ``≥ 1e-3``, see the last test).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lipcli_bro.plugin as plugin
from lipcli.sdk.specs import ConvSpec
from lipcli.testing import affine_matrix, check_conv_spec, randomise_parameters, singular_values
from lipcli_bro import BROConv, block_reflector
from lipcli.sdk.fourier import kernel_spectrum

TOL = 1e-9
#: (in, out, kernel, stride, image size): LipConvnet's configurations (check_conv_spec's)
CASES = [(4, 4, 3, 1, 6), (3, 4, 3, 1, 6), (8, 4, 3, 1, 6), (4, 16, 3, 2, 6), (4, 8, 3, 2, 2),
         (4, 16, 1, 2, 2), (8, 8, 1, 1, 1), (4, 4, 3, 1, 5)]


def assert_orthogonal(layer: BROConv, cin: int, size: int) -> None:
    s = singular_values(layer, (cin, size, size))
    assert float((s - 1).abs().max()) <= TOL, (float(s.min()), float(s.max()))
    assert float(s.max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10


@pytest.mark.parametrize("c, r", [(6, 3), (5, 1), (4, 4), (8, 7)])
def test_block_reflector_is_the_papers_formula_and_unitary(c, r):
    gen = torch.Generator().manual_seed(c * 10 + r)
    V = torch.randn(5, c, r, generator=gen, dtype=torch.complex128)
    W = block_reflector(V)
    direct = torch.eye(c, dtype=V.dtype) - 2 * V @ torch.linalg.solve(V.mH @ V, V.mH)
    torch.testing.assert_close(W, direct, rtol=0, atol=1e-12)
    eye = torch.eye(c, dtype=W.dtype).expand_as(W)
    torch.testing.assert_close(W.mH @ W, eye, rtol=0, atol=1e-13)
    torch.testing.assert_close(W, W.mH, rtol=0, atol=1e-13)  # a reflector is Hermitian
    torch.testing.assert_close(block_reflector(V.conj()), W.conj(), rtol=0, atol=1e-12)
    real = torch.randn(c, r, generator=gen, dtype=torch.float64)
    assert not block_reflector(real).is_complex()


@pytest.mark.parametrize("size", [1, 2, 5, 6])
def test_fourier_assembly_is_the_circular_convolution(size):
    """Without the reflector the Fourier-domain operator is conv2d with circular padding."""
    gen = torch.Generator().manual_seed(size)
    layer = BROConv(3, 4, 3).double().eval()
    K = torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 3, size, size, generator=gen, dtype=torch.float64)
    want = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="circular"), K) if size > 1 else (
        F.linear(x.reshape(2, 3), K.sum((2, 3))).view(2, 4, 1, 1))
    got = layer.apply_operator(x, kernel_spectrum(K, (size, size)))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("c, r", [(6, 3), (5, 1), (4, 4), (8, 7)])
def test_cholesky_factor_gives_the_same_reflector(c, r):
    gen = torch.Generator().manual_seed(c * 10 + r + 1)
    V = torch.randn(5, c, r, generator=gen, dtype=torch.complex128)
    W = block_reflector(V, "cholesky")
    torch.testing.assert_close(W, block_reflector(V, "qr"), rtol=0, atol=1e-12)
    eye = torch.eye(c, dtype=W.dtype).expand_as(W)
    torch.testing.assert_close(W.mH @ W, eye, rtol=0, atol=1e-12)
    real = torch.randn(c, r, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(block_reflector(real, "cholesky"), block_reflector(real), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="factor"):
        block_reflector(V, "lu")


@pytest.mark.parametrize("stride, size", [(1, 4), (2, 4)])
def test_cholesky_factor_trains_and_is_bounded(stride, size):
    """``factor=cholesky``: gradients against finite differences, and the dense Jacobian of
    the layer it trains (eval: the same factor) within the layer's verified bound."""
    layer = randomise_parameters(BROConv(2, 4, 3, stride, rank=2, factor="cholesky").double(), seed=5).train()
    x = torch.randn(1, 2, size, size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, z: torch.func.functional_call(
        layer, {"weight": w, "bias": layer.bias}, (z,)), (layer.weight.detach().requires_grad_(), x),
        fast_mode=True)
    layer.eval()
    s = singular_values(layer, (2, size, size))
    assert float(s.max()) <= layer.lipschitz_upper_bound() < 1 + 1e-10
    with pytest.raises(ValueError, match="factor"):
        BROConv(2, 4, factor="lu")


@pytest.mark.cuda
def test_auto_factor_on_cuda_trains_with_cholesky_and_evaluates_with_qr():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    layer = BROConv(8, 8, 3).cuda()
    twin = BROConv(8, 8, 3, factor="qr").cuda()
    twin.load_state_dict(layer.state_dict())
    x = torch.randn(4, 8, 8, 8, device="cuda")
    layer.train(); twin.train()
    torch.testing.assert_close(layer(x), twin(x), rtol=1e-5, atol=1e-5)
    g1, = torch.autograd.grad(layer(x).square().sum(), layer.weight)
    g2, = torch.autograd.grad(twin(x).square().sum(), twin.weight)
    torch.testing.assert_close(g1, g2, rtol=1e-3, atol=1e-4)
    layer.eval(); twin.eval()
    with torch.no_grad():
        assert torch.equal(layer(x), twin(x))  # eval: Householder QR on every device


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
def test_random_parameters_are_orthogonal(cin, cout, k, stride, size):
    layer = randomise_parameters(BROConv(cin, cout, k, stride).double().eval(), seed=cin + cout + k + stride)
    assert_orthogonal(layer, cin, size)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES[:4])
def test_perturbed_and_trained_parameters_are_orthogonal(cin, cout, k, stride, size):
    """Perturbed around the identity initialisation, then after 5 SGD steps towards a random
    non-orthogonal target map."""
    torch.manual_seed(3)
    layer = BROConv(cin, cout, k, stride).double()
    with torch.no_grad():
        layer.weight.add_(0.3 * torch.randn_like(layer.weight))
    assert_orthogonal(layer.eval(), cin, size)
    before = layer.weight.detach().clone()
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer.train()
    target = torch.nn.Conv2d(cin, cout, 3, stride, 1).double()
    for _ in range(5):
        opt.zero_grad()
        x = torch.randn(4, cin, size, size, dtype=torch.float64)
        loss = ((layer(x) - 3 * target(x).detach()) ** 2).mean()
        loss.backward()
        opt.step()
    assert not torch.allclose(layer.weight, before)
    assert_orthogonal(layer.eval(), cin, size)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES[:5])
def test_float32_parameters_cast_to_float64_are_orthogonal(cin, cout, k, stride, size):
    layer32 = randomise_parameters(BROConv(cin, cout, k, stride), seed=7)
    layer = BROConv(cin, cout, k, stride).double().eval()
    layer.load_state_dict({k_: v.double() for k_, v in layer32.state_dict().items()})  # exact
    assert_orthogonal(layer, cin, size)


def test_float32_bound_covers_the_float32_matrices():
    layer = randomise_parameters(BROConv(8, 8, 3), seed=0).eval()
    with torch.no_grad():
        layer(torch.randn(2, 8, 6, 6))
    bound = layer.lipschitz_upper_bound()
    assert 1.0 <= bound < 1.0 + 1e-4
    op = layer.eval_operator((6, 6)).to(torch.complex128)  # the float32 matrices, exactly
    dense = affine_matrix(lambda z: layer.apply_operator(z, op), (8, 6, 6))
    assert float(torch.linalg.matrix_norm(dense, ord=2)) <= bound


@pytest.mark.parametrize("stride, size", [(1, 4), (2, 4), (1, 1)])
def test_gradients_match_finite_differences(stride, size):
    layer = randomise_parameters(BROConv(2, 4, 3, stride, rank=2).double(), seed=5).train()
    x = torch.randn(1, 2, size, size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, z: torch.func.functional_call(
        layer, {"weight": w, "bias": layer.bias}, (z,)), (layer.weight.detach().requires_grad_(), x),
        fast_mode=True)  # a random projection of the Jacobians (the full check takes minutes)


def test_rank_parameter():
    assert BROConv(8, 8).rank == 4 and BROConv(8, 8, rank=3).rank == 3
    assert BROConv(4, 8, 3, 2).channels == 16 and BROConv(4, 8, 3, 2).rank == 8
    assert BROConv(8, 8, rank_ratio=0.25).rank == 2 and BROConv(8, 8, rank=99).rank == 8
    with pytest.raises(ValueError, match="rank_ratio"):
        BROConv(8, 8, rank_ratio=0.0)
    with pytest.raises(ValueError, match="init"):
        BROConv(8, 8, init="zeros")
    layer = BROConv(4, 4, rank=4).double().eval()  # r = c: W = -I
    x = torch.randn(1, 4, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(layer.linear(x), -x, rtol=0, atol=1e-12)


def test_identity_initialisation_flips_the_first_rank_channels():
    layer = BROConv(4, 4).double().eval()
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(layer.linear(x), torch.cat([-x[:, :2], x[:, 2:]], 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("params", [{}, {"init": "random"}, {"rank": 1, "init": "random"}])
def test_conformance_checks_pass(params):
    reports = check_conv_spec(plugin.bro_spec(), params=params)
    assert len(reports) == 7 and all(abs(r.sigma_min - 1) < 1e-9 for r in reports)


class _Scaled(BROConv):
    """Deliberately wrong: the reflector times 1.001, claiming bound 1."""

    def compute_operator(self, size):
        return super().compute_operator(size) * 1.001

    def operator_bound(self, op, size):
        return 1.0


def test_a_wrong_layer_is_caught():
    wrong = ConvSpec(name="bro-wrong", factory=_Scaled, description="not orthogonal",
                     promises=plugin.bro_spec().promises)
    with pytest.raises(AssertionError, match="declared bound|orthogonal"):
        check_conv_spec(wrong)


def circular_conv_matrix(kernel: torch.Tensor, size: int) -> torch.Tensor:
    """Dense matrix of the circular convolution with ``kernel`` on ``size × size`` images,
    built in the spatial domain (no FFT)."""
    p = kernel.shape[-1] // 2

    def conv(z):
        return F.conv2d(F.pad(z, (p, p, p, p), mode="circular"), kernel) if size > 1 else (
            F.conv2d(z, kernel.sum((2, 3), keepdim=True)))

    return affine_matrix(conv, (kernel.shape[1], size, size))


@pytest.mark.parametrize("cin, cout, size", [(4, 4, 5), (3, 6, 4), (6, 3, 4), (4, 4, 1)])
def test_equals_an_independent_dense_computation(cin, cout, size):
    """The paper's formula applied to the dense (spatial-domain) matrix of the low-rank
    convolution, ``I − 2V(VᵀV)⁻¹Vᵀ`` restricted to the first ``out`` output and ``in`` input
    channels, equals the layer's dense Jacobian to 1e-10 (float64): an implementation
    without FFTs, QR or per-frequency matrices."""
    layer = randomise_parameters(BROConv(cin, cout, 3).double().eval(), seed=cin * cout + size)
    V = circular_conv_matrix(layer.weight, size)  # (c·HW, r·HW)
    eye = torch.eye(V.shape[0], dtype=torch.float64)
    W = eye - 2 * V @ torch.linalg.solve(V.T @ V, V.T)
    hw = size * size
    torch.testing.assert_close(affine_matrix(layer, (cin, size, size)), W[: cout * hw, : cin * hw],
                               rtol=0, atol=1e-10)
