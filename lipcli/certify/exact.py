"""``lip certify --exact``: the features, logits and margins of a float64 copy of the model.

The guaranteed Lipschitz bound and the head's certificate are float64 computations already;
what a default run leaves in float32 is the forward pass that produces the features (and, with
the eval lowering, the dense float32 matrices some layers run as).  With ``exact`` the driver
certifies a float64 copy of the model instead (:func:`float64_network`): every parameter and
buffer converted to float64 (exact: each float32 number is a float64 number), every layer in
its literal form (no dense lowering; SOC's series, FFTs, projections evaluated in float64),
inputs converted to float64, so the features and the certificate's margins carry float64
rounding only (relative error around 1e-15 instead of 1e-7).  The certificate itself then runs
on the float64 head (an LLN head normalises its rows in float64).  The Lipschitz bound is
that of the stored weights, computed from the float32 model as in every run.

The float32 model is left untouched; the copy is dropped after the run.  The model file's
certificate cache is neither used nor written by such a run (its fingerprint names the float32
head)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lipcli.lipschitz.bound import body_of
from lipcli.lowering.network import CACHE_ATTRIBUTE

#: the note an exact run adds to its summary
EXACT_NOTE = (
    "--exact: features, logits and margins computed in float64 on a float64 copy of the "
    "model (every layer literal, no dense lowering); the Lipschitz bound is the stored "
    "weights' guaranteed one"
)


class Float64Network(nn.Module):
    """``features(x)``, ``forward(x)`` of a float64 model on inputs of any floating dtype
    (converted to float64 first); the shape the certify driver's lowered network has
    (``dense_layers`` empty: every layer runs literally)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body = body_of(model)
        self.head = model.head
        self.excess: dict[str, float] = {}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.to(torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    @property
    def dense_layers(self) -> list[str]:
        return []


def float64_copy(model: nn.Module) -> nn.Module:
    """A float64 deep copy of the eval-mode ``model`` (config attributes kept, any cached
    eval lowering of the original dropped)."""
    saved = model.__dict__.pop(CACHE_ATTRIBUTE, None)  # not copied: float32 matrices
    try:
        twin = copy.deepcopy(model)
    finally:
        if saved is not None:
            model.__dict__[CACHE_ATTRIBUTE] = saved
    twin.to(torch.float64)
    twin.eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    return twin


def float64_network(model: nn.Module) -> tuple[nn.Module, Float64Network]:
    """``(float64 copy of model, its literal network)`` for an exact certification run."""
    twin = float64_copy(model)
    return twin, Float64Network(twin)
