"""Conformance checks for convolution components (re-exported by :mod:`lipcli.testing`).

* :func:`check_conv_spec` -- a :class:`~lipcli.sdk.specs.ConvSpec` and the modules its factory
  builds in every configuration LipConvnet uses: stride 1 and 2, ``in ≠ out`` channels
  both ways, ``1×1`` filters (also on ``1×1`` images, block 5) and a ``3×3`` filter whose
  stride-2 rearrangement leaves a ``1×1`` image (block 4).  Per configuration: output
  shape, dtype and finiteness (float32), finite gradients in training, deterministic eval
  passes, a safetensors state-dict round trip into a freshly built module, float64, and the
  **Lipschitz claim** against the dense Jacobian of the float64 layer (exact for affine
  layers, which is checked): its largest singular value must not exceed the declared bound
  -- ``lipschitz_upper_bound()`` when the module has one, else 1 when the spec promises
  ``"1-lipschitz"``; a layer with neither fails.  A layer that declares itself non-affine
  (``lip_affine = False``, e.g. SLL's residual ``x − 2W T⁻¹ σ(Wᵀx + b)``) is checked with
  the dense Jacobians at 0 and at random inputs and with ``‖f(a) − f(b)‖/‖a − b‖`` on
  random pairs instead of its (non-existent) matrix.  A spec promising ``"1-lipschitz"`` must
  also stay ``≤ 1``, as built and with every parameter perturbed
  (:func:`lipcli.lipschitz.promises.perturbed_copies`: a learnable scale that starts at 1 fails),
  and one promising ``"orthogonal"`` must have *all* its singular values
  within ``orthogonal_tol`` of 1 (semi-orthogonal for ``in ≠ out``; plus the slack its own
  bound declares, e.g. SOC's series truncation).  The float32 module's own bound is checked
  against its float32 Jacobian with a relative slack of ``float32_slack``.
* :func:`check_conv_network_bound` -- a tiny LipConvnet built with the convolution: its
  guaranteed network bound (:func:`lipcli.lipschitz.bound.guaranteed_upper_bound`, computed on a
  float64 copy) is at least the spectral norm of the dense Jacobian of the feature map at
  random inputs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipcli.sdk.specs import ONE_LIPSCHITZ, ORTHOGONAL, ConvSpec
from lipcli.testing.base import fail
from lipcli.testing.modules import check_state_roundtrip
from lipcli.testing.specs import check_component_spec
from lipcli.host.defaults import DEFAULT_COMPONENTS
from lipcli.host.models import create_model
from lipcli.host.registry import Registry
from lipcli.lipschitz.promises import perturbed_copies
from lipcli.lipschitz.bound import guaranteed_upper_bound

__all__ = [
    "ConvCaseReport", "affine_matrix", "check_conv_network_bound", "check_conv_spec", "conv_cases",
    "is_affine", "jacobian_singular_values", "pair_ratio",
]


@dataclass(frozen=True)
class ConvCaseReport:
    """One configuration checked by :func:`check_conv_spec` (float64 layer)."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    size: int
    sigma_max: float
    sigma_min: float
    bound: float


def conv_cases(channels: int = 4, size: int = 6) -> list[tuple[int, int, int, int, int]]:
    """``(in, out, kernel, stride, image size)`` configurations LipConvnet uses."""
    c = channels
    return [
        (c, c, 3, 1, size),            # inner block convolution
        (3, c, 3, 1, size),            # stem (in < out)
        (2 * c, c, 3, 1, size),        # in > out
        (c, 4 * c, 3, 2, size),        # downsampling of blocks 1-4
        (c, 2 * c, 3, 2, 2),           # block 4: 3×3 filter on the rearranged 1×1 image
        (c, 4 * c, 1, 2, 2),           # block 5 downsampling, 1×1 filter
        (2 * c, 2 * c, 1, 1, 1),       # block 5, 1×1 filter on 1×1 images
    ]


def _batched_jacobian(fn: Any, x: torch.Tensor, outputs: int) -> torch.Tensor:
    """Dense Jacobian ``(outputs, x.numel())`` of a per-sample map ``fn`` at one point ``x``
    (shape ``(1, ...)``): ``outputs`` copies of ``x`` in one batch, one backward pass with
    the identity as output gradient (samples do not interact in a LipConvnet body)."""
    xs = x.detach().expand(outputs, *x.shape[1:]).clone().requires_grad_(True)
    with torch.enable_grad():
        y = fn(xs).reshape(outputs, -1)
        (grad,) = torch.autograd.grad(y, xs, torch.eye(outputs, dtype=y.dtype, device=y.device))
    return grad.reshape(outputs, -1)


