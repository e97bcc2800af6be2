"""``lipresnet-<n>`` (built in, beside ``lipconvnet-<n>``): LipConvnet-n with the LOT authors'
convex-combination residuals
(Xu et al., NeurIPS 2022; ``AI-secure/Layerwise-Orthogonal-Training``, ``lip_convnets.py``:
``ResLayer`` and ``LipResNet``, selected by ``train_robust.py --residual``).

The authors' ``ResLayer`` of ``b`` blocks runs an input block, then ``b − 2`` hidden blocks
each as ``x ← λ·x + (1 − λ)·block(x)`` with ``λ = sigmoid(0) = 0.5`` fixed
(``res_lamda_logit = 0``, ``requires_grad = False``), then the output (strided) block; with
``b ≤ 2`` it is LipConvnet's layer.  Here, on lipcli's LipConvnet layout
(:mod:`lipcli.builtins.lipconvnet.network`): in every block, its same-shape
convolution-and-activation pairs ``i = 2 .. b−1`` (``block{k}_conv{i}`` + ``block{k}_act{i}``;
in the last, 1×1 block ``block{k}_act{i}`` + ``block{k}_conv{i}``) become
``block{k}_res{i}`` = :class:`ConvexResidual`; pair 1 stays plain, as the authors' input
block, and the strided convolution is their output block.  So LipResNet-5 and -10 equal
LipConvnet-5 and -10, and each block of LipResNet-``n`` has ``n/5 − 2`` residuals.

The residual block and its guaranteed bound ``a + c·Π U_j`` (proof in the module) are
:class:`lipcli.sdk.residual.ConvexResidual`, shared with plugins (lipcli-lot's
``lot-lipresnet-<n>``); its names stay importable here.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from torch import nn

from lipcli.builtins.lipconvnet.network import LipConvnet
from lipcli.sdk.residual import AUTHORS_MIX, ConvexResidual, layer_bound, mix_weights  # noqa: F401

_PAIR = re.compile(r"^block(\d+)_(conv|act)(\d+)$")


def residual_pairs(names: list[str]) -> dict[str, tuple[str, str]]:
    """``{first layer: (residual name, second layer)}`` for the pairs ``i ≥ 2`` of every
    block (module docstring); the two layers of a pair are adjacent in ``names``."""
    pairs: dict[str, tuple[str, str]] = {}
    for first, second in zip(names, names[1:]):
        m1, m2 = _PAIR.match(first), _PAIR.match(second)
        if not (m1 and m2) or m1.group(1) != m2.group(1) or m1.group(3) != m2.group(3):
            continue
        if m1.group(2) == m2.group(2) or int(m1.group(3)) < 2:
            continue
        pairs[first] = (f"block{m1.group(1)}_res{m1.group(3)}", second)
    return pairs


class LipResNet(LipConvnet):
    """LipConvnet-``depth`` whose same-shape pairs ``i ≥ 2`` are :class:`ConvexResidual`
    blocks with weight ``mix`` (module docstring); everything else is LipConvnet's."""

    def __init__(self, *, depth: int, mix: float = AUTHORS_MIX, **kwargs: Any) -> None:
        super().__init__(depth=depth, **kwargs)
        if not 0.0 <= float(mix) <= 1.0:
            raise ValueError(f"mix must be in [0, 1], got {mix}")
        self.mix = float(mix)
        children = OrderedDict(self.body.named_children())
        self._pairs = residual_pairs(list(children))
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        skip: set[str] = set()
        for name, child in children.items():
            if name in skip:
                continue
            if name in self._pairs:
                res_name, second = self._pairs[name]
                inner = nn.Sequential(OrderedDict([(name, child), (second, children[second])]))
                layers[res_name] = ConvexResidual(inner, self.mix)
                skip.add(second)
            else:
                layers[name] = child
        self.body = nn.Sequential(layers)

    def describe(self, input_shape: tuple[int, int, int] | None = None
                 ) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
        """LipConvnet's rows with each residual pair's two rows merged into one."""
        rows = super().describe(input_shape)
        seconds = {second: first for first, (_res, second) in self._pairs.items()}
        merged: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        start: dict[str, tuple[int, ...]] = {}
        for name, shape_in, shape_out in rows:
            if name in self._pairs:
                start[name] = shape_in
            elif name in seconds:
                first = seconds[name]
                merged.append((self._pairs[first][0], start[first], shape_out))
            else:
                merged.append((name, shape_in, shape_out))
        return merged
