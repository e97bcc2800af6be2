"""Promises checked with the parameters actually in use (SPEC §5 counts a promise as exactly 1).

A component that promises ``"1-lipschitz"`` contributes the factor 1 to the network's
GUARANTEED bound, without any computation.  A parametrisation that is 1-Lipschitz only at
initialisation (a learnable scale that starts at 1) keeps that factor after training has
moved it, and every certificate becomes unsound.  Two defences:

* :func:`verify_promises` -- run by ``lip certify``, ``lip lipschitz``, ``lip export
  --certify`` and at the end of ``lip train`` before the promise is used: every body layer
  counted as 1 because of its promise (and a head that promises 1 without a
  ``lipschitz_upper_bound()``, at the features it receives) is measured with the model's
  trained parameters, in float64, at inputs it really sees (the first data points pushed
  through the network, or random images) and at pairs around them: secant ratios
  ``||f(a) - f(b)|| / ||a - b||`` along directions found by a short power iteration on
  ``J^T J`` (``J v`` by a central difference, ``J^T u`` by autograd), random pairs at three
  scales and pairs of different inputs.  Every ratio is a true lower bound on the layer's
  Lipschitz constant, so a ratio above ``1 + tol`` proves the promise false:
  :class:`BrokenPromiseError` (exit 1).  Passing is evidence, not proof.  Cost, per
  promised layer alone, in float64, on the ``points`` inputs recorded during the feature
  pass (:func:`capture_inputs`; no forward pass of the network of its own in ``lip
  certify``): ``iters + 2`` batched forward passes (``2 points`` inputs per power step, one
  with an autograd graph kept for all steps, ``3 points`` random pairs) and ``iters - 1``
  backward passes.  Backward passes go through the gradient of a scalar, which keeps
  ``torch.autograd.grad`` from importing sympy (~0.4 s on first use).  Measured: about 5 %
  of the quick start's feature pass (docs/plugins.md).
* :func:`perturbed_copies` -- used by :mod:`lipcli.testing`: copies of a module with every
  parameter moved far from its initial value (random, large, negative, a few optimiser steps
  on a random loss), so that conformance checks see the parametrisation's whole range.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from lipcli._util.records import JsonRecord
from lipcli.sdk.errors import LipError
from lipcli.lipschitz.bound import _layer_kind, body_of, model_input_shape

#: a ratio above 1 + PROMISE_TOL breaks the promise (float64 evaluation of float32 parameters:
#: exact 1-Lipschitz layers measure 1 up to ~1e-15, float32 unit vectors up to ~1e-7)
PROMISE_TOL = 1e-6
EVIDENCE_LABEL = "measured with the trained parameters: evidence, not proof"


class BrokenPromiseError(LipError):
    """A layer measured a Lipschitz ratio above 1 although its component promises 1."""


class NonFiniteModelError(LipError):
    """A layer's output is non-finite for finite inputs with the model's parameters: no
    promise can be measured (the next promised layer would be blamed) and no bound holds."""


@dataclass
class PromiseLayer(JsonRecord):
    """One promised layer as measured: the largest ratio found; the component and plugin
    that made the promise (``None`` when the layer is not tagged)."""

    layer: str
    type: str
    max_ratio: float
    component: str | None
    plugin: str | None


@dataclass
class PromiseCheck:
    """What :func:`verify_promises` measured: per layer the largest ratio found."""

    layers: list[PromiseLayer] = field(default_factory=list)
    points: int = 0
    time_s: float = 0.0

    @property
    def max_ratio(self) -> float:
        return max((row.max_ratio for row in self.layers), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"layers": [row.to_json() for row in self.layers], "max_ratio": self.max_ratio,
                "points": self.points, "tolerance": PROMISE_TOL, "time_s": self.time_s,
                "label": EVIDENCE_LABEL}


def _component_of(module: nn.Module) -> dict[str, Any]:
    tag = getattr(module, "lip_component", None)
    return tag if isinstance(tag, dict) else {}


def _per_sample_norm(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1)


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / _per_sample_norm(t).clamp_min(1e-300).view(-1, *([1] * (t.dim() - 1)))


def layer_ratio(layer: nn.Module, x: torch.Tensor, *, iters: int = 8, seed: int = 0) -> float:
    """The largest secant ratio found for ``layer`` (float64 copy, eval mode) around the
    inputs ``x`` (``(B, ...)``; see the module docstring).

    Batched: each power step is one forward pass of the ``2B`` points ``x +- h v`` and one
    backward pass through a graph of ``f`` at ``x`` built once (``J^T u`` as the gradient
    of the scalar ``<f(x), u>``); the random pairs at three scales are one forward pass of
    ``3B`` points, and the pairs of different inputs reuse ``f(x)``."""
    f = copy.deepcopy(layer).double().eval()
    for p in f.parameters():
        p.requires_grad_(False)
    x = x.detach().double()
    n = x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    shape = (-1, *([1] * (x.dim() - 1)))
    scale = _per_sample_norm(x).clamp_min(1e-3).view(shape)
    # one draw for the power iteration's start (n) and the random pairs (3n)
    # (drawn in float32, the faster generator on CPU: directions need no more precision)
    noise = torch.randn((4 * n, *x.shape[1:]), generator=gen).to(device=x.device, dtype=torch.float64)

    def ratios(fa: torch.Tensor, fb: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _per_sample_norm(fa - fb) / _per_sample_norm(a - b).clamp_min(1e-300)

    xg = x.clone().requires_grad_(True)
    with torch.enable_grad():
        fx_graph = f(xg)  # the graph every power step differentiates (J^T at x)
    fx = fx_graph.detach()
    best = torch.zeros(n, dtype=torch.float64, device=x.device)
    v = _unit(noise[:n])
    step = 1e-4 * scale
    for k in range(max(1, iters)):  # power iteration on J^T J with secant ratios
        a, b = x + step * v, x - step * v
        with torch.no_grad():
            fab = f(torch.cat([a, b]))
        fa, fb = fab[:n], fab[n:]
        best = torch.maximum(best, ratios(fa, fb, a, b))
        if k == max(1, iters) - 1:
            break  # the next direction would not be measured
        jv = (fa - fb) / (2 * step.view(-1, *([1] * (fa.dim() - 1))))
        with torch.enable_grad():
            (w,) = torch.autograd.grad((fx_graph * jv).sum(), xg, retain_graph=True, allow_unused=True)
        if w is None or not bool(torch.isfinite(w).all()) or not bool((_per_sample_norm(w) > 0).all()):
            break
        v = _unit(w)
    # random pairs at three scales (one batch of 3n points)
    rel = torch.tensor((1e-2, 1.0, 10.0), dtype=torch.float64, device=x.device).repeat_interleave(n)
    xs = x.repeat(3, *([1] * (x.dim() - 1)))
    pairs = xs + rel.view(shape) * scale.repeat(3, *([1] * (x.dim() - 1))) * _unit(noise[n:])
    with torch.no_grad():
        f_pairs = f(pairs)
    best = torch.maximum(best, ratios(fx.repeat(3, *([1] * (fx.dim() - 1))), f_pairs, xs, pairs)
                         .view(3, n).amax(0))
    if n > 1:  # pairs of different inputs
        best = torch.maximum(best, ratios(fx, fx.roll(1, 0), x, x.roll(1, 0)))
    value = float(best.max())
    return value if math.isfinite(value) else math.inf


#: the name under which a promised head is measured (after the body's children)
HEAD = "head"


def promised_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The body children whose factor in the guaranteed bound is 1 because of a promise,
    then the head (as :data:`HEAD`) when it promises 1 without a ``lipschitz_upper_bound()``
    (a head certificate such as ``margin`` counts it as 1)."""
    layers = [(name, child) for name, child in body_of(model).named_children()
              if _layer_kind(child) == "promise"]
    head = getattr(model, "head", None)
    if isinstance(head, nn.Module) and _layer_kind(head) == "promise":
        layers.append((HEAD, head))
    return layers


