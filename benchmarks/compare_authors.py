"""lipcli's layers against the authors' own code: output agreement and interleaved A/B time.

    python benchmarks/compare_authors.py --soc PATH --bro PATH --lot PATH --sll PATH \
        [--shim-soc] [--rounds 5] [--threads 1,2] [--json] \
        [--soc-networks 5,20 [--net-batch 128] [--net-width 32] [--networks-only]]

Each PATH is a checkout the user fetched (nothing is fetched here): SOC
github.com/singlasahil14/improved_l2_robustness, BRO github.com/ntuaislab/BRONet, LOT
github.com/AI-secure/Layerwise-Orthogonal-Training, SLL
github.com/araujoalexandre/Lipschitz-SLL-Networks.  Their layers are imported unmodified
(``benchmarks/authors_methods.py`` says where each lives and how its parameters map into
lipcli's layer).  Per layer shape and per network (LipConvnet-5's convolutions with MaxMin
between them) it prints

* ``agree``: ``max |lipcli − authors| / max |authors|`` over the train- and eval-mode outputs
  on the same parameters and input (float64 where the authors' code runs in it);
* ``train`` / ``eval``: the time ratio lipcli ÷ authors (below 1 = lipcli faster) of a training
  step (forward + backward) and of an eval forward, median [min..max] over interleaved rounds
  (each round times both, in alternating order), at each thread count;
* each checkout's commit (``git rev-parse HEAD``, or ``unknown``).

``--soc-networks 5,20`` adds the paper's whole network per depth (``authors_networks.py``: the
authors' ``LipConvNet`` against ``lipcli.create_model("lipconvnet-N")`` with the same weights):
``agree`` on the logits (float64, no power step), ``train`` a full training step (forward,
cross-entropy, backward, SGD step; no eval column) at ``--net-batch`` and ``--net-width``, with
the median seconds per step; ``--soc-dense`` adds lipcli with the opt-in dense form for tiny
images (``lipcli.builtins.soc.settings.CPU_DENSE_SMALL_IMAGES``) timed in the same rounds, and
``--compile MODE`` lipcli with its forward compiled by ``torch.compile``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from authors_methods import METHODS, REPOSITORIES, Method, Provider, Shape, Skip, checkout_commit, import_authors  # noqa: E402
import authors_networks  # noqa: E402

#: layer shapes per method: LipConvnet's kinds (stride 1 in = out, stride 2 doubling), small
SHAPES = (Shape(16, 16, 16), Shape(32, 32, 8), Shape(16, 32, 16, 2), Shape(64, 128, 4, 2))
SLL_SHAPES = (Shape(16, 16, 16), Shape(32, 32, 8))


def network_shapes(width: int, size: int = 32) -> list[Shape]:
    """LipConvnet-5's convolutions: ``3 → w`` and five stride-2 blocks doubling the channels, the
    last with a 1×1 filter."""
    shapes, c = [Shape(3, width, size)], width
    for block in range(5):
        shapes.append(Shape(c, 2 * c, size, 2, 1 if block == 4 else 3))
        c, size = 2 * c, size // 2
    return shapes


class MaxMin(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        a, b = x.view(x.shape[0], 2, x.shape[1] // 2, *x.shape[2:]).unbind(1)
        return torch.cat([torch.maximum(a, b), torch.minimum(a, b)], 1)


class Chain(nn.Module):
    """Layers (modules or functions) with MaxMin after each but the last."""

    def __init__(self, layers: list) -> None:
        super().__init__()
        self.fns = layers
        self.mods = nn.ModuleList([f for f in layers if isinstance(f, nn.Module)])

    def forward(self, x: Tensor) -> Tensor:
        for i, f in enumerate(self.fns):
            x = f(x)
            if i < len(self.fns) - 1:
                x = MaxMin()(x)
        return x


def move(module: nn.Module, device: str) -> nn.Module:
    """``module.to(device)`` plus the plain tensor attributes that ``.to`` leaves where they are
    (the authors' BRO keeps identity matrices as attributes, put on CUDA whenever it exists)."""
    module.to(device)
    for sub in module.modules():
        for name, value in list(vars(sub).items()):
            if isinstance(value, Tensor) and value.device != torch.device(device):
                setattr(sub, name, value.to(device))
    return module


def relative_difference(ours: Tensor, theirs: Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-300))


