"""Test tables derived from the installed plugin distributions (their ``lipcli`` entry points),
as timm's tests parametrise over ``list_models()``: every convolution an installed
distribution provides gets the conformance tests of ``tests/plugins`` by being installed
(``.ci/run`` installs every ``plugins/*/``); nothing here names a plugin."""

from __future__ import annotations

import torch
from torch import nn

from lipcli.sdk.fourier import FourierConvBase
from lipcli.testing import InstalledComponent, installed_components, randomise_parameters

#: conv name -> the installed component (built-ins left out)
CONVS: dict[str, InstalledComponent] = installed_components("conv")


def build_conv(name: str, cin: int, cout: int, k: int, stride: int, *, dtype=torch.float32,
               seed: int = 0, size: tuple[int, int] | None = None) -> nn.Module:
    """The installed conv ``name`` with its default parameters, every parameter redrawn from
    ``seed`` (unlike its initialisation), in eval mode; run once on a ``size`` image (default
    the kernel's) so that layers recording their image size have one."""
    spec = CONVS[name].spec
    layer = spec.factory(cin, cout, k, stride, **spec.resolve_params(None))
    layer = randomise_parameters(layer.to(dtype).eval(), seed)
    h, w = size or (max(k, stride), max(k, stride))
    with torch.no_grad():
        layer(torch.zeros(1, cin, h, w, dtype=dtype))
    return layer


def offers_eval_linear_map(name: str) -> bool:
    """Whether the conv's eval layer offers its map as one matrix (``eval_linear_map``, see
    :mod:`lipcli.sdk.lowering`) on a small image."""
    layer = build_conv(name, 4, 4, 3, 1, size=(4, 4))
    method = getattr(layer, "eval_linear_map", None)
    return callable(method) and method((4, 4, 4)) is not None


#: the installed convs whose layers offer ``eval_linear_map``
LOWERING_CONVS = [name for name in CONVS if offers_eval_linear_map(name)]
#: the installed convs built on the SDK's Fourier-domain base (``lipcli.sdk.fourier``)
FOURIER_CONVS = [name for name in CONVS if isinstance(build_conv(name, 4, 4, 3, 1), FourierConvBase)]
