"""SOC's CPU layout and oneDNN choices, interleaved: the LipConvnet training step under each.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/soc_cpu_layouts.py \
        --arch lipconvnet-5 --width 8 --batch 16 --rounds 9 --json > docs/data/cpu-soc-layouts.json

Variants (``lipcli.builtins.soc.settings`` and ``series.FUSED_CONV_ADD``, read at every call;
each variant has its own copy of the same weights, and every round times one step of each on
the same batch, the starting variant rotating): ``default`` (channels-last for images of at
least 64 pixels, oneDNN's fused convolution-plus-add, convolutions for 2×2 images),
``nchw`` (no channels-last), ``channels-last-all`` (channels-last at every size),
``no-fused-add`` (conv2d then add), ``dense-small`` (``CPU_DENSE_SMALL_IMAGES``: the 2×2-image
layers as dense matrix products).  Reported: median seconds per step, the ratio to
``default`` (ratio of medians and median of per-round ratios), and the largest difference of
the first step's loss from ``default``'s (rounding: every variant computes the same map).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics

import torch

from lipcli.bench.step import RecipeStep, _clip_for, _timed, synthetic_batch
from lipcli.builtins.soc import series, settings
from lipcli.host.models import create_model

VARIANTS = {
    "default": {},
    "nchw": {"CHANNELS_LAST_MIN_PIXELS": None},
    "channels-last-all": {"CHANNELS_LAST_MIN_PIXELS": 1},
    "no-fused-add": {"FUSED_CONV_ADD": False},
    "dense-small": {"CPU_DENSE_SMALL_IMAGES": True},
}


def _apply(changes: dict) -> dict:
    old = {}
    for key, value in changes.items():
        owner = series if key == "FUSED_CONV_ADD" else settings
        old[key] = getattr(owner, key)
        setattr(owner, key, value)
    return old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="lipconvnet-5")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    base = create_model(args.arch, num_classes=10, width=args.width)
    names = list(VARIANTS)
    runners = {n: RecipeStep(copy.deepcopy(base), _clip_for("lln")) for n in names}
    gen = torch.Generator().manual_seed(0)
    times = {n: [] for n in names}
    first_loss = {}
    load = os.getloadavg()
    for r in range(args.rounds + 1):  # round 0: warm-up (its losses compared)
        x, y = synthetic_batch(args.batch, 10, gen, torch.device("cpu"))
        for i in range(len(names)):
            n = names[(r + i) % len(names)]
            old = _apply(VARIANTS[n])
            try:
                dt, loss = _timed(lambda: runners[n](x, y), torch.device("cpu"))
            finally:
                _apply(old)
            if r == 0:
                first_loss[n] = float(loss)
            else:
                times[n].append(dt)
    ref = times["default"]
    rows = [{"variant": n, "settings": {k: v for k, v in VARIANTS[n].items()},
             "median_s": statistics.median(times[n]),
             "ratio_of_medians": statistics.median(times[n]) / statistics.median(ref),
             "ratio_paired_median": statistics.median(t / t0 for t, t0 in zip(times[n], ref)),
             "first_loss_abs_diff": abs(first_loss[n] - first_loss["default"]), "step_s": times[n]}
            for n in names]
    report = {"arch": args.arch, "width": args.width, "batch": args.batch, "rounds": args.rounds,
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "load_average_start": load, "load_average_end": os.getloadavg(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for row in rows:
            print(f"{row['variant']:18} {row['median_s']:.3f} s  {row['ratio_of_medians']:.2f}  "
                  f"paired {row['ratio_paired_median']:.2f}  |dloss| {row['first_loss_abs_diff']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
