"""BRO's border forms, rank rules and ridge (the BRONet authors' LipConvNet layer).

Borders (``border=`` of the ``bro`` convolution):

* ``"circular"`` (the default): the layer is ``x ↦ irfft2(Ŵ · rfft2 x)`` on the ``H × W``
  torus of its (rearranged) input, an orthogonal map in exact arithmetic.
* ``"zero"`` (the BRONet authors' form, ``lipconvnet/models/layers/bro.py`` and
  ``bronet/models/backbone.py``, ``zero_padding=True``): pad the rearranged input with
  ``p = k//2`` zeros on every side, apply the orthogonal block reflector on the
  ``(H+2p) × (W+2p)`` torus, crop the ``H × W`` interior: ``y = Π C E x`` with ``E`` the
  zero embedding (an isometry, ``‖E‖ = 1``), ``C`` the circular reflector map (``‖C‖ ≤ U``,
  the verified bound of its float matrices) and ``Π`` the crop (a coordinate projection,
  ``‖Π‖ = 1``).  So ``‖Π C E‖ ≤ U``: the layer is 1-Lipschitz in exact arithmetic and its
  guaranteed bound is the same verified ``U`` (computed for the padded size).  It is *not*
  orthogonal: the crop discards the part of ``C E x`` that lands in the border, so its
  singular values lie in ``[0, 1]`` and are not all 1 in general.

Rank rules (``rank_rule=``): ``"ratio"`` (default): ``r = ⌊rank_ratio·c⌋``;
``"lipconvnet"``: the rule of the authors' LipConvNet (``lipconvnet/models/layers/bro.py``,
``BRO.__init__`` and ``mask_mapping``): where the channels differ (``in·s² ≠ out``) the
filter has ``min(in·s², out)`` columns, otherwise ``mask_mapping(c, rank_ratio)``.

Ridge (``ridge=``, the authors' LipConvNet form; default 0: none): the authors' layer solves
with ``G + ε·I``, ``G = V̂ᴴV̂``, ``ε = ridge·mean(diag G)`` (their ``perturb_ratio = 1e-5``),
:func:`ridge_reflector`: ``W_ε = I − 2 V̂ (G + εI)⁻¹ V̂ᴴ``.  With ``V̂ = U Σ Zᴴ`` (thin SVD),
``W_ε = I − U diag(2σ²/(σ² + ε)) Uᴴ``: Hermitian, with eigenvalues 1 (off ``range V̂``) and
``(ε − σ²)/(ε + σ²) ∈ (−1, 1]``, so ``‖W_ε‖₂ ≤ 1`` and every block ``W_ε[:out, :in]`` is a
contraction: the layer is 1-Lipschitz in exact arithmetic, not orthogonal.  Its guaranteed
bound is the same verified ``√(1 + max_f ‖ŴᴴŴ − I‖_F)`` of the float matrices used
(:func:`lipcli.numerics.gram_bounds.isometry_norm_upper_bound` bounds any matrix that way),
near 1 when ``ε ≪ σ_min²`` and at most about ``√2`` per layer when not.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# the zero border (pad ``E``, circular map, crop ``Π``) lives in the SDK, shared with lipcli-lot
from lipcli.numerics.solve import checked_solve
from lipcli.sdk.fourier_border import (BORDERS, ExportedZeroBorder, crop_border, pad_border,  # noqa: F401
                                       zero_border_matrix)

#: how the rank is chosen when ``rank`` is 0
RANK_RULES = ("ratio", "lipconvnet")


def mask_mapping(channels: int, level: float) -> int:
    """The authors' LipConvNet rank of a square (``in·s² = out``) layer with ``c`` channels for
    ``rank_ratio`` ``level`` in ``(0, 1]``: ``c − 1`` at 1, ``(c//4)·3`` at 0.75,
    ``⌊level·c⌋`` otherwise (``c//4`` at 0.25 and ``c//2`` at 0.5 are the same floor)."""
    if level == 1.0:
        return channels - 1
    if level == 0.75:
        return channels // 4 * 3
    return int(math.floor(level * channels))


def rule_rank(rule: str, conv_in: int, out: int, rank_ratio: float) -> int:
    """The rank ``rule`` gives a layer with ``conv_in = in·s²`` and ``out`` channels (not yet
    clipped to ``[1, c]``)."""
    channels = max(conv_in, out)
    if rule == "ratio":
        return int(math.floor(rank_ratio * channels))
    if rule == "lipconvnet":
        return min(conv_in, out) if conv_in != out else mask_mapping(channels, rank_ratio)
    raise ValueError(f"BRO rank_rule must be one of {', '.join(RANK_RULES)}, got {rule!r}")


def ridge_reflector(V: Tensor, ridge: float) -> Tensor:
    """``W_ε = I − 2 V (VᴴV + ε I)⁻¹ Vᴴ`` for a batch ``V`` (``(..., c, r)``), ``ε = ridge ·
    mean(diag VᴴV)`` per matrix (module docstring), computed as the authors' code does (one
    batched solve; :func:`lipcli.numerics.solve.checked_solve` verifies it)."""
    G = V.mH @ V
    eps = G.diagonal(dim1=-2, dim2=-1).mean(dim=-1).mul(ridge)
    eye_r = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    G = G + eps[..., None, None] * eye_r
    eye_c = torch.eye(V.shape[-2], dtype=V.dtype, device=V.device)
    # checked: the batched LAPACK solve raised or returned wrong matrices under several threads
    return eye_c - 2.0 * (V @ checked_solve(G, V.mH, left=True, what="BRO ridge reflector"))


#: ``lip export`` of a ``border="zero"`` BRO layer (the SDK's zero-border stand-in)
ExportedZeroBorderBRO = ExportedZeroBorder
