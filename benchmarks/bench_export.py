"""Throughput of exported programs (features + certificate) vs lipcli on this CPU.

    .venv/bin/python benchmarks/bench_export.py --out docs/data/cpu-export-bench.json \
        [--cases lipconvnet-5:lln,lipconvnet-5:mlp] [--width 32] [--batch 256] [--repeats 3] \
        [--dense-max-mib 32]

For each case an untrained model (seed 0, power iteration converged) is exported with
``--certify`` to every available format (``--dense-max-mib`` as given, else ``lip export``'s
default), and one batch of random images is timed: median of ``repeats`` rounds after one
warm-up, each round running every row below once in turn (interleaved, so that load changes
hit all rows alike; the load average before and after the timing is recorded):

* ``lipcli features``: ``model.features(x)`` under ``no_grad`` (the literal layers, ``lip
  certify --series``);
* ``lipcli lowered features``: the eval lowering ``lip certify`` runs on many inputs
  (:func:`lipcli.lowering.network.lowered_network`, the device's default cap; its build
  time is recorded as ``lowered_build_s``);
* ``lipcli features + certificate``: that plus the head's certificate as ``lip certify`` runs it
  (CRC-Lip: closed form and dual) divided by the guaranteed Lipschitz bound;
* ``lipcli features + closed form`` (CRC-Lip only): the certificate the export computes;
* ``<format>``: the exported program (logits and radius) in its runtime (``--formats``: only
  these).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds per call of each function: one warm-up each, then ``repeats`` rounds
    that call every function once in turn (so that a change of the machine's load hits all
    of them alike)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_case(arch: str, head: str, width: int, batch: int, repeats: int, workdir: Path,
               dense_max_mib: float, formats: tuple[str, ...] = ()) -> dict:
    from lipcli import create_model, save_model
    from lipcli.builtins.crc.certifier import CRCCertifier
    from lipcli.export import ExportOptions, export_model
    from lipcli.export.formats import FORMATS
    from lipcli.lipschitz.bound import guaranteed_upper_bound
    from lipcli.host.models import load_model
    from lipcli.host.plugins import get_registry

    torch.manual_seed(0)
    path = workdir / f"{arch}-{head}.safetensors"
    save_model(create_model(arch, width=width, head=head), path)
    model, _ = load_model(path)
    x = torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    reg = get_registry()
    name = reg.get("head", head).certificate
    bound = guaranteed_upper_bound(model)[0]
    fns = {}

    def features():
        with torch.no_grad():
            return model.features(x)

    fns["lipcli features"] = features
    from lipcli.lowering.network import lowered_network

    t0 = time.perf_counter()
    lowered = lowered_network(model.eval())  # lip certify's eval lowering, device default cap
    lowered_build_s = time.perf_counter() - t0

    def lowered_features():
        with torch.no_grad():
            return lowered.features(x)

    fns["lipcli lowered features"] = lowered_features
    certifier = reg.component("certificate", name).build()
    certifier.prepare(model.head, None)

    def full():
        y = features()
        return certifier.certify(model.head, y).radius / bound

    fns["lipcli features + certificate"] = full
    if name == "crc-lip":
        closed = CRCCertifier(dual=False)
        closed.prepare(model.head, None)
        fns["lipcli features + closed form"] = lambda: closed.certify(model.head, features()).radius / bound
    exports = {}
    for fmt in FORMATS.values():
        if formats and fmt.name not in formats:
            continue
        try:
            fmt.available()
        except Exception as exc:  # noqa: BLE001
            exports[fmt.name] = f"skipped: {exc}"
            continue
        t0 = time.perf_counter()
        report = export_model(path, ExportOptions(format=fmt.name, certify=True, check_inputs=16,
                                                  overwrite=True, dense_max_mib=dense_max_mib))
        export_s = time.perf_counter() - t0
        run, _ = fmt.load(Path(report.output))
        xn = x.numpy()
        fns[f"exported {fmt.name} (features + certificate)"] = lambda run=run: run(xn)
        exports[fmt.name] = {"export_s": export_s, "bytes": report.bytes,
                             "check": report.check.__dict__,
                             "dense_layers": report.record["lowering"]["dense_layers"]}
    load_before = os.getloadavg()
    rows = interleaved(fns, repeats)
    load_after = os.getloadavg()
    return {
        "arch": arch, "head": head, "certificate": name, "width": width, "batch": batch,
        "seconds_per_batch": rows,
        "images_per_s": {k: batch / v for k, v in rows.items()},
        "exports": exports,
        "lowered_build_s": lowered_build_s, "lowered_dense_layers": lowered.dense_layers,
        "load_average": {"before_timing": load_before, "after_timing": load_after},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="lipconvnet-5:lln,lipconvnet-5:mlp")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dense-max-mib", type=float, default=None,
                    help="lip export --dense-max-mib (default: lip export's)")
    ap.add_argument("--formats", default="", help="comma-separated export formats (default: all)")
    args = ap.parse_args()
    from lipcli.lowering.caps import EXPORT_DENSE_MAX_MIB

    if args.dense_max_mib is None:
        args.dense_max_mib = EXPORT_DENSE_MAX_MIB

    import onnxruntime  # noqa: F401 - version only

    report = {
        "command": "python benchmarks/bench_export.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "machine": {"threads": torch.get_num_threads(), "platform": platform.platform(),
                    "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                    "numpy": np.__version__, "load_average_at_start": os.getloadavg()},
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            arch, head = case.split(":")
            report["results"].append(bench_case(arch, head, args.width, args.batch, args.repeats, Path(tmp),
                                                 args.dense_max_mib,
                                                 tuple(f for f in args.formats.split(",") if f)))
            print(json.dumps(report["results"][-1]["images_per_s"], indent=1), flush=True)
            # written after every case, so that a stopped run keeps what it measured
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
