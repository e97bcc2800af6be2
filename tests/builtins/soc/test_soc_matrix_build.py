"""The build of SOC's dense eval operator (``operator_matrix_with_error``): the im2col
recurrence gives the same matrix as the dense convolution-matrix recurrence, and its
guaranteed float64 error bound ``e >= ||M - P_T(S)||_2`` holds against the EXACT operator
(rational arithmetic)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from lipcli.builtins.soc import export as soc_export
from lipcli.builtins.soc.export import build_plan, conv_matrix, operator_matrix_with_error
from lipcli.builtins.soc.layer import SOC


def _layer(cin: int, cout: int, stride: int, kernel: int = 3, seed: int = 0) -> SOC:
    torch.manual_seed(seed)
    layer = SOC(cin, cout, kernel_size=kernel, stride=stride)
    with torch.no_grad():
        layer.weight.mul_(3.0)  # a trained-looking ||S|| (about 1-2), not the init's
    layer.refresh(50)
    return layer.eval()


def _dense_horner(layer: SOC, shape: tuple[int, int, int]) -> torch.Tensor:
    """The recurrence with the dense convolution matrix (the former build), float64."""
    S = layer.skew_filter().double()
    d = shape[0] * shape[1] * shape[2]
    X = layer._prepare_input(torch.eye(d, dtype=torch.float64).view(d, *shape)).contiguous()
    _, C, h, w = X.shape
    X = X.view(d, -1)
    A_t = conv_matrix(S, h, w).T
    U = X
    for i in range(layer.eval_terms - 1, 0, -1):
        U = torch.addmm(X, U, A_t, alpha=1.0 / i)
    return U.view(d, C, h, w)[:, : layer.out_channels].reshape(d, -1).T


@pytest.mark.parametrize("cin,cout,stride,side,method", [
    (8, 8, 1, 8, "im2col"), (4, 16, 2, 8, "im2col"), (16, 16, 1, 4, "im2col"),
    (8, 32, 2, 4, "dense"), (16, 16, 1, 1, "dense"), (5, 7, 1, 5, "im2col"),
])
def test_im2col_build_equals_the_dense_build(cin, cout, stride, side, method, monkeypatch):
    layer = _layer(cin, cout, stride)
    shape = (cin, side, side)
    assert build_plan(layer, shape)[0] == method
    monkeypatch.setattr(soc_export, "BUILD_CHUNK_BYTES", 4096)  # many chunks
    M, e = operator_matrix_with_error(layer, shape)
    ref = _dense_horner(layer, shape)
    assert M.shape == ref.shape
    assert float((M - ref).abs().max()) <= 1e-12
    assert float(torch.linalg.matrix_norm(M - ref, ord=2)) <= 2 * e  # both within e of P


def _exact_operator(layer: SOC, shape: tuple[int, int, int]) -> list[list[Fraction]]:
    """``P_T(S)`` on the basis in rational arithmetic (rows: basis images), exact."""
    S = layer.skew_filter().double()
    C, k = S.shape[0], S.shape[-1]
    p = k // 2
    _, h, w = shape
    assert C == shape[0] and layer.stride == 1
    taps = [(o, c, a, b, Fraction(float(S[o, c, a, b])))
            for o in range(C) for c in range(C) for a in range(k) for b in range(k)]
    d = C * h * w

    def conv(u: list[Fraction]) -> list[Fraction]:
        out = [Fraction(0)] * d
        for o, c, a, b, s in taps:
            for y in range(h):
                for x in range(w):
                    yy, xx = y + a - p, x + b - p
                    if 0 <= yy < h and 0 <= xx < w:
                        out[(o * h + y) * w + x] += s * u[(c * h + yy) * w + xx]
        return out

    rows = []
    for j in range(d):
        e = [Fraction(int(i == j)) for i in range(d)]
        u = e
        for i in range(layer.eval_terms - 1, 0, -1):
            u = [x + y / i for x, y in zip(e, conv(u))]
        rows.append(u)
    return rows


@pytest.mark.parametrize("cin,side,method", [(2, 4, "im2col"), (3, 2, "dense")])
def test_error_bound_holds_against_the_exact_operator(cin, side, method):
    layer = _layer(cin, cin, 1, seed=cin)
    shape = (cin, side, side)
    assert build_plan(layer, shape)[0] == method
    M, e = operator_matrix_with_error(layer, shape)
    exact = _exact_operator(layer, shape)
    # M - P exactly (each difference of a float64 and a rational, then rounded: relative 1e-16)
    diff = torch.tensor([[float(Fraction(float(M[r, j])) - exact[j][r]) for j in range(M.shape[1])]
                         for r in range(M.shape[0])], dtype=torch.float64)
    actual = float(torch.linalg.matrix_norm(diff, ord=2))
    assert actual <= e
    assert e < 1e-12  # and the bound is a float64 rounding bound, not a loose one


def test_the_suites_build_memo_reuses_only_the_same_call(memo_soc_build):
    """The suite's session memo of this build (tests/conftest.py ``memo_soc_build``) gives the
    build of the same layer state and input shape, and builds again when the weights, the
    power vectors (σ) or the shape change."""
    layer, shape = _layer(4, 4, 1), (4, 4, 4)
    first, e1 = soc_export.operator_matrix_with_error(layer, shape)
    again, e2 = soc_export.operator_matrix_with_error(layer, shape)
    real, e = operator_matrix_with_error(layer, shape)  # the module's function itself
    assert torch.equal(first, real) and torch.equal(again, real) and e1 == e2 == e
    again.zero_()  # a caller's copy: the memo keeps its own
    assert torch.equal(soc_export.operator_matrix_with_error(layer, shape)[0], real)
    def vectors():  # the power vectors: sigma, hence S, moves with them
        for v in layer.buffers():
            v.add_(0.1)

    for change in (lambda: layer.weight.add_(0.01), vectors):
        with torch.no_grad():
            change()
        got, e_got = soc_export.operator_matrix_with_error(layer, shape)
        want, e_want = operator_matrix_with_error(layer, shape)
        assert torch.equal(got, want) and e_got == e_want and not torch.equal(got, real)
        real = want
    other = (4, 3, 3)
    assert torch.equal(soc_export.operator_matrix_with_error(layer, other)[0],
                       operator_matrix_with_error(layer, other)[0])
