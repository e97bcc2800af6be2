r"""The dual (CRC) certificate of one ``(input, class)`` pair: batched safeguarded Newton on
the KKT system (Singla & Feizi 2020; paper Appendix E; SPEC §4).

For every ``η >= 0`` and every ``y'`` with ``g(y') <= 0``:
``½‖y' - y‖² >= ½‖y' - y‖² + η g(y') >= d(η)`` where ``d(η) = min_δ F_η(δ)``,
``F_η(δ) = ½‖δ‖² + η g(y + δ)``.  ``d`` is concave with ``d'(η) = g(y + δ*(η))`` and
``d''(η) = -∇gᵀ (I + η∇²g)⁻¹ ∇g``.  For ``η < 1/m_lj`` the inner problem is ``μ``-strongly
convex with ``μ = 1 - η m_lj``, so for ANY ``δ`` ``d(η) >= F_η(δ) - ‖∇F_η(δ)‖² / (2μ)`` and
``r_dual = √(2 (F_η(δ) - ‖∇F_η(δ)‖²/(2μ)))`` is sound.  It is used only when
``‖∇F_η(δ)‖ <= grad_tol`` (1e-6, as in the paper).

``η`` is found by a safeguarded Newton iteration on the KKT system
``δ + η∇g(y + δ) = 0, g(y + δ) = 0`` (bracketed by the sign of ``d'``, clipped to
``[0, (1 - τ)/m]``); the inner Newton systems are solved by batched conjugate gradients with
Hessian-vector products ``v + η W₁ᵀ (d ⊙ σ''(z) ⊙ W₁ v)``.  The search stops when the Newton
model's predicted gain ``g²/(2|d''|)`` is below ``dual_rtol · d(η)``, or at the boundary
``η = (1 - τ)/m`` with ``d' > 0``.  When ``g(y + δ*) = 0`` at an interior ``η`` the dual
equals the primal: the certificate is the exact distance.

All certificate arithmetic is float64 and subtracts bounds on its own rounding errors; CG
search directions may use float32 (``solver_dtype``), which cannot affect soundness because
every certified quantity is re-evaluated in float64 at the final point.  Tolerances:
:class:`~lipcli.builtins.crc.settings.CRCSettings`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lipcli.builtins.crc.settings import CRCSettings
from lipcli.builtins.crc.weights import MLPWeights, hidden_error, softplus64
from lipcli.numerics.rounding import UNIT_ROUNDOFF as _U64  # float64


@dataclass
class DualResult:
    """Per-column outcome of :func:`solve_dual`."""

    radius: torch.Tensor  # sound dual radius (0 if never certified)
    eta: torch.Tensor
    tight: torch.Tensor  # η search converged inside [0, (1-τ)/m): certificate ≈ distance
    at_boundary: torch.Tensor  # η hit (1-τ)/m with d' > 0: a smaller m could help
    upper: torch.Tensor  # ‖δ‖ at an evaluated point with g(y+δ) < 0 (else inf)
    iterations: torch.Tensor
    stopped: torch.Tensor  # stopped early: ``radius > stop`` (a sound value, not the optimum)
    hvps: int = 0  # Hessian-vector products (per column, summed)


def _batched_cg(
    w1: torch.Tensor,
    rhs: torch.Tensor,
    diag: torch.Tensor,
    eta: torch.Tensor,
    rtol: float,
    max_iter: int,
) -> tuple[torch.Tensor, int]:
    """Solve ``(I + η_i W₁ᵀ diag(diag_i) W₁) x_i = rhs_i`` for every row ``i`` by CG.

    All matrices are positive definite (``η_i m <= 1 - τ``).  Rows stop once their residual
    is below ``rtol·‖rhs_i‖``; the working set is compacted as rows finish.  Runs in
    ``w1.dtype``.  Returns ``(x float64, number of operator applications)``.
    """
    dtype = w1.dtype
    n = rhs.shape[0]
    scale = rhs.norm(dim=1, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    x_out = torch.zeros(rhs.shape, dtype=dtype, device=rhs.device)
    idx = torch.arange(n, device=rhs.device)
    r = (rhs / scale).to(dtype)  # unit right-hand sides: no float32 under/overflow
    dg = diag.to(dtype)
    et = eta.to(dtype).unsqueeze(1)
    x = torch.zeros_like(r)
    p = r.clone()
    rs = (r * r).sum(dim=1)
    target = (rtol**2) * rs
    applications = 0
    for _ in range(max_iter):
        live = rs > target
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live < live.numel():  # compact the working set: finished rows cost no products
            done = ~live
            x_out[idx[done]] = x[done]
            idx, r, dg, et, x, p, rs, target = (
                idx[live], r[live], dg[live], et[live], x[live], p[live], rs[live], target[live]
            )
            live = rs > target
        ap = p + et * ((p @ w1.T) * dg) @ w1
        applications += n_live
        pap = (p * ap).sum(dim=1)
        # finished rows (and breakdowns) take no step: alpha = 0 keeps x, r, p frozen
        alpha = torch.where(live & (pap > 0), rs / pap.clamp_min(1e-30), torch.zeros_like(pap))
        x += alpha.unsqueeze(1) * p
        r -= alpha.unsqueeze(1) * ap
        rs_new = (r * r).sum(dim=1)
        beta = torch.where(live, rs_new / rs.clamp_min(1e-30), torch.zeros_like(rs_new))
        p = torch.where(live.unsqueeze(1), r + beta.unsqueeze(1) * p, p)
        # a breakdown (pap <= 0) stops the row
        rs = torch.where(live & ~(pap > 0), torch.zeros_like(rs_new), torch.where(live, rs_new, rs))
    x_out[idx] = x
    return x_out.to(torch.float64) * scale, applications


def _start(
    g0: torch.Tensor, grad0: torch.Tensor, m: torch.Tensor, settings: CRCSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(η_max, η_cap, η, δ)``: the η range and the starting point of the search."""
    grad0_sq = grad0.pow(2).sum(dim=1)
    inf = torch.full_like(g0, math.inf)
    eta_max = torch.where(m > 0, (1 - settings.boundary) / m.clamp_min(1e-300), inf)
    # linear model: g(y - η∇g) = 0 at η₀ = g/‖∇g‖² (exact for a linear head)
    eta0 = torch.where(grad0_sq > 0, g0 / grad0_sq.clamp_min(1e-300), inf)
    eta_cap = torch.minimum(eta_max, torch.where(torch.isfinite(eta0), 1e6 * eta0, torch.full_like(eta0, 1e6)))
    eta = torch.minimum(eta0, 0.5 * eta_cap)
    eta = torch.where(torch.isfinite(eta) & (eta > 0), eta, torch.minimum(torch.ones_like(eta), 0.5 * eta_cap))
    delta = -eta.unsqueeze(1) * grad0
    return eta_max, eta_cap, eta, delta


