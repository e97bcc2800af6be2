"""Batched l2 PGD attacks, used to test certificates and to measure empirical robustness.

For a classifier ``f`` and a label ``l`` the attack minimises the margin

    ``m(x') = f_l(x') - max_{j != l} f_j(x')``  over ``||x' - x||_2 <= eps`` (and the image box),

and succeeds when ``m(x') < 0`` (another class strictly wins). Two losses:

* ``"margin"`` (untargeted): the margin itself;
* ``"runner-up"`` (targeted): ``f_l - f_t`` with ``t`` the strongest other class at the clean
  input;
* ``"nearest"`` (targeted, DeepFool-style): ``f_l - f_t`` with ``t`` the class of the nearest
  *linearised* boundary at the clean input, ``argmin_j (f_l - f_j)/||grad_x (f_l - f_j)||``
  over the (at most) :data:`NEAREST_CANDIDATES` strongest other classes; exact for a linear
  classifier, where the runner-up need not be the nearest boundary;
* ``"alternate"`` (default): restarts cycle through ``nearest``, ``margin``, ``runner-up``.

Every restart starts at a uniformly random point of the ball (``radius = eps * U^(1/d)``,
Gaussian direction) and takes normalised-gradient steps ``delta <- delta - a_k g/||g||`` with a
cosine step schedule ``a_k = eps * (a_min + (a_max - a_min) (1 + cos(pi k/steps))/2)``, then
projects onto the ball (``delta * min(1, eps/||delta||)``) and clips ``x + delta`` to the box
(clipping a point of the box only shrinks ``|delta_i|``, so the result stays in both sets).
The best point (lowest margin) over all steps and restarts is returned; inputs that have
already succeeded are not attacked further.

A certificate of radius ``r`` at ``x`` claims that no ``x'`` with ``||x' - x|| < r`` changes the
prediction, so a successful attack within a certified radius is a soundness violation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

LossName = Literal["margin", "runner-up", "nearest", "alternate"]
#: order in which ``"alternate"`` restarts use the losses
ALTERNATE_ORDER: tuple[str, ...] = ("nearest", "margin", "runner-up")
#: how many of the strongest other classes ``"nearest"`` considers
NEAREST_CANDIDATES = 10


@dataclass
class AttackResult:
    """Outcome per input (``B`` inputs).

    ``success`` (bool ``[B]``): the best point has margin ``< 0``; ``adversarial``
    (``[B, ...]``): the best point found (the clean input if nothing better); ``margin``
    (``[B]``): its margin for the attacked label; ``distance`` (float64 ``[B]``):
    ``||adversarial - x||_2`` computed in float64.
    """

    success: torch.Tensor
    adversarial: torch.Tensor
    margin: torch.Tensor
    distance: torch.Tensor


def margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``f_l - max_{j != l} f_j`` per row (``< 0`` iff another class strictly wins)."""
    own = logits.gather(1, labels[:, None]).squeeze(1)
    others = logits.scatter(1, labels[:, None], float("-inf"))
    return own - others.max(dim=1).values