def agreement(method: Method, cls: type, shapes: list[Shape], batch: int, seed: int) -> tuple[float, str]:
    """Largest relative output difference (train and eval mode) of the chain of ``shapes``
    (one shape: the layer), and the dtype it ran in (float64, else float32)."""
    for dtype in (torch.float64, torch.float32):
        gen = torch.Generator().manual_seed(seed)
        try:
            auth = [move(method.authors(cls, s, gen, agreement=True), "cpu").to(dtype)
                    for s in shapes]
            ours = Chain([method.reference(a, s) for a, s in zip(auth, shapes)])
            theirs = Chain(auth)
            x = torch.randn(batch, shapes[0].cin, shapes[0].size, shapes[0].size, generator=gen,
                            dtype=torch.float64).to(dtype)
            worst = 0.0
            for mode in (True, False):
                theirs.train(mode), ours.train(mode)
                with torch.no_grad():
                    worst = max(worst, relative_difference(ours(x), theirs(x)))
            return worst, str(dtype).replace("torch.", "")
        except (RuntimeError, TypeError):
            if dtype == torch.float32:
                raise
    raise AssertionError("unreachable")


def _step(model: nn.Module, x: Tensor, train: bool) -> None:
    if train:
        model.train()
        model(x).square().mean().backward()
        for p in model.parameters():
            p.grad = None
    else:
        with torch.no_grad():
            model(x)


def interleaved_ratios(ours: Callable[[], None], theirs: Callable[[], None], rounds: int,
                       reps: int, warmup: int = 1,
                       sync: Callable[[], None] = lambda: None) -> list[float]:
    """Per round ``time(ours) / time(theirs)``, each the mean of ``reps`` calls, the order of
    the two alternating between rounds; ``sync`` waits for queued device work (CUDA)."""
    for _ in range(warmup):
        ours(), theirs()
    ratios = []
    for r in range(rounds):
        times = {}
        for name in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):
            fn = ours if name == "ours" else theirs
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            times[name] = (time.perf_counter() - t0) / reps
        ratios.append(times["ours"] / times["theirs"])
    return ratios


def spread(ratios: list[float]) -> dict:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "rounds": len(ratios)}


