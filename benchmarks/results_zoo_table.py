"""Markdown table of the layer-zoo digits grid written by benchmarks/results_zoo.sh.

Usage: python benchmarks/results_zoo_table.py [OUTDIR ...]   (default runs/zoo; several output
folders of benchmarks/results_zoo.sh are joined, rows in the order of their logs)
Reads OUTDIR/NAME.train.json (lip train --json), OUTDIR/NAME.certify.json (lip certify --json,
all test images) and OUTDIR/NAME.attack.json (the PGD check); rows in the order of the log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(out: Path, name: str) -> str | None:
    train, cert = out / f"{name}.train.json", out / f"{name}.certify.json"
    attack_file = out / f"{name}.attack.json"
    if not (train.exists() and cert.exists()):
        return None
    t, c = json.loads(train.read_text()), json.loads(cert.read_text())
    a = json.loads(attack_file.read_text()) if attack_file.exists() else {}
    certified = {round(r["radius_units"]): r["certified_accuracy"] for r in c["radii"]}
    attack = a.get("attack") or {}
    cells = [
        f"`{name}`",
        f"{c['head']} / {c['certificate']['name']}",
        f"{100 * c['clean_accuracy']:.2f}",
        *(f"{100 * certified[e]:.2f}" for e in (36, 72, 108)),
        f"{c['lipschitz']['upper_bound']:.6f}",
        f"{t['time_s']:.0f}",
        f"{t['images_per_s']:.0f}",
        (f"{a['violations']} ({a['total']} images, {attack.get('steps')} steps)" if attack
         else "not run"),
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    outs = [Path(a) for a in sys.argv[1:]] or [Path("runs/zoo")]
    rows: dict[str, Path] = {}
    for out in outs:
        log = out / "log.txt"
        for line in log.read_text().splitlines() if log.exists() else []:
            name = line.split(":", 1)[0]
            if not line.endswith("skipped") and name not in rows:
                rows[name] = out
    print("| run | head / certificate | clean % | cert. 36 % | cert. 72 % | cert. 108 % "
          "| Lip. bound (guaranteed) | train s | img/s | PGD violations |")
    print("| --- | --- | --: | --: | --: | --: | --: | --: | --: | --: |")
    for name, out in rows.items():
        line = row(out, name)
        if line:
            print(line)


if __name__ == "__main__":
    main()
