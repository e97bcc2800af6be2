"""Training throughput with and without --extra-data (docs/benchmarks.md).

Usage: python benchmarks/bench_extra_data.py EXTRA.npz [--reps 3] [--epochs 3] [--out report.json]

1. End to end: ``lip train`` of the quick-start model (digits, LipConvnet-5, width 8) for
   ``--epochs`` epochs, alternately without and with ``--extra-data EXTRA.npz
   --extra-ratio 0.5`` (A B A B ..., so that drifting load on a shared machine hits both),
   reading ``training.images_per_s`` (training images per second of training time) from
   each model file.
2. The data path alone: one epoch of the training loader (no model), images per second,
   with and without the extra data, to show whether loading could be the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def train_rate(extra: str | None, epochs: int, directory: Path, tag: str) -> float:
    out = directory / f"{tag}.safetensors"
    cmd = [sys.executable, "-m", "lipcli", "train", "--dataset", "digits", "--arch", "lipconvnet-5",
           "--width", "8", "--epochs", str(epochs), "--out", str(out), "-q", "--overwrite",
           "--no-lipschitz-estimate"]
    if extra:
        cmd += ["--extra-data", extra, "--extra-ratio", "0.5"]
    subprocess.run(cmd, check=True)
    from lipcli.host.modelfile import read_metadata

    return float(read_metadata(out)["training"]["images_per_s"])


def loader_rate(extra_path: str | None) -> float:
    from lipcli.data.loaders import load_data, resolve_dataset, train_loader
    from lipcli.train.extradata import open_extra_data
    from lipcli.train.mixing import mixed_train_loader

    data = load_data(resolve_dataset("digits"), None, augment=True)
    if extra_path:
        loader, sampler = mixed_train_loader(data.train, open_extra_data(extra_path), ratio=0.5,
                                             batch_size=128, seed=0)
    else:
        loader, sampler = train_loader(data.train, batch_size=128, seed=0)
    sampler.set_epoch(0)
    start, n = time.perf_counter(), 0
    for images, _ in loader:
        n += images.shape[0]
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("extra")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for tag, extra in (("without", None), ("with", args.extra)):
                rates[tag].append(train_rate(extra, args.epochs, Path(tmp), f"{tag}{rep}"))
                print(tag, rep, rates[tag][-1], flush=True)
    loader = {"without": loader_rate(None), "with": loader_rate(args.extra)}
    med = {k: statistics.median(v) for k, v in rates.items()}
    report = {
        "command": " ".join(sys.argv), "train_images_per_s": rates, "median": med,
        "ratio_with_over_without": med["with"] / med["without"],
        "loader_only_images_per_s": loader, "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
