"""Compiled ÷ eager training step (``torch.compile``, ``lip train --compile``), interleaved.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/compile_cpu.py \
        --nets lc5,lc20,liresnet,bronet --width 8 --batch 16 --rounds 5 --mode default \
        --json > docs/data/cpu-compile.json

Per network two copies from the same weights run :class:`lipcli.bench.step.RecipeStep` (SGD,
cross-entropy; the step ``lip bench train`` times), one eager, one with its forward compiled
(``compile=True, compile_mode=MODE``), on the same synthetic batches.  First both take the logits of the same
batch (the compiled copy compiles there; its compiling calls are timed apart, ``compile_s``)
and their largest difference is reported; then two untimed warm-up steps each, then ``rounds``
rounds of one step each, the order alternating.  Reported: median seconds per step of both,
the ratio of the medians and the median of per-round ratios (compiled ÷ eager, below 1 =
compiled faster), the compile time, and after the steps the largest difference of the losses
and of the parameters (rounding, compounded by the steps).  ``--device cuda`` runs the same
on a GPU (synchronised timer).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

from lipcli.bench.step import RecipeStep, _clip_for, _timed, synthetic_batch
from lipcli.host.models import DEFAULTS, create_model
from lipcli.host.plugins import get_registry
from lipcli.host.recipes import resolve_recipe
from lipcli.bench.recipes import recipe_network

NETWORKS = {
    "lc5": lambda: {"arch": "lipconvnet-5", **DEFAULTS},
    "lc20": lambda: {"arch": "lipconvnet-20", **DEFAULTS},
    "liresnet": lambda: recipe_network(resolve_recipe(get_registry(), "liresnet")),
    "bronet": lambda: recipe_network(resolve_recipe(get_registry(), "bronet")),
}


def measure(name: str, *, width: int, batch: int, rounds: int, mode: str, device: torch.device,
            seed: int = 0, log=lambda s: None) -> dict:
    variant = NETWORKS[name]()
    torch.manual_seed(seed)
    choices = dict(variant)
    arch = choices.pop("arch")
    model = create_model(arch, num_classes=10, width=width, **choices).to(device)
    twin = copy.deepcopy(model)
    clip = _clip_for(variant.get("head", ""))
    eager, compiled = RecipeStep(model, clip), RecipeStep(twin, clip, compile=True, compile_mode=mode)
    gen = torch.Generator().manual_seed(seed)
    x, y = synthetic_batch(batch, 10, gen, device)
    t0 = time.perf_counter()
    logits_e = eager.forward(x).detach()
    eager_forward_s = time.perf_counter() - t0
    with compiled.compiled.measure():  # type: ignore[union-attr]
        logits_c = compiled.forward(x).detach()
    dlogit = float((logits_e - logits_c).abs().max())
    log(f"{name}: logits |d| {dlogit:.3g}; compile {compiled.compile_s():.1f} s")
    for _ in range(2):  # warm-up; a recompilation (if any) counts into compile_s
        eager(x, y)
        compiled(x, y)
    te, tc, ratios, dloss = [], [], [], []
    for r in range(rounds):
        x, y = synthetic_batch(batch, 10, gen, device)
        order = [("e", eager), ("c", compiled)] if r % 2 == 0 else [("c", compiled), ("e", eager)]
        got = {}
        for key, runner in order:
            dt, loss = _timed(lambda runner=runner: runner(x, y), device)
            got[key] = (dt, float(loss))
        te.append(got["e"][0])
        tc.append(got["c"][0])
        ratios.append(got["c"][0] / got["e"][0])
        dloss.append(abs(got["c"][1] - got["e"][1]))
        log(f"{name}: round {r + 1}/{rounds}: eager {got['e'][0]:.3f} s, compiled {got['c'][0]:.3f} s")
    dparam = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(model.parameters(), twin.parameters()))
    return {
        "network": name, "components": variant, "width": width, "batch": batch, "mode": mode,
        "compile": compiled.compiled.record() if compiled.compiled is not None else None,
        "compile_s": round(compiled.compile_s(), 3), "eager_first_forward_s": round(eager_forward_s, 3),
        "eager_median_s": statistics.median(te), "compiled_median_s": statistics.median(tc),
        "ratio_of_medians": statistics.median(tc) / statistics.median(te),
        "ratio_paired_median": statistics.median(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "eager_step_s": te, "compiled_step_s": tc,
        "max_abs_logit_diff_same_weights": dlogit,
        "max_abs_loss_diff": max(dloss), "max_abs_param_diff_after_steps": dparam,
        "steps_after_compare": rounds + 2,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="lc5,lc20,liresnet,bronet")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mode", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    load = os.getloadavg()
    for name in [n.strip() for n in args.nets.split(",") if n.strip()]:
        rows.append(measure(name, width=args.width, batch=args.batch, rounds=args.rounds,
                            mode=args.mode, device=device, log=lambda s: print(s, file=sys.stderr, flush=True)))
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "device": str(device),
              "load_average_start": load, "load_average_end": os.getloadavg(),
              "cpu": _cpu_name(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("| network | width / batch | eager s/step | compiled s/step | compiled ÷ eager (medians) "
              "| paired [min..max] | compile s | max |Δlogit| | max |Δparam| |")
        print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
        for r in rows:
            print(f"| {r['network']} | {r['width']} / {r['batch']} | {r['eager_median_s']:.3f} | "
                  f"{r['compiled_median_s']:.3f} | {r['ratio_of_medians']:.2f} | {r['ratio_paired_median']:.2f} "
                  f"[{r['ratio_min']:.2f}..{r['ratio_max']:.2f}] | {r['compile_s']:.0f} | "
                  f"{r['max_abs_logit_diff_same_weights']:.1e} | {r['max_abs_param_diff_after_steps']:.1e} |")
    return 0


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
