"""A/B of the CUDA memory format of the SOC series (run on a GPU machine).

Alternates ``lipcli.builtins.soc.layer.CUDA_CHANNELS_LAST`` False/True over ``lip bench train``'s
measurement (fast and exact models, interleaved) and checks on the way that both layouts give
the same forward values (up to TF32/rounding) and that ``soc-fast`` and ``soc`` stay
bit-identical in the channels-last layout.  Prints one line per measurement and writes the
raw results as JSON to the path given as the first argument (default: layout-ab.json); the
second argument lists the cases as ``BATCH:DEPTH,...`` (default ``128:20,512:5,512:20,512:40``).
"""

from __future__ import annotations

import json
import os
import sys

import torch

from lipcli.bench import bench_train_arch
from lipcli.builtins.soc import layer as soc_module
from lipcli.builtins.soc.layer import SOC
from lipcli.numerics.precision import full_float32_precision


def check_layouts(dev: torch.device) -> None:
    for c_in, c_out, k, s, hw in [(32, 32, 3, 1, 32), (64, 256, 3, 2, 16), (512, 2048, 1, 2, 2)]:
        torch.manual_seed(0)
        ref = SOC(c_in, c_out, k, s, fast_grad=True).to(dev)
        x = torch.randn(8, c_in, hw, hw, device=dev)
        outs = {}
        with full_float32_precision():
            for flag in (False, True):
                soc_module.CUDA_CHANNELS_LAST = flag
                # training mode (one power step per call): fresh copies of the same layer
                fast = SOC(c_in, c_out, k, s, fast_grad=True).to(dev)
                exact = SOC(c_in, c_out, k, s, fast_grad=False).to(dev)
                fast.load_state_dict(ref.state_dict())
                exact.load_state_dict(ref.state_dict())
                zf, ze = fast(x.clone().requires_grad_(True)), exact(x.clone().requires_grad_(True))
                print(f"channels_last={flag} SOC {c_in}->{c_out} k{k} s{s}: fast == exact "
                      f"{torch.equal(zf, ze)}", flush=True)
                assert torch.equal(zf, ze)
                with torch.no_grad():  # evaluation mode: no power step, same S for both layouts
                    outs[flag] = ref.eval()(x)
        err = ((outs[True] - outs[False]).norm() / outs[False].norm()).item()
        print(f"   layouts agree (eval): relative difference {err:.2e}", flush=True)
        assert err < 1e-5
    soc_module.CUDA_CHANNELS_LAST = True  # the default


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "layout-ab.json"
    dev = torch.device(os.environ.get("AB_DEVICE", "cuda"))  # cpu + AB_CHECK_ONLY=1: dry run
    check_layouts(dev)
    if os.environ.get("AB_CHECK_ONLY"):
        return
    results = []
    # cases as BATCH:ARCH,... (second argument); default as in docs/benchmarks.md
    spec = sys.argv[2] if len(sys.argv) > 2 else "128:20,512:5,512:20,512:40"
    cases = [(int(b), a if a.startswith("lipconvnet-") else f"lipconvnet-{a}")
             for b, a in (item.split(":") for item in spec.split(","))]
    for batch, arch in cases:
        for rep in range(2):
            for flag in (False, True):
                soc_module.CUDA_CHANNELS_LAST = flag
                r = bench_train_arch(arch, batch_size=batch, steps=6, warmup=2, device=dev,
                                     measure_memory=False)
                f, e = r["fast"]["median_step_s"] * 1e3, r["exact"]["median_step_s"] * 1e3
                print(f"b{batch} {arch} rep {rep} channels_last={flag}: fast {f:.1f} ms, "
                      f"exact {e:.1f} ms, reduction {r['reduction_pct']:.1f} %", flush=True)
                results.append({"batch": batch, "arch": arch, "rep": rep, "channels_last": flag,
                                "fast_ms": f, "exact_ms": e, "reduction_pct": r["reduction_pct"]})
    soc_module.CUDA_CHANNELS_LAST = True
    with open(out, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
