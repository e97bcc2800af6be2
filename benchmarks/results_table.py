"""Markdown table (and one raw JSON report) of the digits runs behind docs/results.md.

Usage: python benchmarks/results_table.py OUTDIR [OUTDIR ...] [--raw FILE]
OUTDIR is the output folder of benchmarks/results_digits.sh, results_recipes.sh or
results_zoo.sh; several are joined. Rows are the runs named in OUTDIR/log.txt or
OUTDIR/times.txt, in that order. A row reads OUTDIR/NAME.train.json (lip train --json),
OUTDIR/NAME.certify.json (lip certify --json, all test images) and, where the PGD check ran
apart from the certification (results_zoo.sh), OUTDIR/NAME.attack.json.
--raw FILE writes those reports, unchanged, as one JSON object {name: {train, certify,
attack}} (the raw report of the table in docs/data/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() and path.stat().st_size else None


def reports(out: Path, name: str) -> dict[str, Any] | None:
    train, cert = _load(out / f"{name}.train.json"), _load(out / f"{name}.certify.json")
    if train is None or cert is None:
        return None
    return {"train": train, "certify": cert, "attack": _load(out / f"{name}.attack.json")}


def pgd_cell(attack_report: dict[str, Any]) -> str:
    attack = attack_report.get("attack")
    if not attack:
        return "not run"
    total = attack_report["dataset"]["size"]
    return f"{attack['violations']} ({total} images, {attack['steps']} steps)"


def row(name: str, r: dict[str, Any]) -> str:
    t, c = r["train"], r["certify"]
    a = r["attack"] or c
    certified = {round(x["radius_units"]): x["certified_accuracy"] for x in c["radii"]}
    cells = [
        f"`{name}`",
        f"{c['head']} / {c['certificate']['name']}",
        f"{100 * c['clean_accuracy']:.2f}",
        *(f"{100 * certified[e]:.2f}" for e in (36, 72, 108)),
        f"{c['lipschitz']['upper_bound']:.6f}",
        f"{t['time_s']:.0f}",
        pgd_cell(a),
    ]
    return "| " + " | ".join(cells) + " |"


def names(out: Path) -> list[str]:
    found: list[str] = []
    for log in (out / "log.txt", out / "times.txt"):
        for line in log.read_text().splitlines() if log.exists() else []:
            name = line.split(":", 1)[0]
            if not line.endswith("skipped") and name not in found:
                found.append(name)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdirs", nargs="+", type=Path)
    parser.add_argument("--raw", type=Path, help="write the raw reports to this JSON file")
    args = parser.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    for out in args.outdirs:
        for name in names(out):
            r = reports(out, name)
            if r is not None and name not in rows:
                rows[name] = r
    print("| run | head / certificate | clean % | cert. 36 % | cert. 72 % | cert. 108 % "
          "| Lip. bound (guaranteed) | train s | PGD violations |")
    print("| --- | --- | --: | --: | --: | --: | --: | --: | --: |")
    for name, r in rows.items():
        print(row(name, r))
    if args.raw:
        args.raw.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
