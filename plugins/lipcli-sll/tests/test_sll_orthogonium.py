"""An independent implementation: orthogonium (``pip install orthogonium``; skipped when it is
absent, it is not a dependency).  Same weights, float64, outputs equal to 1e-10.

* dense: ``orthogonium.layers.conv.SLL.SDPBasedLipschitzDense`` computes
  ``x − 2Kᵀ(t ⊙ ReLU(Kx + b))`` with ``t = 1/Σ_j |KKᵀ|_ij q_j/q_i``, ``q = exp(q_param)``:
  exactly :class:`lipcli_sll.SLLDense` with ``log_q = q_param``.
* convolution: ``SDPBasedLipschitzResBlock`` folds ``T`` into the filter instead (an AOL
  reparametrisation ``K̃ = T^{-1/2} K`` of the hidden channels, whose own ``q`` cancels, i.e.
  ``q = 1``) and computes ``x − 2 C̃ᵀ ReLU(C̃x + b̃)``.  ReLU is positively homogeneous, so
  ``C̃ᵀ ReLU(C̃x + b̃) = Cᵀ T⁻¹ ReLU(Cx + T^{1/2} b̃)``: the same map as
  :class:`lipcli_sll.SLLConv` with ``log_q = 0`` and bias ``b = T^{1/2} b̃``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("orthogonium.layers.conv.SLL", reason="orthogonium is not installed")

from orthogonium.layers.conv.SLL import SDPBasedLipschitzDense, SDPBasedLipschitzResBlock  # noqa: E402

from lipcli_sll import SLLConv, SLLDense, sll_t  # noqa: E402


def test_dense_equals_orthogonium():
    torch.manual_seed(0)
    theirs = SDPBasedLipschitzDense(6, 6, inner_dim=9).double()
    ours = SLLDense(6, 9).double().eval()
    with torch.no_grad():
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias.reshape(-1))
        ours.log_q.copy_(theirs.q)  # orthogonium draws q ~ N(0, 1): q far from 1 is covered
    x = torch.randn(5, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("k, inner", [(3, 1), (3, 2), (1, 1)])
def test_conv_equals_orthogonium(k, inner):
    torch.manual_seed(k + inner)
    theirs = SDPBasedLipschitzResBlock(4, inner, kernel_size=k).double()
    raw = theirs.parametrizations.kernel.original.detach()
    ours = SLLConv(4, 4, k, 1, inner_factor=inner).double().eval()
    with torch.no_grad():
        ours.weight.copy_(raw)
        t = sll_t(raw, torch.zeros(raw.shape[0], dtype=torch.float64))
        ours.bias.copy_(theirs.bias.reshape(-1) * t.sqrt())  # b = T^{1/2} b~ (module docstring)
    x = torch.randn(3, 4, 7, 7, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-10)