def timing(method: Method, cls: type, shapes: list[Shape], batch: int, seed: int, rounds: int,
           reps: int, device: str = "cpu") -> dict:
    """Both sides built on the CPU from the same parameters, then moved to ``device``."""
    gen = torch.Generator().manual_seed(seed)
    auth = [method.authors(cls, s, gen, agreement=False) for s in shapes]
    theirs, ours = Chain(auth), Chain([method.lipcli(a, s) for a, s in zip(auth, shapes)])
    move(theirs, device), move(ours, device)
    x = torch.randn(batch, shapes[0].cin, shapes[0].size, shapes[0].size, generator=gen).to(device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    out = {"train": spread(interleaved_ratios(lambda: _step(ours, x, True),
                                              lambda: _step(theirs, x, True), rounds, reps,
                                              sync=sync))}
    theirs.eval(), ours.eval()
    for a, s in zip(auth, shapes):
        method.prepare_eval(a, s)
    out["eval"] = spread(interleaved_ratios(lambda: _step(ours, x, False),
                                            lambda: _step(theirs, x, False), rounds, reps,
                                            sync=sync))
    return out


def compare(provider: Provider, methods: list[str], threads: list[int], rounds: int, reps: int,
            batch: int, width: int, seed: int = 0, shapes: dict | None = None,
            log: Callable[[str], None] = lambda s: None, device: str = "cpu") -> dict:
    """The whole comparison as a JSON-able dict: ``rows`` (method, what, agree, dtype, threads,
    train, eval) and ``skipped`` (lines)."""
    rows, skipped = [], []
    for name in methods:
        method = METHODS[name]
        try:
            cls = provider(name)
        except Skip as why:
            skipped.append(str(why))
            log(str(why))
            continue
        cases = [(s.label, [s]) for s in (shapes or {}).get(name, SLL_SHAPES if name == "sll" else SHAPES)]
        if method.network:
            cases.append((f"LipConvnet-5 w{width} b{batch}", network_shapes(width)))
        for what, chain in cases:
            try:
                agree, dtype = agreement(method, cls, chain, min(batch, 4), seed)
                for t in threads:
                    torch.set_num_threads(t)
                    row = {"method": name, "lipcli": method.lipcli_conv, "what": what,
                           "agree": agree, "dtype": dtype, "threads": t,
                           "device": device,
                           **timing(method, cls, chain, batch, seed, rounds, reps, device)}
                    rows.append(row)
                    log(format_row(row))
            except Skip as why:
                skipped.append(f"{why} ({what})")
                log(skipped[-1])
            except Exception as exc:  # noqa: BLE001 - e.g. the authors' code needing CUDA
                skipped.append(f"{name} ({what}): {type(exc).__name__}: {exc}"[:300])
                log(skipped[-1])
    return {"rows": rows, "skipped": skipped}


def interleaved_times(fns: dict[str, Callable[[], None]], rounds: int, reps: int,
                      warmup: int = 1) -> list[dict[str, float]]:
    """Per round the mean time of ``reps`` calls of each function, the order rotating by one
    between rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    names, out = list(fns), []
    for r in range(rounds):
        times = {}
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(reps):
                fns[name]()
            times[name] = (time.perf_counter() - t0) / reps
        out.append(times)
    return out


def network_rows(provider: Provider, depths: list[int], threads: list[int], rounds: int, reps: int,
                 batch: int, width: int, seed: int = 0, dense: bool = False,
                 log: Callable[[str], None] = lambda s: None, device: str = "cpu",
                 compile_mode: str | None = None) -> dict:
    """The SOC network rows (``authors_networks.py``) as :func:`compare`'s ``rows``/``skipped``:
    per depth and thread count the training-step ratio lipcli ÷ authors; with ``dense`` a second
    row for lipcli with the opt-in ``settings.CPU_DENSE_SMALL_IMAGES``, timed in the same
    interleaved rounds; with ``compile_mode`` a row for lipcli's forward compiled by
    ``torch.compile`` (``lipcli.compiling.Compiled``; compiled in two untimed warm-up steps,
    its compile seconds in the row).  On ``device`` ``cuda`` every step ends synchronised."""
    from lipcli.builtins.soc import settings

    rows, skipped = [], []
    try:
        cls = provider("soc-network")
    except Skip as why:
        return {"rows": [], "skipped": [str(why)]}
    for depth in depths:
        what = f"LipConvnet-{depth} SGD step w{width} b{batch}"
        try:
            theirs, ours, x, _ = authors_networks.network_pair(cls, depth, width, min(batch, 4), seed,
                                                               torch.float64)
            agree = authors_networks.network_agreement(theirs, ours, x)
            theirs, ours, x, y = authors_networks.network_pair(cls, depth, width, batch, seed)
            theirs, ours, x, y = theirs.to(device), ours.to(device), x.to(device), y.to(device)
            variants = {"ours": (ours, False)}
            if dense:
                variants["dense"] = (copy.deepcopy(ours), True)
            compiled = {}
            if compile_mode:
                from lipcli.compiling import Compiled

                twin = copy.deepcopy(ours)
                compiled["compiled"] = Compiled(twin, compile_mode, "the lipcli network")
                variants["compiled"] = (twin, False)
            for t in threads:
                torch.set_num_threads(t)
                fns = {"theirs": _synced(authors_networks.training_step(theirs, x, y), device)}
                for name, (model, on) in variants.items():
                    forward = compiled.get(name)
                    step = authors_networks.training_step(model, x, y, forward=forward)
                    fns[name] = _synced(_with_dense(step, on, settings), device, forward)
                times = interleaved_times(fns, rounds, reps, warmup=2 if compiled else 1)
                for name in variants:
                    label = {"dense": " CPU_DENSE_SMALL_IMAGES", "compiled": f" torch.compile {compile_mode}"}
                    row = {"method": "soc", "what": what, "agree": agree, "dtype": "float64", "threads": t,
                           "lipcli": f"lipconvnet-{depth} soc-fast" + label.get(name, ""),
                           "train": spread([r[name] / r["theirs"] for r in times]),
                           "seconds": {k: statistics.median(r[k] for r in times) for k in fns}}
                    if name in compiled:
                        row["compile"] = compiled[name].record()
                    rows.append(row)
                    log(format_row(row))
        except Exception as exc:  # noqa: BLE001 - e.g. the authors' code needing CUDA
            skipped.append(f"soc ({what}): {type(exc).__name__}: {exc}"[:300])
            log(skipped[-1])
    return {"rows": rows, "skipped": skipped}


def _synced(step: Callable[[], None], device: str, compiled=None) -> Callable[[], None]:
    """``step`` ending with a CUDA synchronisation on a GPU (so that it is timed whole), its
    compile seconds counted by ``compiled.measure()`` where given."""
    def run() -> None:
        if compiled is not None:
            with compiled.measure():
                step()
        else:
            step()
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
    return run


def _with_dense(step: Callable[[], None], on: bool, settings) -> Callable[[], None]:
    def run() -> None:
        saved, settings.CPU_DENSE_SMALL_IMAGES = settings.CPU_DENSE_SMALL_IMAGES, on
        try:
            step()
        finally:
            settings.CPU_DENSE_SMALL_IMAGES = saved
    return run


def _ratio(d: dict) -> str:
    return f"{d['median']:.2f} [{d['min']:.2f}..{d['max']:.2f}]"


def format_row(r: dict) -> str:
    what = r["what"] + (" (dense option)" if "DENSE" in r.get("lipcli", "") else "") + (
        " (compiled)" if "torch.compile" in r.get("lipcli", "") else "")
    return (f"| {r['method']} | {what} | {r['agree']:.1e} ({r['dtype']}) | {r['threads']} "
            f"| {_ratio(r['train'])} | {_ratio(r['eval']) if 'eval' in r else '—'} |")


def table(result: dict) -> str:
    lines = ["| method | shape / network | agree (max rel. diff.) | threads | train lipcli ÷ authors "
             "| eval lipcli ÷ authors |", "|---|---|---|---|---|---|"]
    lines += [format_row(r) for r in result["rows"]]
    lines += [f"skipped: {s}" for s in result["skipped"]]
    lines += [f"{m}: {REPOSITORIES[m]} at {c}" for m, c in result.get("commits", {}).items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for m in METHODS:
        ap.add_argument(f"--{m}", type=Path, metavar="PATH", help=f"checkout of {REPOSITORIES[m]}")
    ap.add_argument("--shim-soc", action="store_true",
                    help="import SOC on a machine without CUDA: torch's conv2d_weight for its cuDNN extension")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2, help="calls per timing in a round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=8, help="LipConvnet-5 width of the network rows")
    ap.add_argument("--device", default="cpu",
                    help="where the timed calls run (cpu, cuda); the agreement runs on the CPU")
    ap.add_argument("--soc-networks", default="", metavar="DEPTHS",
                    help="also time the paper's whole LipConvnet training step at these depths (e.g. 5,20; needs --soc)")
    ap.add_argument("--net-batch", type=int, default=128, help="batch of the --soc-networks rows")
    ap.add_argument("--net-width", type=int, default=32, help="width of the --soc-networks rows")
    ap.add_argument("--networks-only", action="store_true", help="only the --soc-networks rows")
    ap.add_argument("--soc-dense", action="store_true",
                    help="--soc-networks: also time lipcli with the opt-in CPU_DENSE_SMALL_IMAGES (same rounds)")
    ap.add_argument("--compile", default=None, metavar="MODE",
                    help="also time lipcli's network with its forward compiled (torch.compile MODE: "
                         "default, reduce-overhead, max-autotune) in the same rounds")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    checkouts = {m: getattr(args, m) for m in METHODS if getattr(args, m) is not None}
    if not checkouts:
        ap.error("give at least one checkout (--soc/--bro/--lot/--sll PATH)")
    missing = [str(p) for p in checkouts.values() if not p.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        threads = [int(t) for t in args.threads.split(",")]
        depths = [int(d) for d in args.soc_networks.split(",") if d.strip()]
    except ValueError:
        print(f"error: --threads and --soc-networks want numbers like 1,2, got "
              f"{args.threads!r} / {args.soc_networks!r}", file=sys.stderr)
        return 2
    if depths and "soc" not in checkouts:
        print("error: --soc-networks needs the SOC checkout (--soc PATH)", file=sys.stderr)
        return 2
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    provider = import_authors(checkouts, args.shim_soc)
    result = {"rows": [], "skipped": []} if args.networks_only else compare(
        provider, list(checkouts), threads, args.rounds, args.reps, args.batch, args.width, log=log,
        device=args.device)
    if depths:
        nets = network_rows(provider, depths, threads, args.rounds, args.reps, args.net_batch,
                            args.net_width, dense=args.soc_dense, log=log, device=args.device,
                            compile_mode=args.compile)
        result["rows"] += nets["rows"]
        result["skipped"] += nets["skipped"]
    result["commits"] = {m: checkout_commit(p) for m, p in checkouts.items()}
    result["torch"], result["cpu_threads"], result["device"] = torch.__version__, threads, args.device
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    print(json.dumps(result, indent=1, ensure_ascii=False) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
