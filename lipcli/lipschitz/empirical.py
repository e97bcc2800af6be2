"""The empirical LOWER bound on ``Lip(g)`` (:func:`empirical_lower_bound`, see
:mod:`lipcli.lipschitz.bound`): a true lower bound found by a short power iteration."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from lipcli._util.records import JsonRecord
from lipcli.lipschitz.bound import EMPIRICAL_LABEL, body_of, model_input_shape


def _random_unit(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    v = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    flat = v.flatten(1)
    return (flat / flat.norm(dim=1, keepdim=True)).view(shape)


@dataclass
class EmpiricalLower(JsonRecord):
    """A true lower bound on ``Lip(g)`` (:func:`empirical_lower_bound`)."""

    value: float
    per_point: list[float]
    points: int
    source: str
    label: str = EMPIRICAL_LABEL


def empirical_lower_bound(
    model: nn.Module,
    data: torch.Tensor | None = None,
    *,
    points: int = 4,
    iters: int = 20,
    step: float = 1e-4,
    seed: int = 0,
    body: nn.Module | None = None,
) -> EmpiricalLower:
    """A true lower bound on ``Lip(g)``: ``max ||g(x+tv) - g(x-tv)|| / (2t)`` (``||v|| = 1``).

    ``v`` is found per point by power iteration on ``J^T J`` (``J v`` by a central float64
    difference, ``J^T u`` by autograd), which drives the ratio towards ``||J(x)||_2``. All
    evaluation is on a float64 copy of the model in eval mode. ``data``: ``(N, C, H, W)``
    images (the first ``points`` are used); random images in ``[0, 1]`` if ``None``.
    ``body``: the feature map to measure (default ``model.body``; the eval lowering's
    :attr:`~lipcli.lowering.network.LoweredNetwork.body` for the operator that runs).
    """
    body64 = copy.deepcopy(body_of(model) if body is None else body).double().eval()
    for p in body64.parameters():
        p.requires_grad_(False)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    gen = torch.Generator().manual_seed(seed)
    if data is None:
        x = torch.rand((points, *model_input_shape(model)), generator=gen, dtype=torch.float64)
    else:
        x = data[:points].detach().to(dtype=torch.float64, device="cpu")
    x = x.to(device)
    n = x.shape[0]
    v = _random_unit(tuple(x.shape), gen, torch.float64, device)

    def ratio(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            diff = (body64(x + step * v) - body64(x - step * v)).flatten(1)
        return diff.norm(dim=1) / (2 * step * v.flatten(1).norm(dim=1)), diff / (2 * step)

    best = torch.zeros(n, dtype=torch.float64, device=device)
    for _ in range(max(1, iters)):
        r, jv = ratio(v)
        best = torch.maximum(best, r)
        xg = x.clone().requires_grad_(True)
        with torch.enable_grad():
            out = body64(xg)
            (w,) = torch.autograd.grad(out, xg, grad_outputs=jv.view_as(out))
        norms = w.flatten(1).norm(dim=1).clamp_min(1e-300)
        v = (w.flatten(1) / norms[:, None]).view_as(x)
    r, _ = ratio(v)
    best = torch.maximum(best, r)
    return EmpiricalLower(
        value=float(best.max()),
        per_point=[float(b) for b in best],
        points=n,
        source="data" if data is not None else "random images in [0, 1]",
    )
