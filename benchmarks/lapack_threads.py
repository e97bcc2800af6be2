"""The LAPACK calls of lipcli's orthogonal convolutions on CPU, timed at 1 and 2 threads.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/lapack_threads.py [--rounds 5] [-o OUT.json]

Per call and shape (the per-frequency matrices of LipConvnet's layers, float32 complex, and the
float64 matrices of the bound certificates): median [min..max] seconds over interleaved rounds
(1 and 2 threads alternate; ``torch.set_num_threads`` is called here only, never in lipcli), and
the 2-thread ÷ 1-thread ratio of the medians (above 1: the second thread slows the call down).
Calls: BRO's Householder QR (``linalg.qr``, eval) and Cholesky QR (``cholesky_ex`` +
``solve_triangular``, training), Cayley's batched ``linalg.solve`` (training and eval), and the
``eigvalsh`` + ``cholesky_ex`` of ``lipcli.numerics.eigen`` (LOT's and SOC's certified bounds,
once per evaluated model).  LOT's Newton–Schulz iterations and BCOP's Björck iterations are
matrix products only (no LAPACK).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

#: (bins, c): the per-frequency matrices of 32@32×32, 64@16×16, 128@8×8, 256@4×4 (stride 2)
SHAPES = [(32 * 17, 32), (16 * 9, 64), (8 * 5, 128), (4 * 3, 256)]


def calls(bins: int, c: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(c)
    V = torch.randn(bins, c, c // 2, generator=gen, dtype=torch.complex64)
    G = V.mH @ V
    L = torch.linalg.cholesky_ex(G).L
    A = torch.randn(bins, c, c, generator=gen, dtype=torch.complex64)
    S = torch.eye(c, dtype=A.dtype) + (A - A.mH) / (2 * c**0.5)  # I + skew, as Cayley's
    return {
        "bro qr": lambda: torch.linalg.qr(V),
        "bro cholesky_ex": lambda: torch.linalg.cholesky_ex(G),
        "bro solve_triangular": lambda: torch.linalg.solve_triangular(L, V.mH, upper=False),
        "cayley solve": lambda: torch.linalg.solve(S, A, left=False),
    }


def bound_calls(p: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(p)
    M = torch.randn(p, p, generator=gen, dtype=torch.float64)
    X = M @ M.T + p * torch.eye(p, dtype=torch.float64)
    return {"eigen eigvalsh f64": lambda: torch.linalg.eigvalsh(X),
            "eigen cholesky_ex f64": lambda: torch.linalg.cholesky_ex(X)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    cases: list[tuple[str, Callable[[], object]]] = []
    for bins, c in SHAPES:
        cases += [(f"{name} {bins}x{c}", fn) for name, fn in calls(bins, c).items()]
    for p in (256, 1024):
        cases += [(f"{name} {p}x{p}", fn) for name, fn in bound_calls(p).items()]
    rows = []
    for label, fn in cases:
        times: dict[int, list[float]] = {1: [], 2: []}
        errors: dict[int, int] = {1: 0, 2: 0}
        for r in range(args.rounds + 1):
            for threads in ((1, 2) if r % 2 else (2, 1)):
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                try:
                    fn()
                except RuntimeError:  # MKL's batched complex LU fails in some multi-thread runs
                    errors[threads] += 1
                    continue
                if r:  # round 0 warms up
                    times[threads].append(time.perf_counter() - t0)
        if not (times[1] and times[2]):
            rows.append({"call": label, "errors": errors})
            print(f"{label:36s} failed (RuntimeError) at 1T {errors[1]}x, 2T {errors[2]}x", flush=True)
            continue
        med = {t: statistics.median(v) for t, v in times.items()}
        row = {"call": label, **{f"{t}T": {"median": med[t], "min": min(v), "max": max(v)} for t, v in times.items()},
               "ratio_2T_1T": med[2] / med[1], "errors": errors}
        rows.append(row)
        print(f"{label:36s} 1T {med[1] * 1e3:8.2f} ms [{min(times[1]) * 1e3:.2f}..{max(times[1]) * 1e3:.2f}]  "
              f"2T {med[2] * 1e3:8.2f} ms [{min(times[2]) * 1e3:.2f}..{max(times[2]) * 1e3:.2f}]  "
              f"2T/1T {row['ratio_2T_1T']:.2f}" + (f"  failures 1T {errors[1]}, 2T {errors[2]}" if any(errors.values()) else ""),
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"torch": torch.__version__, "rounds": args.rounds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