@torch.no_grad()
def affine_matrix(
    module: Any, shape: tuple[int, ...], dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The matrix (``outputs × inputs``) of an affine map ``module`` on inputs of ``shape``
    (no batch dim): ``f(e_j) − f(0)`` for all basis vectors ``e_j``, in one batched forward
    pass (exact for affine maps; the bias cancels)."""
    n = math.prod(shape)
    basis = torch.eye(n, dtype=dtype).view(n, *shape)
    out = module(torch.cat([basis, torch.zeros(1, *shape, dtype=dtype)]))
    return (out[:n] - out[n:]).reshape(n, -1).T


def singular_values(module: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """Singular values (float64, descending) of the affine ``module``'s matrix on inputs of
    ``shape`` (:func:`affine_matrix`)."""
    return torch.linalg.svdvals(affine_matrix(module, shape).double())


def randomise_parameters(module: nn.Module, seed: int, scale: float = 1.0) -> nn.Module:
    """Every parameter of ``module`` redrawn ``scale · N(0, 1)`` (in its own dtype) from a
    generator seeded with ``seed``, in place; returns ``module``.  Layers checked only at
    their initialisation hide the bugs of trained weights (large, asymmetric, unnormalised)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def is_affine(module: nn.Module) -> bool:
    """Whether a conv module is an affine map (the default; ``lip_affine = False`` says not)."""
    return bool(getattr(module, "lip_affine", True))


def jacobian_singular_values(
    module: nn.Module, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator,
    points: int = 4,
) -> list[torch.Tensor]:
    """Singular values of the module's dense Jacobian(s) on inputs of ``shape``: its matrix
    for an affine module, else the Jacobians at ``0`` and at ``points`` random inputs (of
    growing scale)."""
    if is_affine(module):
        return [torch.linalg.svdvals(affine_matrix(module, shape, dtype).double())]
    out = []
    for i in range(points + 1):
        x = torch.zeros((1, *shape), dtype=dtype)
        if i:
            x = (0.5 * 2**i) * torch.randn((1, *shape), generator=gen, dtype=dtype)
        with torch.no_grad():
            outputs = module(x).numel()
        out.append(torch.linalg.svdvals(_batched_jacobian(module, x, outputs).double()))
    return out


def pair_ratio(module: nn.Module, shape: tuple[int, ...], gen: torch.Generator, pairs: int = 8) -> float:
    """Largest ``‖f(a) − f(b)‖/‖a − b‖`` over random float64 pairs (near and far)."""
    worst = 0.0
    with torch.no_grad():
        for i in range(pairs):
            a = torch.randn((1, *shape), generator=gen, dtype=torch.float64)
            step = 10.0 ** (1 - i % 4)
            b = a + step * torch.randn((1, *shape), generator=gen, dtype=torch.float64)
            worst = max(worst, float((module(a) - module(b)).norm() / (a - b).norm()))
    return worst


def _declared_bound(module: nn.Module, spec: ConvSpec, label: str) -> float:
    bound_fn = getattr(module, "lipschitz_upper_bound", None)
    if callable(bound_fn):
        value = float(bound_fn())
        if not math.isfinite(value) or value < 0:
            fail(f"{label}: lipschitz_upper_bound() returned {value!r}")
        return value
    if ONE_LIPSCHITZ in spec.promises:
        return 1.0
    fail(f"{label}: the module has no lipschitz_upper_bound() and the spec does not promise "
         f"{ONE_LIPSCHITZ!r}: the network bound cannot use it")
    raise AssertionError  # unreachable


def _roundtrip(module: nn.Module, build: Any, x: torch.Tensor, label: str) -> None:
    check_state_roundtrip(module, build, x, label, seed=987654)


def _check_training(module: nn.Module, case: tuple[int, int, int, int, int], gen: torch.Generator,
                    label: str) -> None:
    """Training mode: output shape, finite float32 values and finite gradients."""
    cin, cout, _k, s, n = case
    module.train()
    x = torch.randn(2, cin, n, n, generator=gen).requires_grad_(True)
    out = module(x)
    expected = (2, cout, n // s, n // s)
    if tuple(out.shape) != expected:
        fail(f"{label}: maps {tuple(x.shape)} to {tuple(out.shape)}, expected {expected}")
    if out.dtype != x.dtype or not torch.isfinite(out).all():
        fail(f"{label}: output is not finite float32")
    out.square().sum().backward()
    grads = [x.grad] + [p.grad for p in module.parameters() if p.requires_grad]
    if any(g is not None and not torch.isfinite(g).all() for g in grads) or x.grad is None:
        fail(f"{label}: missing or non-finite gradients")
    module.zero_grad(set_to_none=True)


def _check_eval32(module: nn.Module, spec: ConvSpec, build: Any, case: tuple[int, int, int, int, int],
                  gen: torch.Generator, label: str, float32_slack: float) -> None:
    """Eval mode: deterministic, state round trip, float32 Jacobian within the declared bound."""
    cin, _cout, _k, _s, n = case
    module.eval()
    x = torch.randn(2, cin, n, n, generator=gen)
    with torch.no_grad():
        first, second = module(x), module(x)
    if not torch.equal(first, second):
        fail(f"{label}: two eval-mode forward passes differ")
    _roundtrip(module, build, x, label)
    bound32 = _declared_bound(module, spec, label)
    sigma32 = max(float(v.max()) for v in
                  jacobian_singular_values(module, (cin, n, n), torch.float32, gen))
    if sigma32 > bound32 * (1.0 + float32_slack):
        fail(f"{label}: float32 layer has Jacobian spectral norm {sigma32:.9g} > its "
             f"declared bound {bound32:.9g}")


def _check_affine(module64: nn.Module, cin: int, n: int, gen: torch.Generator, label: str) -> None:
    """``f(a) + f(b) - f(0) - f(a + b) ≈ 0`` unless the module declares ``lip_affine = False``."""
    a = torch.randn(1, cin, n, n, generator=gen, dtype=torch.float64)
    b = torch.randn(1, cin, n, n, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        zero = module64(torch.zeros_like(a))
        gap = (module64(a) + module64(b) - zero - module64(a + b)).abs().max()
        scale = float(module64(a).abs().max()) + float(module64(b).abs().max()) + 1.0
    if is_affine(module64) and float(gap) > 1e-9 * scale:
        fail(f"{label}: the layer is not affine (f(a)+f(b)-f(0)-f(a+b) = {float(gap):.3g}); "
             "conv components must be affine maps or declare lip_affine = False")


def _check_promises(module64: nn.Module, spec: ConvSpec, shape: tuple[int, int, int], gen: torch.Generator,
                    label: str, seed: int, tols: tuple[float, float], svals: tuple[float, float, float]) -> None:
    """The float64 Jacobian's singular values ``(smax, smin, bound)`` against the spec's
    promises (``tols``: ``(rtol, orthogonal_tol)``) and ``lipschitz_estimate``."""
    rtol, orthogonal_tol = tols
    smax, smin, bound = svals
    if smax > bound * (1.0 + rtol):
        fail(f"{label}: dense-Jacobian spectral norm {smax:.12g} exceeds the declared "
             f"bound {bound:.12g}")
    if ONE_LIPSCHITZ in spec.promises:
        # the promise must hold for every parameter value training can reach, not only
        # at initialisation (lipcli.lipschitz.promises.perturbed_copies), as for pools

        for how, moved in [("parameters as built", module64),
                           *perturbed_copies(module64, shape, seed=seed)]:
            norm = max(float(v.max()) for v in
                       jacobian_singular_values(moved, shape, torch.float64, gen))
            if norm > 1.0 + orthogonal_tol:
                fail(f"{label} with {how}: promises {ONE_LIPSCHITZ!r} but the Jacobian's "
                     f"spectral norm is {norm:.12g}")
    if ORTHOGONAL in spec.promises:
        slack = orthogonal_tol + max(0.0, bound - 1.0)
        if abs(smax - 1.0) > slack or abs(smin - 1.0) > slack:
            fail(f"{label}: promises {ORTHOGONAL!r} but its singular values range over "
                 f"[{smin:.12g}, {smax:.12g}] (tolerance {slack:.3g})")
    estimate = getattr(module64, "lipschitz_estimate", None)
    if callable(estimate):
        est = float(estimate(shape, iters=10))
        if est > bound * (1.0 + 1e-6):
            fail(f"{label}: lipschitz_estimate() = {est:.9g} exceeds the bound {bound:.9g}")


def check_conv_spec(
    spec: ConvSpec,
    *,
    params: dict[str, Any] | None = None,
    channels: int = 4,
    size: int = 6,
    cases: list[tuple[int, int, int, int, int]] | None = None,
    seed: int = 0,
    rtol: float = 1e-9,
    orthogonal_tol: float = 1e-6,
    float32_slack: float = 1e-5,
) -> list[ConvCaseReport]:
    """Check a conv spec and its modules (see the module docstring); one report per case."""
    check_component_spec(spec)
    if not isinstance(spec, ConvSpec):
        fail(f"expected a ConvSpec, got {type(spec).__name__}")
    try:
        resolved = spec.resolve_params(params)
    except (KeyError, ValueError) as exc:
        fail(f"conv {spec.name!r}: parameters {params!r} do not validate: {exc}")
    reports = []
    for case in cases or conv_cases(channels, size):
        cin, cout, k, s, n = case
        label = f"conv {spec.name!r} ({cin}->{cout}, k={k}, stride={s}, {n}x{n} input)"

        def build(cin: int = cin, cout: int = cout, k: int = k, s: int = s) -> nn.Module:
            return spec.factory(cin, cout, k, s, **resolved)

        torch.manual_seed(seed)
        module = build()
        if not isinstance(module, nn.Module):
            fail(f"{label}: the factory must return an nn.Module, got {type(module).__name__}")
        gen = torch.Generator().manual_seed(seed)
        _check_training(module, case, gen, label)
        _check_eval32(module, spec, build, case, gen, label, float32_slack)
        # float64: affine, Jacobian singular values vs the claims
        module64 = copy.deepcopy(module).double().eval()
        bound = _declared_bound(module64, spec, label)
        _check_affine(module64, cin, n, gen, label)
        all_svals = jacobian_singular_values(module64, (cin, n, n), torch.float64, gen)
        smax = max(float(v.max()) for v in all_svals)
        smin = min(float(v.min()) for v in all_svals)
        if not is_affine(module64):
            smax = max(smax, pair_ratio(module64, (cin, n, n), gen))
        _check_promises(module64, spec, (cin, n, n), gen, label, seed, (rtol, orthogonal_tol),
                        (smax, smin, bound))
        reports.append(ConvCaseReport(cin, cout, k, s, n, smax, smin, bound))
    return reports


def check_conv_network_bound(
    conv: str,
    *,
    registry: Registry | None = None,
    arch: str = DEFAULT_COMPONENTS["arch"],
    width: int = 4,
    points: int = 2,
    seed: int = 0,
) -> tuple[float, float]:
    """Build ``arch`` (``width``) with ``conv``; on a float64 copy in eval mode compare the
    guaranteed network bound with the largest spectral norm of the dense Jacobian of the
    feature map at ``points`` random inputs; returns ``(bound, largest norm)``."""

    torch.manual_seed(seed)
    model = create_model(arch, conv=conv, width=width, num_classes=10, registry=registry)
    model.refresh_power_iteration(20)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model(torch.rand(1, 3, 32, 32, generator=gen))
    model64 = copy.deepcopy(model).double().eval()
    for p in model64.parameters():
        p.requires_grad_(False)
    bound, _rows = guaranteed_upper_bound(model64)
    worst = 0.0
    for _ in range(points):
        x = torch.rand(1, 3, 32, 32, generator=gen, dtype=torch.float64)
        jac = _batched_jacobian(model64.body, x, model64.feature_dim)
        norm = float(torch.linalg.matrix_norm(jac, ord=2))
        worst = max(worst, norm)
    if worst > bound * (1.0 + 1e-9):
        fail(f"{arch} with conv {conv!r}: Jacobian spectral norm {worst:.12g} exceeds the "
             f"guaranteed network bound {bound:.12g}")
    bound32, _ = guaranteed_upper_bound(model)
    if not bound32 >= worst * (1.0 - 1e-4):
        fail(f"{arch} with conv {conv!r}: float32 network bound {bound32:.9g} is below the "
             f"float64 Jacobian norm {worst:.9g}")
    return bound, worst
