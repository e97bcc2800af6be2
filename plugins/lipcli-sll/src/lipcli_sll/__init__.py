"""lipcli-sll: a lipcli plugin providing the ``sll`` convolution.

SLL (Araujo et al., ICLR 2023): the residual layer ``h(x) = x − 2 W T⁻¹ ReLU(Wᵀx + b)`` with
``T = diag(Σ_j |WᵀW|_ij q_j/q_i)``, 1-Lipschitz by the SDP condition ``WᵀW ⪯ T``.  Also
:class:`SLLDense`, the dense layer (importable; lipcli has no dense-layer plugin kind).
"""

from __future__ import annotations

__version__ = "0.1.0"

from .conv import SLLConv  # noqa: E402
from .core import sll_bound, sll_gram, sll_residual, sll_scale, sll_t  # noqa: E402
from .dense import SLLDense  # noqa: E402

__all__ = ["__version__", "SLLConv", "SLLDense", "sll_bound", "sll_gram", "sll_residual",
           "sll_scale", "sll_t"]
