"""float32 radii against ``lip certify --exact`` on the imported CIFAR-10 test checkpoints of
every importer (``tests/data/import``: the paper's SOC, Cayley, BCOP and CRC LipConvNets; the
plugins' ``tests/data``: SLL, LOT, BRO/BRONet and LiResNet networks, made by running their authors'
code), on N seeded random images in CIFAR-10's layout (tests/conftest.py's ``write_cifar10``);
a ``<stem>.config.json`` beside a checkpoint is passed as ``--config``, as the import tests do.

    .venv/bin/python benchmarks/import_rounding.py 1000 > docs/data/cpu-import-rounding-report.json

Per model: points, the largest amount by which a float32 radius exceeds its float64 one
(``max_above``), the largest absolute difference, and how many float32 radii are above."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: (checkpoint relative to the repository, importer)
CASES = tuple([(f"tests/data/import/{c}.pt", "improved-l2") for c in (
    "improved_l2_lln_d10_w2", "improved_l2_cayley_lln_d5_w2", "improved_l2_bcop_lln_d5_w2", "improved_l2_crc_d5_w2")]
    + [(f"plugins/lipcli-sll/tests/data/{c}.pth", "sll") for c in ("sll_cifar10_c2_d1_w4", "sll_cifar10_c0_d2_w4")]
    + [(f"plugins/lipcli-lot/tests/data/{c}.pt", "lot") for c in ("lot_lipconvnet_b2_w2_lln", "lot_lipresnet_b3_w2_lln")]
    + [("plugins/lipcli-bro/tests/data/bronet_d2_w4_c10.pt", "bronet")]
    + [(f"plugins/lipcli-bro/tests/data/{c}.pt", "bronet-lipconvnet") for c in (
        "bronet_lipconvnet_b2_w2_c10", "bronet_lipconvnet_soc_b2_w2_c10", "bronet_lipconvnet_lot_b2_w2_c10")]
    + [("plugins/lipcli-liresnet/tests/data/liresnet_cifar10_d2_w4.pth", "liresnet")])


def main(n: int) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_cifar10

    lip = str(Path(sys.executable).with_name("lip"))
    work = Path(tempfile.mkdtemp())
    root = write_cifar10(work / "c10", test=n, seed=1)
    out = {"command": f"benchmarks/import_rounding.py {n}", "models": {}}
    for path, importer in CASES:
        checkpoint = REPO / path
        case = checkpoint.stem
        model = work / f"{case}.safetensors"
        config = checkpoint.with_name(f"{case}.config.json")
        subprocess.run([lip, "import", str(checkpoint), "--from", importer, "--out", str(model),
                        *(["--config", str(config)] if config.is_file() else [])], check=True, capture_output=True)
        radii = {}
        for exact in (False, True):
            table = work / "points.csv"
            subprocess.run([lip, "certify", str(model), "--data-dir", str(root), "--json", "--no-write",
                            "--per-sample", str(table), *(["--exact"] if exact else [])], check=True, capture_output=True)
            radii[exact] = [float(row["radius"]) for row in csv.DictReader(table.open())]
        diff = [a - b for a, b in zip(radii[False], radii[True])]
        out["models"][case] = {"importer": importer, "points": len(diff), "max_above": max(diff), "max_abs": max(map(abs, diff)),
                               "above": sum(d > 0 for d in diff)}
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000), indent=1))
