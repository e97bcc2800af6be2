"""The optimiser's share of a LipNeXt training step: forward + backward vs the so-adam step
(the manifold part: Lie gradient, Adam, FastExp in float64, X·E; plus NAdam on the rest),
interleaved, median over steps.  ``python optimizer_share.py DEPTH WIDTH BATCH STEPS``."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from lipcli.testing import create_model
from lipcli_lipnext.optimizer import so_adam_factory
from lipcli.sdk.optimizers import OptimizerContext


def main(depth: int, width: int, batch: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = create_model("lipnext", num_classes=10, depth=depth, width=width)
    groups = [{"params": list(model.parameters()), "weight_decay": 0.0,
               "names": [n for n, _ in model.named_parameters()]}]
    ctx = OptimizerContext(groups=groups, model=model, lr=1e-3, momentum=0.9, betas=(0.9, 0.999),
                           lookahead=0, lookahead_alpha=0.5,
                           euclidean=lambda name, g: torch.optim.NAdam(
                               [{"params": x["params"]} for x in g], lr=1e-3),
                           lookahead_wrapper=lambda o: o)
    opt = so_adam_factory(ctx)
    x, y = torch.rand(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    fb, st = [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if i:  # the first is warm-up
            fb.append(t1 - t0)
            st.append(t2 - t1)
    f, s = statistics.median(fb), statistics.median(st)
    return {"depth": depth, "width": width, "batch": batch, "steps": steps,
            "forward_backward_s": f, "optimizer_step_s": s, "optimizer_share": s / (f + s),
            "fastexp_orders": dict(opt.orders), "threads": torch.get_num_threads()}


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:5]))))
