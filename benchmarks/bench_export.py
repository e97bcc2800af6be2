"""Throughput of exported programs (features + certificate) vs lipcli on this CPU.

    .venv/bin/python benchmarks/bench_export.py --out docs/data/cpu-export-bench.json \
        [--cases lipconvnet-5:lln,lipconvnet-5:mlp] [--width 32] [--batch 256] [--repeats 3]

For each case an untrained model (seed 0, power iteration converged) is exported with
``--certify`` to every available format, and one batch of random images is timed (median of
``repeats`` after one warm-up):

* ``lipcli features``: ``model.features(x)`` under ``no_grad`` (``lip certify``'s feature pass);
* ``lipcli features + certificate``: that plus the head's certificate as ``lip certify`` runs it
  (CRC-Lip: closed form and dual) divided by the guaranteed Lipschitz bound;
* ``lipcli features + closed form`` (CRC-Lip only): the certificate the export computes;
* ``<format>``: the exported program (logits and radius) in its runtime.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_case(arch: str, head: str, width: int, batch: int, repeats: int, workdir: Path) -> dict:
    from lipcli import create_model, save_model
    from lipcli.builtins.crc.certifier import CRCCertifier
    from lipcli.export import ExportOptions, export_model
    from lipcli.export.formats import FORMATS
    from lipcli.host.lipschitz import guaranteed_upper_bound
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
    rows = {}

    def features():
        with torch.no_grad():
            return model.features(x)

    rows["lipcli features"] = timed(features, repeats)
    certifier = reg.component("certificate", name).build()
    certifier.prepare(model.head, None)

    def full():
        y = features()
        return certifier.certify(model.head, y).radius / bound

    rows["lipcli features + certificate"] = timed(full, repeats)
    if name == "crc-lip":
        closed = CRCCertifier(dual=False)
        closed.prepare(model.head, None)
        rows["lipcli features + closed form"] = timed(
            lambda: closed.certify(model.head, features()).radius / bound, repeats)
    exports = {}
    for fmt in FORMATS.values():
        try:
            fmt.available()
        except Exception as exc:  # noqa: BLE001
            exports[fmt.name] = f"skipped: {exc}"
            continue
        t0 = time.perf_counter()
        report = export_model(path, ExportOptions(format=fmt.name, certify=True, check_inputs=16,
                                                  overwrite=True))
        export_s = time.perf_counter() - t0
        run, _ = fmt.load(Path(report.output))
        xn = x.numpy()
        rows[f"exported {fmt.name} (features + certificate)"] = timed(lambda: run(xn), repeats)
        exports[fmt.name] = {"export_s": export_s, "bytes": report.bytes,
                             "check": report.check.__dict__}
    return {
        "arch": arch, "head": head, "certificate": name, "width": width, "batch": batch,
        "seconds_per_batch": rows,
        "images_per_s": {k: batch / v for k, v in rows.items()},
        "exports": exports,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="lipconvnet-5:lln,lipconvnet-5:mlp")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import os

    import onnxruntime  # noqa: F401 - version only

    report = {
        "command": "python benchmarks/bench_export.py " + " ".join(
            f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        "machine": {"threads": torch.get_num_threads(), "platform": platform.platform(),
                    "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                    "numpy": np.__version__, "load_average_at_start": os.getloadavg()},
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            arch, head = case.split(":")
            report["results"].append(bench_case(arch, head, args.width, args.batch, args.repeats, Path(tmp)))
            print(json.dumps(report["results"][-1]["images_per_s"], indent=1), flush=True)
            # written after every case, so that a stopped run keeps what it measured
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
