"""Markdown table, mean ± sd over seeds, of benchmarks/results_sota.sh's digits runs.

Usage: python benchmarks/results_seeds.py OUTDIR [--raw FILE]
Runs are named CONFIG-sSEED in OUTDIR/times.txt (in that order); each reads
OUTDIR/NAME.train.json and OUTDIR/NAME.certify.json (lip certify --attack --json, all test
images). A row is one config: clean and certified accuracy (%) at 36/72/108 as mean ± sample
standard deviation over its finished seeds, the mean guaranteed Lipschitz bound and training
time, and the PGD violations summed over the models certified with --attack (how many of
them is shown).
--raw FILE writes the reports unchanged as {name: {train, certify}}.
--epochs adds the epochs each seed ran (a --time-budget run fixes its own).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from results_table import names, reports  # noqa: E402


def _ms(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.1f} ± {statistics.stdev(values):.1f}" if len(values) > 1 else f"{mean:.1f}"


def row(config: str, runs: list[dict[str, Any]], epochs: bool = False) -> str:
    certs = [r["certify"] for r in runs]
    cols = [[100 * c["clean_accuracy"] for c in certs]]
    for e in (36, 72, 108):
        cols.append([100 * {round(x["radius_units"]): x["certified_accuracy"]
                            for x in c["radii"]}[e] for c in certs])
    attacks = [c["attack"] for c in certs if c.get("attack")]
    pgd = ("not run" if not attacks else
           f"{sum(a['violations'] for a in attacks)} ({len(attacks)} of {len(runs)} models × "
           f"{certs[0]['dataset']['size']} images, {attacks[0]['steps']} steps)")
    cells = [f"`{config}`", str(len(runs)), *(_ms(c) for c in cols),
             f"{statistics.fmean(c['lipschitz']['upper_bound'] for c in certs):.3f}",
             f"{statistics.fmean(r['train']['time_s'] for r in runs):.0f}", pgd]
    if epochs:
        cells.insert(2, "/".join(str(r["train"]["epochs"]) for r in runs))
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--raw", type=Path, help="write the raw reports to this JSON file")
    parser.add_argument("--epochs", action="store_true", help="a column of the epochs each seed ran")
    args = parser.parse_args()
    found: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for name in names(args.outdir):
        r = reports(args.outdir, name)
        if r is None:
            continue
        found[name] = {"train": r["train"], "certify": r["certify"]}
        groups.setdefault(name.rsplit("-s", 1)[0], []).append(r)
    epochs = "epochs | " if args.epochs else ""
    print(f"| config | seeds | {epochs}clean % | cert. 36 % | cert. 72 % | cert. 108 % "
          "| Lip. bound (guaranteed, mean) | train s (mean) | PGD violations |")
    print("| --- | --: | " + ("--: | " if args.epochs else "") + "--: | --: | --: | --: | --: | --: | --: |")
    for config, runs in groups.items():
        print(row(config, runs, args.epochs))
    if args.raw:
        args.raw.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
