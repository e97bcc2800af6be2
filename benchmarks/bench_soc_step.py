"""Throwaway benchmark: LipConvnet-shaped SGD training steps with ``soc-fast`` vs ``soc``.

Builds LipConvnet-n shaped stacks (SPEC §3, width 32) directly from :class:`SOC` with a
channel-pair MaxMin / max pool written inline and a plain linear head, copies identical
weights into a fast-gradient and an exact-gradient model, and times
forward + backward + SGD step for both, interleaved (the order alternates every repeat).
Reports medians and the relative saving ``1 − fast/exact``; ``--profile`` also reports
the share of the fast step spent outside convolutions (torch.profiler self-times).

Usage::

    python benchmarks/bench_soc_step.py --arch 5 --repeats 5 --profile
    python benchmarks/bench_soc_step.py --arch 20 --repeats 5 --compare-layouts
    python benchmarks/bench_soc_step.py --bound-only --arch 20   # whole-network Lipschitz bound

On a shared, oversubscribed machine run it with ``OMP_WAIT_POLICY=PASSIVE``: with libgomp's
default spin-waiting, every OpenMP region stalls while another process holds the cores and
steps become 3–5× slower and very noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from lipcli.builtins.soc import layer as soc_module
from lipcli.builtins.soc.layer import SOC


def maxmin(z: torch.Tensor) -> torch.Tensor:
    a, b = z.chunk(2, dim=1)
    return torch.cat([torch.maximum(a, b), torch.minimum(a, b)], dim=1)


def maxpool(z: torch.Tensor) -> torch.Tensor:
    a, b = z.chunk(2, dim=1)
    return torch.maximum(a, b)


class Stack(nn.Module):
    """LipConvnet-n (SPEC §3) with max pooling and a linear head."""

    def __init__(self, depth: int, width: int = 32, fast: bool = True, classes: int = 10):
        super().__init__()
        b = depth // 5
        layers: list[SOC] = [SOC(3, width, 3, 1, fast_grad=fast)]
        acts: list[str] = ["maxmin"]
        c = width
        for _ in range(4):
            for _ in range(b - 1):
                layers.append(SOC(c, c, 3, 1, fast_grad=fast))
                acts.append("maxmin")
            layers.append(SOC(c, 4 * c, 3, 2, fast_grad=fast))
            acts.append("pool")
            c = 2 * c
        layers.append(SOC(c, 4 * c, 1, 2, fast_grad=fast))
        acts.append("maxmin" if b > 1 else "pool")
        for j in range(b - 1):
            layers.append(SOC(4 * c, 4 * c, 1, 1, fast_grad=fast))
            acts.append("maxmin" if j < b - 2 else "pool")
        self.layers = nn.ModuleList(layers)
        self.acts = acts
        self.head = nn.Linear(2 * c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, act in zip(self.layers, self.acts):
            x = layer(x)
            x = maxmin(x) if act == "maxmin" else maxpool(x)
        return self.head(x.flatten(1))


def make_pair(depth: int, width: int) -> tuple[Stack, Stack]:
    torch.manual_seed(0)
    fast = Stack(depth, width, fast=True)
    exact = Stack(depth, width, fast=False)
    exact.load_state_dict(fast.state_dict())
    for m in (fast, exact):
        for layer in m.layers:
            layer.refresh(50)
    return fast, exact


def step(model: Stack, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def profile_step(model: Stack, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(model, opt, x, y)
    rows = prof.key_averages()
    total = sum(r.self_cpu_time_total for r in rows)
    conv = sum(
        r.self_cpu_time_total
        for r in rows
        if "convolution" in r.key or "conv2d" in r.key or "mkldnn" in r.key
    )
    print(f"  profile: total self time {total / 1e6:.2f}s, convolutions {conv / total:.1%}, "
          f"other {1 - conv / total:.1%}")
    top = sorted(rows, key=lambda r: -r.self_cpu_time_total)[:12]
    for r in top:
        print(f"    {r.key:45s} {r.self_cpu_time_total / 1e3:9.1f} ms  x{r.count}")


def whole_network_bound(model: Stack) -> None:
    """Time the product of the guaranteed per-layer Lipschitz bounds (SPEC §5)."""
    model.eval()
    t0 = time.perf_counter()
    bound = 1.0
    for layer in model.layers:
        bound *= layer.lipschitz_upper_bound()
    t1 = time.perf_counter()
    print(f"whole-network guaranteed bound {bound:.6f} in {t1 - t0:.2f}s "
          f"({len(model.layers)} SOC layers)")


def filter_prep_time(model: Stack, repeats: int = 3) -> float:
    """Seconds per step spent computing S (power step, skew part, σ) and its backward, summed
    over the SOC layers (min over repeats per layer)."""
    total = 0.0
    for layer in model.layers:
        G = torch.randn_like(layer.weight)
        best = float("inf")
        for _ in range(repeats):
            layer.weight.grad = None
            t0 = time.perf_counter()
            S = layer._compute_S(layer.power_iters)
            S.backward(G)
            best = min(best, time.perf_counter() - t0)
        total += best
        layer.weight.grad = None
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", type=int, default=5, help="LipConvnet depth n (5, 10, ..., 40)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--channels-last", action="store_true", help="feed the input channels-last")
    p.add_argument("--cl-min-pixels", type=int, default=soc_module.CHANNELS_LAST_MIN_PIXELS or 0,
                   help="SOC channels-last threshold (0 disables)")
    p.add_argument("--compare-layouts", action="store_true",
                   help="also time both modes with the SOC channels-last switch off, interleaved")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--bound-only", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    fast, exact = make_pair(args.arch, args.width)
    if args.bound_only:
        whole_network_bound(fast)
        return
    dev = torch.device(args.device)
    fast.to(dev)
    exact.to(dev)
    fast.train()
    exact.train()
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(args.batch, 3, 32, 32, generator=gen).to(dev)
    y = torch.randint(0, 10, (args.batch,), generator=gen).to(dev)
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    opts = {
        "fast": torch.optim.SGD(fast.parameters(), lr=1e-3, momentum=0.9),
        "exact": torch.optim.SGD(exact.parameters(), lr=1e-3, momentum=0.9),
    }
    models = {"fast": fast, "exact": exact}
    soc_module.CHANNELS_LAST_MIN_PIXELS = args.cl_min_pixels or None
    configs = [("fast", args.cl_min_pixels or None), ("exact", args.cl_min_pixels or None)]
    if args.compare_layouts:
        configs += [("fast", None), ("exact", None)]
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)

    def timed(config: tuple[str, int | None]) -> float:
        name, threshold = config
        soc_module.CHANNELS_LAST_MIN_PIXELS = threshold
        sync()
        t0 = time.perf_counter()
        step(models[name], opts[name], x, y)
        sync()
        return time.perf_counter() - t0

    def label(config: tuple[str, int | None]) -> str:
        return f"{config[0]}/cl>={config[1]}" if config[1] else f"{config[0]}/nchw"

    for _ in range(args.warmup):
        for config in configs:
            timed(config)
    times: dict[str, list[float]] = {label(c): [] for c in configs}
    for rep in range(args.repeats):
        order = configs if rep % 2 == 0 else configs[::-1]
        for config in order:
            times[label(config)].append(timed(config))
        print(f"rep {rep}: " + "  ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()), flush=True)
    print(f"LipConvnet-{args.arch} batch {args.batch} threads {args.threads} "
          f"input channels_last={args.channels_last} device={args.device}")
    for i in range(0, len(configs), 2):
        lf, le = label(configs[i]), label(configs[i + 1])
        mf, me = statistics.median(times[lf]), statistics.median(times[le])
        print(f"median step: {lf} {mf:.3f}s  {le} {me:.3f}s  saving {1 - mf / me:.1%}  "
              f"(min {min(times[lf]):.3f}s / {min(times[le]):.3f}s)")
    soc_module.CHANNELS_LAST_MIN_PIXELS = args.cl_min_pixels or None
    if args.profile:
        prep = filter_prep_time(fast)
        mf = statistics.median(times[label(configs[0])])
        print(f"filter preparation (power step, skew, sigma, S and its backward): {prep:.3f}s "
              f"per step = {prep / mf:.1%} of the median fast step")
        print("fast step:")
        profile_step(fast, opts["fast"], x, y)
        print("exact step:")
        profile_step(exact, opts["exact"], x, y)


if __name__ == "__main__":
    main()
