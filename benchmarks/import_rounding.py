"""float32 radii against ``lip certify --exact`` on the imported test checkpoints of
``tests/data/import`` (the paper's SOC, Cayley, BCOP and CRC LipConvNets), on N seeded random
images in CIFAR-10's layout (tests/conftest.py's ``write_cifar10``).

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
CASES = ("improved_l2_lln_d10_w2", "improved_l2_cayley_lln_d5_w2", "improved_l2_bcop_lln_d5_w2",
         "improved_l2_crc_d5_w2")


def main(n: int) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import write_cifar10

    lip = str(Path(sys.executable).with_name("lip"))
    work = Path(tempfile.mkdtemp())
    root = write_cifar10(work / "c10", test=n, seed=1)
    out = {"command": f"benchmarks/import_rounding.py {n}", "models": {}}
    for case in CASES:
        model = work / f"{case}.safetensors"
        subprocess.run([lip, "import", str(REPO / "tests/data/import" / f"{case}.pt"), "--from", "improved-l2",
                        "--out", str(model)], check=True, capture_output=True)
        radii = {}
        for exact in (False, True):
            table = work / "points.csv"
            subprocess.run([lip, "certify", str(model), "--data-dir", str(root), "--json", "--no-write",
                            "--per-sample", str(table), *(["--exact"] if exact else [])], check=True, capture_output=True)
            radii[exact] = [float(row["radius"]) for row in csv.DictReader(table.open())]
        diff = [a - b for a, b in zip(radii[False], radii[True])]
        out["models"][case] = {"points": len(diff), "max_above": max(diff), "max_abs": max(map(abs, diff)),
                               "above": sum(d > 0 for d in diff)}
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000), indent=1))