def _describe(name: str, module: nn.Module) -> str:
    comp = _component_of(module)
    what = f"{comp.get('kind', 'layer')} {comp['name']!r}" if comp.get("name") else type(module).__name__
    plugin = f" (plugin {comp['provider']})" if comp.get("provider") else ""
    return f"{what} at layer {name!r}{plugin}"


def _suspects(module: nn.Module) -> str:
    """The module's non-finite tensors, else its all-zero ones (e.g. a power-iteration vector)."""
    tensors = [(n, t) for n, t in (*module.named_parameters(), *module.named_buffers())
               if t.is_floating_point() and t.numel() > 0]
    for label, test in (("non-finite", lambda t: not bool(torch.isfinite(t).all())),
                        ("all-zero", lambda t: not bool(t.any()))):
        names = [n for n, t in tensors if test(t)]
        if names:
            more = f" and {len(names) - 4} more" if len(names) > 4 else ""
            return f" ({label}: {', '.join(names[:4])}{more})"
    return ""


@torch.no_grad()
def locate_nonfinite(model: nn.Module, x: torch.Tensor) -> str | None:
    """The first body child (then the head) whose output is non-finite although its input
    is finite, pushing ``x`` through the network: ``"conv 'soc' at layer 'block1_down'
    (plugin ...) outputs non-finite values for finite inputs (all-zero: power_u0, ...)"``,
    or None if every output is finite."""

    head = getattr(model, "head", None)
    stages = [*body_of(model).named_children(), *([(HEAD, head)] if isinstance(head, nn.Module) else [])]
    h = x
    for name, child in stages:
        out = child(h)
        if not bool(torch.isfinite(out).all()):
            if not bool(torch.isfinite(h).all()):
                return None  # non-finite already at the input: not a layer's doing
            return f"{_describe(name, child)} outputs non-finite values for finite inputs{_suspects(child)}"
        h = out
    return None