def _working_set(
    z0: torch.Tensor,
    z0_err: torch.Tensor,
    a: torch.Tensor,
    c0: torch.Tensor,
    m: torch.Tensor,
    start: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    stop: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """Every per-column tensor of the search, keyed by name (rows dropped as columns finish)."""
    eta_max, eta_cap, eta, delta = start
    n = z0.shape[0]
    dev = z0.device
    f64 = torch.float64

    def zeros(dtype: torch.dtype = f64) -> torch.Tensor:
        return torch.zeros(n, dtype=dtype, device=dev)

    return {
        "orig": torch.arange(n, device=dev),
        "z0": z0, "z0_err": z0_err, "a": a, "a_abs": a.abs(), "c0": c0, "m": m,
        "eta_max": eta_max, "eta_cap": eta_cap, "delta": delta, "eta": eta,
        "lo": zeros(), "hi": eta_cap.clone(), "frozen": zeros(torch.bool),
        "at_boundary": zeros(torch.bool), "tight": zeros(torch.bool), "done": zeros(torch.bool),
        "best": zeros(), "upper": torch.full((n,), math.inf, dtype=f64, device=dev),
        "iters": zeros(torch.long), "prev_delta": delta.clone(),
        "prev_f": torch.full((n,), math.inf, dtype=f64, device=dev), "prev_slope": zeros(),
        "check_armijo": zeros(torch.bool),
        "stop": torch.full((n,), math.inf, dtype=f64, device=dev) if stop is None else stop.to(f64),
        "stopped": zeros(torch.bool),
    }


@dataclass
class _Point:
    """``F_η`` and ``g`` evaluated at the working set's current ``(δ, η)``."""

    z: torch.Tensor  # W₁(y + δ) + b₁
    sp: torch.Tensor  # softplus(z)
    s1: torch.Tensor  # σ(z)
    gv: torch.Tensor  # g(y + δ)
    grad: torch.Tensor  # ∇g(y + δ)
    resid: torch.Tensor  # ∇F_η(δ)
    rn: torch.Tensor  # ‖∇F_η(δ)‖
    dn: torch.Tensor  # ‖δ‖
    gnorm: torch.Tensor  # ‖∇g(y + δ)‖
    fval: torch.Tensor  # F_η(δ)
    mu: torch.Tensor  # rounding-safe lower bound on 1 - ηm


def _evaluate(w1: torch.Tensor, w: dict[str, torch.Tensor]) -> _Point:
    """Evaluate the current point of every column of the working set ``w``."""
    delta, eta, a_w = w["delta"], w["eta"], w["a"]
    z = w["z0"] + delta @ w1.T  # W₁(y + δ) + b₁
    sp = softplus64(z)
    s1 = torch.sigmoid(z)
    gv = (a_w * sp).sum(dim=1) + w["c0"]  # g(y + δ)
    grad = (a_w * s1) @ w1  # ∇g(y + δ)
    resid = delta + eta.unsqueeze(1) * grad  # ∇F_η(δ)
    rn, dn, gnorm = resid.norm(dim=1), delta.norm(dim=1), grad.norm(dim=1)
    fval = 0.5 * dn.pow(2) + eta * gv  # F_η(δ)
    mu = 1 - eta * w["m"] * (1 + 4 * _U64) - 4 * _U64  # rounding-safe lower bound on 1 - ηm
    return _Point(z, sp, s1, gv, grad, resid, rn, dn, gnorm, fval, mu)


def _record_certificates(
    weights: MLPWeights, w: dict[str, torch.Tensor], pt: _Point, ok: torch.Tensor, live: torch.Tensor
) -> torch.Tensor:
    """Raise ``best`` (and lower ``upper``) where ``ok``; returns ``live`` less early stops.

    The sound certificate of a point: ``d(η) >= F - ‖∇F‖²/(2μ)`` minus rounding bounds.
    """
    hidden, dim = weights.hidden, weights.dim
    sqrt_w1 = math.sqrt(weights.w1_sq_bound)
    k = ok.nonzero().squeeze(1)
    z_k, dn_k, e_k, gv_k, a_abs_k = pt.z[k], pt.dn[k], w["eta"][k], pt.gv[k], w["a_abs"][k]
    z_err = w["z0_err"][k] + (dim + 4) * _U64 * weights.w1_row_norm * dn_k.unsqueeze(1) + 2 * _U64 * z_k.abs()
    g_err = (a_abs_k * hidden_error(z_k, z_err, pt.sp[k], hidden)).sum(dim=1) + 4 * _U64 * w["c0"][k].abs()
    grad_err = (hidden + 4) * _U64 * weights.w1_frob * (w["a"][k] * pt.s1[k]).norm(dim=1) + sqrt_w1 * (
        a_abs_k * (0.25 * z_err + 8 * _U64)
    ).norm(dim=1)
    r_err = e_k * grad_err + (dim + 8) * _U64 * (dn_k + e_k * pt.gnorm[k])
    f_err = e_k * g_err + (dim + 8) * _U64 * (dn_k.pow(2) + e_k * gv_k.abs())
    r_sq = 2 * (pt.fval[k] - f_err - (pt.rn[k] + r_err).pow(2) / (2 * pt.mu[k]))
    cert = torch.where(r_sq > 0, r_sq.clamp_min(0).sqrt() * (1 - 1e-14), torch.zeros_like(r_sq))
    w["best"][k] = torch.maximum(w["best"][k], cert)
    crossed = gv_k + g_err < 0
    w["upper"][k] = torch.where(crossed, torch.minimum(w["upper"][k], dn_k), w["upper"][k])
    early = ok & (w["best"] > w["stop"])  # already above what the caller needs
    w["stopped"] |= early
    w["done"] |= early
    return live & ~early


def _safeguard(
    w: dict[str, torch.Tensor], pt: _Point, live: torch.Tensor, settings: CRCSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """Armijo backtracking, η bracket and termination; returns ``(step, bad)``.

    ``bad``: columns whose last inner step was backtracked (``w["delta"]`` halved back);
    ``step``: live columns that take a Newton step now.
    """
    eta, fval, gv = w["eta"], pt.fval, pt.gv
    # Armijo backtracking for pure inner (η frozen) Newton steps
    bad = live & w["check_armijo"] & (fval > w["prev_f"] - 1e-4 * w["prev_slope"] + 1e-13 * fval.abs())
    if bool(bad.any()):
        delta = w["delta"]
        w["delta"] = torch.where(bad.unsqueeze(1), w["prev_delta"] + 0.5 * (delta - w["prev_delta"]), delta)
        w["prev_slope"] = torch.where(bad, 0.5 * w["prev_slope"], w["prev_slope"])

    # bracket on η where the inner solution is accurate enough to trust sign(d'(η))
    reliable = live & ~bad & (pt.rn * pt.gnorm / pt.mu.clamp_min(1e-12) <= 0.25 * gv.abs())
    w["lo"] = torch.where(reliable & (gv > 0), torch.maximum(w["lo"], eta), w["lo"])
    w["hi"] = torch.where(reliable & (gv < 0), torch.minimum(w["hi"], eta), w["hi"])
    pinned = reliable & (gv > 0) & (eta >= w["eta_cap"] * (1 - 1e-12))
    w["at_boundary"] |= pinned & (w["eta_cap"] >= w["eta_max"])
    w["frozen"] |= pinned

    fin = live & w["frozen"] & (pt.rn <= settings.grad_tol) & ~bad
    w["done"] |= fin
    w["check_armijo"] = bad
    return live & ~fin & ~bad, bad


def _newton_step(
    weights: MLPWeights,
    w: dict[str, torch.Tensor],
    pt: _Point,
    step: torch.Tensor,
    bad: torch.Tensor,
    settings: CRCSettings,
) -> int:
    """One safeguarded KKT Newton step of the ``step`` columns; returns the CG products used.

    Directions ``H⁻¹∇F`` for stepping columns and ``H⁻¹∇g`` for those still searching η
    (batched CG); ``η`` moves by the KKT Newton step inside its bracket and trust region.
    """
    delta, eta, grad, resid, gv = w["delta"], w["eta"], pt.grad, pt.resid, pt.gv
    srch = step & ~w["frozen"]
    hess_diag = w["a"] * (pt.s1 * torch.sigmoid(-pt.z))  # d ⊙ σ''(z)
    rhs = torch.cat([resid * step.unsqueeze(1), grad * srch.unsqueeze(1)], dim=0)  # zero rows idle
    sol, apps = _batched_cg(
        weights.w1_solver, rhs, torch.cat([hess_diag, hess_diag]), torch.cat([eta, eta]),
        settings.cg_rtol, settings.cg_max_iter,
    )
    p_dir, q_dir = sol[: eta.numel()], sol[eta.numel():]  # H⁻¹∇F, H⁻¹∇g

    t = (grad * q_dir).sum(dim=1).clamp_min(1e-300)  # -d''(η)
    # KKT Newton: [[H, ∇g], [∇gᵀ, 0]] (Δδ, Δη) = -(∇F, g)
    d_eta = (gv - (grad * p_dir).sum(dim=1)) / t
    gain = gv.pow(2) / (2 * t)  # Newton model's predicted increase of d(η)
    converged = srch & (gain <= settings.dual_rtol * pt.fval.abs()) & (pt.rn <= 1e-3 * pt.dn + settings.grad_tol)
    new_eta = torch.where(srch & ~converged, _propose_eta(w, eta, d_eta), eta)
    w["frozen"] |= converged
    # converged with d'(η) ≈ 0 strictly inside the strongly convex range: the dual optimum
    # is attained at a point with g ≈ 0, so dual == primal (exact certificate)
    w["tight"] |= converged & (eta < w["eta_max"] * (1 - 1e-9))
    move = -p_dir - torch.where(srch, new_eta - eta, torch.zeros_like(eta)).unsqueeze(1) * q_dir
    w["prev_delta"] = torch.where(step.unsqueeze(1), delta, w["prev_delta"])
    w["prev_f"] = torch.where(step, pt.fval, w["prev_f"])
    w["prev_slope"] = torch.where(step, (resid * p_dir).sum(dim=1), w["prev_slope"])  # -∇Fᵀ(Δδ)
    w["check_armijo"] = bad | (step & w["frozen"] & (new_eta == eta))
    w["delta"] = torch.where(step.unsqueeze(1), delta + move, delta)
    w["eta"] = new_eta
    return apps


def _propose_eta(w: dict[str, torch.Tensor], eta: torch.Tensor, d_eta: torch.Tensor) -> torch.Tensor:
    """``η + Δη`` clipped to the trust region ``[η/4, 4η]``, the bracket and ``η_cap``."""
    prop = torch.clamp(eta + d_eta, min=eta / 4, max=eta * 4)  # trust region
    lo, hi, cap = w["lo"], w["hi"], w["eta_cap"]
    h_real = hi < cap
    prop = torch.where(h_real & ((prop <= lo) | (prop >= hi)), 0.5 * (lo + hi), prop)
    prop = torch.where(prop <= lo, 0.5 * (lo + eta), prop)
    return torch.minimum(prop, cap)


def solve_dual(
    weights: MLPWeights,
    z0: torch.Tensor,
    z0_err: torch.Tensor,
    a: torch.Tensor,
    c0: torch.Tensor,
    g0: torch.Tensor,
    grad0: torch.Tensor,
    m: torch.Tensor,
    settings: CRCSettings,
    stop: torch.Tensor | None = None,
) -> DualResult:
    """Batched dual (CRC) certificates for ``N`` columns ``(y_i, d_i)``.

    Args:
        weights: the head (:func:`mlp_weights`).
        z0: ``(N, H)`` ``W₁y + b₁`` at the features ``y``, with rounding bound ``z0_err``.
        a: ``(N, H)`` ``d = W₂[l] - W₂[j]``; ``c0``: ``(N,)`` ``b₂[l] - b₂[j]``.
        g0, grad0: ``g(y) > 0`` and ``∇g(y)`` (starting point only).
        m: ``(N,)`` guaranteed upper bounds on the negative curvature of ``g``.
        settings: tolerances.
        stop: ``(N,)`` optional: a column stops as soon as its sound radius exceeds
            ``stop`` (the caller only needs to know that it is above; default: never).
    Returns:
        :class:`DualResult`.  ``radius`` is the best sound value over all evaluated points
        with ``‖∇F_η(δ)‖ <= grad_tol``: ``√(2(F - ‖∇F‖²/(2μ)))`` minus rounding bounds; 0
        where no such point was reached.
    """
    # working set: every per-column tensor, compacted (rows dropped) as columns finish
    ws = _working_set(z0, z0_err, a, c0, m, _start(g0, grad0, m, settings), stop)
    outputs = ("best", "eta", "tight", "at_boundary", "upper", "iters", "done", "stopped")
    out = {k: ws[k].clone() for k in outputs}
    hvps = 0

    def flush(rows: torch.Tensor) -> None:
        for k in outputs:
            out[k][ws["orig"][rows]] = ws[k][rows]

    for _ in range(settings.max_iter):
        live = ~ws["done"]
        n_live = int(live.sum())
        if n_live == 0:
            break
        if n_live < live.numel():  # drop finished columns (copies are cheap next to the products)
            flush(~live)
            ws = {k: v[live] for k, v in ws.items()}
            live = ~ws["done"]
        ws["iters"] += live.long()
        pt = _evaluate(weights.w1, ws)
        ok = live & (pt.rn <= settings.grad_tol) & (pt.mu > 0)
        if bool(ok.any()):
            live = _record_certificates(weights, ws, pt, ok, live)
        step, bad = _safeguard(ws, pt, live, settings)
        if bool(step.any()):
            hvps += _newton_step(weights, ws, pt, step, bad, settings)

    flush(torch.ones_like(ws["done"]))
    return DualResult(
        radius=out["best"],
        eta=out["eta"],
        tight=out["tight"] & out["done"] & (out["best"] > 0),
        at_boundary=out["at_boundary"],
        upper=out["upper"],
        iterations=out["iters"],
        stopped=out["stopped"],
        hvps=hvps,
    )
