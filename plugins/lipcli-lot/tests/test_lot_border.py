"""LOT's authors' form: the zero border (``border="zero"``: zero-pad by ``k//2``, circular map
on the padded torus, crop), and their ``out × out`` Gram matrix (the same matrix as ours).

Zero border: the layer equals the circular LOT layer on the zero-padded image, cropped (an
independent computation through a circular layer of the padded size); its dense float64
Jacobian has norm at most its bound (pad and crop are norm-1 maps) and is not orthogonal;
the eval lowering's matrix and the export stand-in equal the layer.  The authors' iteration on
``V̂V̂ᴴ + εI`` (written out here as their ``lot_ortho_conv.py`` does it) gives lipcli's matrix
after any number of iterations, for ``out`` above and below ``in``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipcli.testing import affine_matrix, randomise_parameters, singular_values
from lipcli.testing.lowering import check_eval_linear_map
from lipcli_lot import LOTConv, lot_polar

#: (in, out, kernel, stride, image size)
CASES = [(4, 4, 3, 1, 5), (3, 6, 3, 1, 4), (6, 3, 3, 1, 4), (2, 8, 3, 2, 4), (4, 8, 3, 2, 2), (4, 4, 5, 1, 3)]


def zero_layer(cin, cout, k, stride, seed, **params):
    layer = LOTConv(cin, cout, k, stride, border="zero", init="random", **params).double()
    return randomise_parameters(layer, seed=seed).eval()


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
def test_zero_border_is_the_circular_layer_on_the_padded_image_cropped(cin, cout, k, stride, size):
    layer = zero_layer(cin, cout, k, stride, seed=cin + cout)
    circular = LOTConv(cin * stride * stride, cout, k, 1, init="random").double().eval()
    circular.load_state_dict({"weight": layer.weight, "bias": layer.bias, "spatial_size": torch.zeros(2)},
                             strict=True)
    p = k // 2
    x = torch.randn(3, cin, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    z = F.pixel_unshuffle(x, stride) if stride == 2 else x
    want = circular(F.pad(z, (p, p, p, p)))[..., p:-p, p:-p]
    torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cin, cout, k, stride, size", CASES)
def test_zero_border_jacobian_is_within_the_bound_and_not_orthogonal(cin, cout, k, stride, size):
    layer = zero_layer(cin, cout, k, stride, seed=10 * cin + cout, iterations=40)
    s = singular_values(layer, (cin, size, size))
    bound = layer.lipschitz_upper_bound()
    assert float(s.max()) <= bound <= 1.0 + 1e-10
    assert float(s.min()) < 0.99  # a crop of a (semi-)orthogonal map: not orthogonal
    assert layer.spatial_size.tolist() == [size // stride + 2 * (k // 2)] * 2


@pytest.mark.parametrize("cin, cout, k, stride, size", [CASES[0], CASES[3]])
def test_zero_border_lowering_and_export_are_the_layer(cin, cout, k, stride, size):
    layer = zero_layer(cin, cout, k, stride, seed=3)
    x = torch.randn(2, cin, size, size, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)
        exported = layer.export_module()
        torch.testing.assert_close(exported(x), y, rtol=0, atol=1e-10)
    check_eval_linear_map(layer, (cin, size, size), rtol=1e-12)


def authors_polar(V: torch.Tensor, iterations: int, eps: float = 1e-4) -> torch.Tensor:
    """The authors' ``LOT.forward`` matrix: ``S = V̂V̂ᴴ + εI`` (``out × out``), divided by
    ``‖S‖_F + ε``, ``Z`` by their Newton–Schulz loop, ``Z·V̂/√n``."""
    S = V @ V.mH + eps * torch.eye(V.shape[-2], dtype=V.dtype)
    norm = torch.linalg.matrix_norm(S, keepdim=True) + eps
    Y, Z = S / norm, torch.eye(V.shape[-2], dtype=V.dtype).expand_as(S)
    for _ in range(iterations):
        T = 0.5 * (3 * torch.eye(V.shape[-2], dtype=V.dtype) - Z @ Y)
        Y, Z = Y @ T, T @ Z
    return Z @ V / norm.sqrt()


@pytest.mark.parametrize("out, cin", [(6, 2), (2, 6), (4, 4)])
@pytest.mark.parametrize("iterations", [1, 3, 10])
def test_the_authors_out_by_out_form_is_the_same_matrix(out, cin, iterations):
    V = torch.randn(5, out, cin, dtype=torch.complex128, generator=torch.Generator().manual_seed(out + cin))
    want = authors_polar(V, iterations)
    assert float((lot_polar(V, iterations, 1e-4) - want).abs().max()) <= 1e-9 * float(want.abs().max())
    # and it is not the converged polar factor yet (the comparison is not between two limits)
    if iterations == 1:
        assert float((authors_polar(V, 40) - want).abs().max()) > 1e-3


def test_default_form_is_unchanged():
    """Without the new parameter a layer is the circular layer of before."""
    layer = LOTConv(3, 6, 3, 1)
    assert (layer.border, layer.pad) == ("circular", 0)
    assert "border" not in repr(layer)
    with pytest.raises(ValueError, match="border must be one of"):
        LOTConv(3, 6, 3, 1, border="reflect")