def _nonfinite_error(model: nn.Module, data: torch.Tensor | None, points: int, seed: int,
                     at: str) -> NonFiniteModelError:
    """The error for a non-finite input of the promised layer ``at``: names the layer whose
    output first becomes non-finite (at ``data``, else at random images)."""

    param = next(model.parameters())
    if data is None:
        data = torch.rand((points, *model_input_shape(model)), generator=torch.Generator().manual_seed(seed))
    culprit = locate_nonfinite(model, data[:points].to(device=param.device, dtype=param.dtype))
    where = culprit or f"the input of layer {at!r} is non-finite"
    return NonFiniteModelError(f"{where} with this model's parameters; no certificate or bound is given")


@torch.no_grad()
def _layer_inputs(model: nn.Module, x: torch.Tensor, names: set[str]) -> dict[str, torch.Tensor]:
    inputs: dict[str, torch.Tensor] = {}
    h = x
    for name, child in body_of(model).named_children():
        if name in names:
            inputs[name] = h
        if len(inputs) == len(names):
            break
        h = child(h)
    if HEAD in names and HEAD not in inputs:
        inputs[HEAD] = h  # the features the head receives
    return inputs


@contextlib.contextmanager
def capture_inputs(model: nn.Module, points: int = 8) -> Iterator[dict[str, torch.Tensor]]:
    """While the block runs, record the first ``points`` inputs that reach each promised
    layer (forward pre-hooks), e.g. during the feature pass, so that :func:`verify_promises`
    needs no forward pass of its own."""
    captured: dict[str, torch.Tensor] = {}
    handles = []
    for name, layer in promised_layers(model):
        def hook(_module: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            have = captured.get(name)
            if have is None or have.shape[0] < points:
                new = args[0][:points].detach().clone()
                captured[name] = new if have is None else torch.cat([have, new])[:points]
        handles.append(layer.register_forward_pre_hook(hook))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def verify_promises(
    model: nn.Module, data: torch.Tensor | None = None, *, inputs: dict[str, torch.Tensor] | None = None,
    points: int = 8, iters: int = 8, tol: float = PROMISE_TOL, seed: int = 0,
) -> PromiseCheck:
    """Measure every layer counted as 1 because of its promise (:func:`promised_layers`; see
    the module docstring) at the first ``points`` images of ``data`` (``(N, C, H, W)`` in [0, 1]) or at
    random images, or at the layer ``inputs`` recorded by :func:`capture_inputs`; raise
    :class:`BrokenPromiseError` on a ratio above ``1 + tol``, :class:`NonFiniteModelError`
    (naming the layer at fault, :func:`locate_nonfinite`) when a promised layer's input is
    non-finite.  The model is left in eval mode."""
    t0 = time.perf_counter()
    model.eval()
    layers = promised_layers(model)
    check = PromiseCheck()
    if not layers:
        return check
    if inputs is None or any(name not in inputs for name, _ in layers):
        param = next(model.parameters())
        if data is None:
            gen = torch.Generator().manual_seed(seed)
            data = torch.rand((points, *model_input_shape(model)), generator=gen)
        x = data[:points].to(device=param.device, dtype=param.dtype)
        inputs = _layer_inputs(model, x, {name for name, _ in layers})
    check.points = min(int(t.shape[0]) for t in inputs.values())
    for name, layer in layers:
        if not bool(torch.isfinite(inputs[name]).all()):  # blame the cause, not this layer
            raise _nonfinite_error(model, data, points, seed, name)
        r = layer_ratio(layer, inputs[name], iters=iters, seed=seed)
        comp = _component_of(layer)
        check.layers.append(PromiseLayer(layer=name, type=type(layer).__name__, max_ratio=r,
                                         component=comp.get("name"), plugin=comp.get("provider")))
        if not r <= 1 + tol:
            what = f"{comp.get('kind', 'layer')} {comp['name']!r}" if comp.get("name") else type(layer).__name__
            plugin = comp.get("provider") or "(unknown plugin)"
            dist = comp.get("distribution")
            raise BrokenPromiseError(
                f"plugin {plugin}{f' (distribution {dist})' if dist else ''} breaks its "
                f"1-Lipschitz promise (measured {r:.6g}): {what} at layer {name!r} with this "
                "model's trained parameters; refusing to use the promise (no certificate or "
                "bound is given)"
            )
    check.time_s = time.perf_counter() - t0
    return check


# ---------------------------------------------------------------------------------------------
# conformance testing: the whole parameter range
# ---------------------------------------------------------------------------------------------
def perturbed_copies(
    module: nn.Module, input_shape: Sequence[int], *, seed: int = 0, steps: int = 5,
) -> Iterator[tuple[str, nn.Module]]:
    """Float64 copies of ``module`` with every parameter moved: standard normal values,
    values ten times larger (both signs), negative values, and ``steps`` Adam steps (lr 0.5)
    on a random linear loss of the output at random inputs of ``input_shape``.  None for a
    module without parameters."""
    if not any(True for _ in module.parameters()):
        return  # nothing to move: the module as built is all there is
    gen = torch.Generator().manual_seed(seed)

    def randn_like(p: torch.Tensor) -> torch.Tensor:
        return torch.randn(p.shape, generator=gen, dtype=torch.float64)

    for label, make in (("random parameters", lambda p: randn_like(p)),
                        ("large parameters", lambda p: 10 * randn_like(p)),
                        ("negative parameters", lambda p: -3 * randn_like(p).abs() - 0.5)):
        copy_ = copy.deepcopy(module).double()
        with torch.no_grad():
            for p in copy_.parameters():
                p.copy_(make(p))
        yield label, copy_.eval()
    trained = copy.deepcopy(module).double().train()
    params = [p for p in trained.parameters() if p.requires_grad]
    if params:
        optimizer = torch.optim.Adam(params, lr=0.5)
        x = 3 * torch.randn((16, *input_shape), generator=gen, dtype=torch.float64)
        with torch.no_grad():
            target = torch.randn(trained(x).shape, generator=gen, dtype=torch.float64)
        for _ in range(steps):
            optimizer.zero_grad()
            (trained(x) * target).sum().backward()
            optimizer.step()
    yield f"{steps} optimiser steps on a random loss", trained.eval()
