"""The eval lowering's economics (plugin SDK; no torch, so help texts can read them): when a
layer runs as one dense matrix (:func:`lipcli.sdk.lowering.dense_lowering`,
:func:`lipcli.sdk.lowering.pays_off`)."""

from __future__ import annotations

#: a layer is lowered densely only when one matrix product costs at most
#: ``1/DENSE_MIN_GAIN`` of its literal evaluation (the matrix's memory traffic is not
#: counted).  On SOC layers with a 3×3 filter the gain is ``126/(h·w)`` on ``h×w`` images
#: (15 terms): 8×8 images gain 1.97×, 4×4 7.9×, 2×2 32×, 16×16 only 0.49× — 1.5 takes the
#: 8×8 layers, whose float32 matrix product runs faster than their 14 convolutions.
DENSE_MIN_GAIN = 1.5
#: weight of one float64 operation of building a matrix against one float32 operation
#: saved by running it (float64 matrix products run at about half the float32 rate)
BUILD_FLOP_WEIGHT = 2
