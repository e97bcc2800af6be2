"""BRO training step on CPU: ``factor="auto"`` (checked Cholesky QR) vs ``factor="qr"``
(Householder QR), and optionally the authors' BRO layer, at 1 and 2 threads.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bro_cpu_factor.py [--authors BRONET_DIR] [--rounds 7] [-o OUT.json]

Timed: one training step (forward, loss, backward) per sample, fresh gradients each time, float32.
Layers (``in → out @ H×W``, stride, kernel; loss = mean square of the output) at LipConvnet's
shapes, and lipcli's LipConvnet-5 (width 16, LLN head, batch 128, cross entropy). The variants run
in interleaved rounds (the starting variant rotates), so a loaded machine slows them alike;
reported per variant: median [min..max] seconds per step, and per pair the median [min..max]
of the per-round ratios.

``--authors DIR``: a checkout of github.com/ntuaislab/BRONet that the user fetched (nothing is
fetched here; ``einops`` must be importable, their code needs it). Their BRO layer
(``DIR/lipconvnet/models/layers/bro.py``, imported unmodified; zero padding, so its FFT grid is
``H + 2`` per side for 3×3 filters) runs at the same shapes with ``mask_level`` = the rank ratio,
and their LipConvnet-5 layout (their ``BRO`` blocks, width 16: 3→32→64→128→256→512, stride 2,
last kernel 1, lipcli's MaxMin, their ``NormalizedLinear`` head) beside lipcli's network.
``torch.set_num_threads`` is called here only (timing), never in lipcli.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

#: (in, out, image size, stride, kernel): the issue's shapes (LipConvnet-5 layers at width 16/32)
LAYERS = [(32, 32, 32, 1, 3), (64, 64, 16, 1, 3), (128, 128, 8, 1, 3), (64, 256, 8, 2, 3), (256, 1024, 2, 2, 1)]


def lipcli_layer(cin: int, cout: int, size: int, stride: int, k: int, factor: str, ratio: float) -> nn.Module:
    from lipcli_bro import BROConv

    return BROConv(cin, cout, k, stride, rank_ratio=ratio, init="random", factor=factor)


def authors_modules(root: Path):
    sys.path.insert(0, str(root / "lipconvnet"))
    return importlib.import_module("models.layers.bro"), importlib.import_module("models.layers.normalized_linear")


def authors_layer(bro, cin: int, cout: int, size: int, stride: int, k: int, ratio: float) -> nn.Module:
    return bro.BRO(cin, cout, k, input_size=size, stride=stride, padding=k // 2, mask_level=ratio, id_init=False)


def authors_network(bro, linear, width: int, ratio: float) -> nn.Module:
    """Their LipConvNet-5 layout for BRO (block size 1) from their layers."""
    from lipcli.builtins.activations import MaxMin

    layers: list[nn.Module] = []
    cin, size = 3, 32
    for i in range(5):
        cout = (width if i == 0 else cin) * 2
        layers += [bro.BRO(cin, cout, 3 if i < 4 else 1, input_size=size, stride=2, padding=1 if i < 4 else 0,
                           mask_level=ratio), MaxMin(cout)]
        cin, size = cout, size // 2
    return nn.Sequential(*layers, nn.Flatten(), linear.NormalizedLinear(cin, 10))


def lipcli_network(width: int, factor: str, ratio: float) -> nn.Module:
    from lipcli.host.models import create_model

    return create_model("lipconvnet-5", conv=f"bro:factor={factor},rank_ratio={ratio}", width=width)


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out, y) if y is not None else out.square().mean()
        loss.backward()
    return run


def interleaved(variants: dict[str, Callable[[], None]], rounds: int,
                errors: dict[str, str]) -> dict[str, list[float]]:
    """Per-variant step times; a variant that raises is dropped (its error in ``errors``) and
    the others keep their rounds (paired ratios need equal counts, which they keep)."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(-1, rounds):  # round -1: warm-up (allocator, first-call costs), not kept
        start = r % len(names)
        kept: dict[str, float] = {}
        for name in names[start:] + names[:start]:
            t0 = time.perf_counter()
            try:
                variants[name]()
            except RuntimeError as exc:  # the authors' batched solve fails in some MKL runs
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            kept[name] = time.perf_counter() - t0
        names = [n for n in names if n in kept]
        if r >= 0:
            for name in names:
                times[name].append(kept[name])
    return {n: t for n, t in times.items() if n in names}


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def report(label: str, threads: int, times: dict[str, list[float]], errors: dict[str, str]) -> dict:
    row = {"case": label, "threads": threads, "seconds": {n: summary(t) for n, t in times.items()}, "ratios": {},
           "errors": errors}
    for other in ("qr", "authors"):
        if other in times:
            row["ratios"][f"auto/{other}"] = summary([a / b for a, b in zip(times["auto"], times[other])])
    cells = [f"{n} {s['median'] * 1e3:8.1f} ms" for n, s in row["seconds"].items()]
    cells += [f"{k} {v['median']:.2f} [{v['min']:.2f}..{v['max']:.2f}]" for k, v in row["ratios"].items()]
    cells += [f"{n} FAILED ({e[:60]})" for n, e in errors.items()]
    print(f"{threads}T  {label:30s} " + "  ".join(cells), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", type=Path, help="a BRONet checkout (github.com/ntuaislab/BRONet)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=32, help="batch of the layer cases")
    ap.add_argument("--net-batch", type=int, default=128)
    ap.add_argument("--rank-ratio", type=float, default=0.5)
    ap.add_argument("--no-network", action="store_true")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    authors = authors_modules(args.authors) if args.authors else None
    ratio = args.rank_ratio
    rows = []
    print(f"torch {torch.__version__}; rank ratio {ratio}; layer batch {args.batch}; rounds {args.rounds}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for cin, cout, size, stride, k in LAYERS:
            torch.manual_seed(0)
            x = torch.randn(args.batch, cin, size, size)
            models = {f: lipcli_layer(cin, cout, size, stride, k, f, ratio) for f in ("auto", "qr")}
            models["qr"].load_state_dict(models["auto"].state_dict())
            if authors is not None:
                models["authors"] = authors_layer(authors[0], cin, cout, size, stride, k, ratio)
            variants = {n: step(m.train(), x, None) for n, m in models.items()}
            label = f"{cin}->{cout} @{size}x{size} s{stride} k{k}"
            errors: dict[str, str] = {}
            rows.append(report(label, threads, interleaved(variants, args.rounds, errors), errors))
        if args.no_network:
            continue
        torch.manual_seed(0)
        x, y = torch.rand(args.net_batch, 3, 32, 32), torch.randint(0, 10, (args.net_batch,))
        nets = {f: lipcli_network(16, f, ratio) for f in ("auto", "qr")}
        nets["qr"].load_state_dict(nets["auto"].state_dict())
        if authors is not None:
            nets["authors"] = authors_network(*authors, 16, ratio)
        variants = {n: step(m.train(), x, y) for n, m in nets.items()}
        errors = {}
        times = interleaved(variants, args.rounds, errors)
        rows.append(report(f"LipConvnet-5 w16 batch {args.net_batch}", threads, times, errors))
    if args.out:
        meta = {"torch": torch.__version__, "rank_ratio": ratio, "batch": args.batch, "net_batch": args.net_batch,
                "rounds": args.rounds, "authors": str(args.authors) if args.authors else None}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
