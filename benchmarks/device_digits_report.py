"""Summarise the device script's digits runs (benchmarks/device_check.sh, step "digits"):
test accuracy with --cuda-graphs on and off, whether the graph was used, and the PGD check of
the graphed model.  Usage: python3 benchmarks/device_digits_report.py WORKDIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lipcli.host.modelfile import read_metadata


def main(work: str) -> None:
    root = Path(work)
    for mode in ("on", "off"):
        summary = json.loads((root / f"digits-train-{mode}.json").read_text())
        training = read_metadata(root / f"q-{mode}" / "model.safetensors").get("training", {})
        hist = training.get("history", [])
        print(f"cuda-graphs {mode}: test accuracy {summary['test_accuracy']:.4f}, "
              f"train loss by epoch {[round(h['train_loss'], 4) for h in hist]}, "
              f"{summary['images_per_s']:.0f} img/s, graphs {training.get('cuda_graphs')}")
    cert = json.loads((root / "digits-certify-on.json").read_text())
    rows = ", ".join(f"{r.get('radius')}: {r.get('certified_accuracy')}" for r in cert.get("radii", []))
    print(f"certify (graphed model): clean {cert['clean_accuracy']:.4f}, certified {rows}, "
          f"bound {cert['lipschitz']['upper_bound']}, PGD violations {cert['violations']}")


if __name__ == "__main__":
    main(sys.argv[1])