def _runner_up(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return logits.scatter(1, labels[:, None], float("-inf")).argmax(dim=1)


def _nearest_target(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``argmin_j (f_l - f_j) / ||grad_x (f_l - f_j)||`` over the strongest other classes."""
    others = logits.scatter(1, labels[:, None], float("-inf"))
    k = min(NEAREST_CANDIDATES, logits.shape[1] - 1)
    candidates = others.topk(k, dim=1).indices  # [B, k]
    xg = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = model(xg)
        own = out.gather(1, labels[:, None]).squeeze(1)
        scores = []
        for i in range(k):
            gap = own - out.gather(1, candidates[:, i : i + 1]).squeeze(1)
            (g,) = torch.autograd.grad(gap.sum(), xg, retain_graph=i < k - 1)
            scores.append(gap.detach() / g.flatten(1).norm(dim=1).clamp_min(1e-30))
    best = torch.stack(scores, dim=1).argmin(dim=1)
    return candidates.gather(1, best[:, None]).squeeze(1)


def _per_sample_norm(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1).view(-1, *([1] * (t.dim() - 1)))


def _random_in_ball(x: torch.Tensor, eps: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    direction = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device, x.dtype)
    direction = direction / _per_sample_norm(direction).clamp_min(1e-30)
    d = x[0].numel()
    u = torch.rand(x.shape[0], generator=gen, dtype=torch.float64).to(x.device, x.dtype)
    radius = eps * u.pow(1.0 / d)
    return direction * radius.view(-1, *([1] * (x.dim() - 1)))


def _project(
    x: torch.Tensor, delta: torch.Tensor, eps: torch.Tensor, clip: tuple[float, float] | None
) -> torch.Tensor:
    shape = (-1, *([1] * (x.dim() - 1)))
    norm = _per_sample_norm(delta)
    factor = torch.clamp(eps.view(shape) / norm.clamp_min(1e-30), max=1.0)
    delta = delta * factor
    if clip is not None:
        delta = (x + delta).clamp(clip[0], clip[1]) - x
    return delta


def _objective(logits: torch.Tensor, m: torch.Tensor, la: torch.Tensor, ta: torch.Tensor | None) -> torch.Tensor:
    """The quantity descended: the margin ``m``, or ``logit[label] - logit[target]``."""
    if ta is None:
        return m
    return logits.gather(1, la[:, None]).squeeze(1) - logits.gather(1, ta[:, None]).squeeze(1)


def _attack_restart(
    model: nn.Module,
    x: torch.Tensor,
    labels: torch.Tensor,
    eps_t: torch.Tensor,
    target: torch.Tensor | None,
    active: torch.Tensor,
    best: tuple[torch.Tensor, torch.Tensor],
    opts: dict,
    gen: torch.Generator,
    done: int,
) -> None:
    """One restart on the ``active`` inputs; updates ``best = (margin, adversarial)`` in place.

    ``opts``: ``steps, step_max, step_min, random_start, clip, on_step`` of :func:`pgd_l2`;
    ``done``: steps taken before this restart (reported to ``on_step``).
    """
    best_margin, best_adv = best
    steps, step_max, step_min, clip = opts["steps"], opts["step_max"], opts["step_min"], opts["clip"]
    shape = (-1, *([1] * (x.dim() - 1)))
    xa, la, ea = x[active], labels[active], eps_t[active]
    ta = target[active] if target is not None else None
    if opts["random_start"]:
        delta = _project(xa, _random_in_ball(xa, ea, gen), ea, clip)
    else:
        delta = torch.zeros_like(xa)
    for k in range(steps + 1):
        delta = delta.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = model(xa + delta)
            m = margins(logits, la)
            objective = _objective(logits, m, la, ta)
            grad = None
            if k < steps:
                (grad,) = torch.autograd.grad(objective.sum(), delta)
        with torch.no_grad():
            m = m.detach()
            better = m < best_margin[active]
            if bool(better.any()):
                idx = active[better]
                best_margin[idx] = m[better]
                best_adv[idx] = (xa + delta)[better].detach()
            if grad is None:
                break
            frac = step_min + (step_max - step_min) * 0.5 * (1 + math.cos(math.pi * k / steps))
            g = grad / _per_sample_norm(grad).clamp_min(1e-30)
            delta = _project(xa, delta - (frac * ea).view(shape) * g, ea, clip)
        if opts["on_step"] is not None:
            opts["on_step"](done + k + 1)


def pgd_l2(
    model: nn.Module,
    x: torch.Tensor,
    labels: torch.Tensor,
    eps: float | torch.Tensor,
    *,
    steps: int = 100,
    restarts: int = 2,
    loss: LossName = "alternate",
    step_max: float = 0.5,
    step_min: float = 0.01,
    random_start: bool = True,
    clip: tuple[float, float] | None = (0.0, 1.0),
    seed: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> AttackResult:
    """l2 PGD on ``model`` (call it in eval mode) at radius ``eps`` (scalar or per input).

    ``step_max`` / ``step_min``: first and last step as fractions of ``eps`` (cosine schedule).
    ``clip``: the image box (``None``: no box).  ``on_step(done)``: called after every
    gradient step with the steps taken so far, of ``restarts * steps`` (fewer when every
    input is broken early), e.g. for a progress bar.  Returns an :class:`AttackResult`.
    """
    if steps < 1 or restarts < 1:
        raise ValueError("steps and restarts must be >= 1")
    if loss not in ("margin", "runner-up", "nearest", "alternate"):
        raise ValueError(f"unknown attack loss {loss!r}")
    x = x.detach()
    labels = labels.detach().to(x.device).long()
    n = x.shape[0]
    eps_t = torch.as_tensor(eps, dtype=x.dtype, device=x.device).expand(n).clone()
    if bool((eps_t < 0).any()) or not bool(torch.isfinite(eps_t).all()):
        raise ValueError("eps must be finite and >= 0")
    gen = torch.Generator().manual_seed(seed)
    opts = dict(steps=steps, step_max=step_max, step_min=step_min, random_start=random_start,
                clip=clip, on_step=on_step)

    with torch.no_grad():
        clean_logits = model(x)
    best_margin = margins(clean_logits, labels).clone()
    best_adv = x.clone()
    targets: dict[str, torch.Tensor] = {}

    for restart in range(restarts):
        mode = loss if loss != "alternate" else ALTERNATE_ORDER[restart % len(ALTERNATE_ORDER)]
        active = (best_margin >= 0).nonzero().squeeze(1)
        if active.numel() == 0:
            break
        if mode == "runner-up" and mode not in targets:
            targets[mode] = _runner_up(clean_logits, labels)
        if mode == "nearest" and mode not in targets:
            targets[mode] = _nearest_target(model, x, labels, clean_logits)
        _attack_restart(model, x, labels, eps_t, targets.get(mode), active, (best_margin, best_adv),
                        opts, gen, restart * steps)
    distance = (best_adv.double() - x.double()).flatten(1).norm(dim=1)
    return AttackResult(
        success=best_margin < 0, adversarial=best_adv, margin=best_margin, distance=distance
    )
