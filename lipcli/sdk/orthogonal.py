"""Orthogonal parameters: how a layer declares that a parameter lives on a matrix manifold.

A layer calls :func:`declare_orthogonal` for each such parameter (in ``__init__``, after the
parameter is registered).  Two manifolds:

``"orthogonal"``
    a square ``(…, n, n)`` matrix with ``XᵀX = XXᵀ = I`` (a stack of them when it has leading
    dimensions);
``"stiefel"``
    a row-orthonormal ``(…, n, m)`` matrix, ``n ≤ m``, with ``XXᵀ = I_n`` (a semi-orthogonal
    map ``R^m → R^n``; use ``Xᵀ`` in the forward for an isometry ``R^n → R^m``).

Both are kept by the right action ``X ← X·Q`` with ``Q ∈ SO(m)``, so an optimiser on the
manifold (``so-adam`` of lipcli-lipnext) treats them alike; a Euclidean optimiser simply
ignores the declaration, so nothing else changes for a model that declares none.  What a
declaration does *not* do: it is no proof.  A layer still bounds its Lipschitz constant from
the matrix as stored (``lipcli.numerics.gram_bounds.isometry_norm_upper_bound`` gives
``‖X‖₂ ≤ √(1 + ‖XXᵀ − I‖)`` with every rounding error accounted for).

The declaration lives on the module, as ``no_weight_decay`` does: ``module.lip_orthogonal``
maps the local parameter name to its manifold; :func:`orthogonal_parameters` collects them
with their full names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["MANIFOLDS", "OrthogonalParameter", "declare_orthogonal", "orthogonal_parameters",
           "orthogonality_defect", "random_orthogonal"]

#: the manifolds a parameter can be declared on
MANIFOLDS: tuple[str, ...] = ("orthogonal", "stiefel")


@dataclass(frozen=True)
class OrthogonalParameter:
    """A declared parameter: its full name (as in ``model.named_parameters()``), the
    parameter and its manifold."""

    name: str
    param: nn.Parameter
    manifold: str


def declare_orthogonal(module: nn.Module, name: str, manifold: str = "orthogonal") -> None:
    """Declare ``module``'s parameter ``name`` orthogonal (square) or ``"stiefel"``
    (row-orthonormal, rows ≤ columns); ``ValueError`` for a shape that does not fit."""
    if manifold not in MANIFOLDS:
        raise ValueError(f"manifold must be one of {', '.join(MANIFOLDS)}, got {manifold!r}")
    param = module._parameters.get(name)
    if not isinstance(param, nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no parameter {name!r} to declare")
    if param.dim() < 2:
        raise ValueError(f"parameter {name!r}: a manifold parameter is a (stack of) matrices")
    n, m = param.shape[-2:]
    if manifold == "orthogonal" and n != m:
        raise ValueError(f"parameter {name!r}: an orthogonal matrix is square, got {n}x{m}")
    if manifold == "stiefel" and n > m:
        raise ValueError(f"parameter {name!r}: a Stiefel matrix has rows <= columns, got {n}x{m}")
    declared = dict(getattr(module, "lip_orthogonal", {}))
    declared[name] = manifold
    module.lip_orthogonal = declared


def orthogonal_parameters(model: nn.Module) -> list[OrthogonalParameter]:
    """Every declared parameter of ``model`` (each once, in ``named_parameters`` order)."""
    declared: dict[int, str] = {}
    for module in model.modules():
        for local, manifold in getattr(module, "lip_orthogonal", {}).items():
            param = module._parameters.get(local)
            if param is not None:
                declared[id(param)] = manifold
    return [OrthogonalParameter(name, p, declared[id(p)])
            for name, p in model.named_parameters() if id(p) in declared]


@torch.no_grad()
def orthogonality_defect(X: Tensor) -> float:
    """``max ‖XXᵀ − I‖₂`` over the stack, computed in float64 (a measurement, not a bound:
    the guaranteed bound is ``isometry_norm_upper_bound``)."""
    X = X.detach().to(torch.float64)
    gram = X @ X.mT
    eye = torch.eye(X.shape[-2], dtype=torch.float64, device=X.device)
    return float(torch.linalg.matrix_norm(gram - eye, ord=2).max())


def random_orthogonal(*shape: int, generator: torch.Generator | None = None) -> Tensor:
    """A Haar-random row-orthonormal ``(…, n, m)`` matrix (``n ≤ m``; QR of a Gaussian with
    the sign fix), float32; an initialisation for declared parameters."""
    *lead, n, m = shape
    if n > m:
        raise ValueError(f"rows <= columns needed, got {n}x{m}")
    g = torch.randn(*lead, m, n, dtype=torch.float64, generator=generator)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q.mT.contiguous().to(torch.float32)
