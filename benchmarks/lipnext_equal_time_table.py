"""The table of benchmarks/lipnext_equal_time.sh: mean ± sd over seeds per config; RAW: every run's
`lip train --json` and `lip certify --json` (usage: OUTDIR [RAW.json])."""
import json
import os
import statistics as st
import sys

O = sys.argv[1]
rows, raw = [], []
for name in ("lipnext", "liresnet", "lc5"):
    runs = []
    seeds = sorted(int(f.rsplit("-", 1)[1].split(".")[0]) for f in os.listdir(O) if f.startswith(name + "-") and f.endswith(".train.json"))
    for s in seeds:
        t, c = f"{O}/{name}-{s}.train.json", f"{O}/{name}-{s}.cert.json"
        if not (os.path.exists(t) and os.path.exists(c)) or not os.path.getsize(c):
            continue
        tr, ce = json.load(open(t)), json.load(open(c))
        ce.pop("promises", None)
        raw.append({"config": name, "seed": s, "train": tr, "certify": ce})
        runs.append((tr, ce))
    if not runs:
        continue
    f = lambda xs: f"{100*st.mean(xs):.1f} ± {100*st.stdev(xs):.1f}" if len(xs) > 1 else f"{100*xs[0]:.1f}"
    clean = [c["clean_accuracy"] for _, c in runs]
    cert = [[c["radii"][i]["certified_accuracy"] for _, c in runs] for i in range(3)]
    viol = sum(c["violations"] for _, c in runs)
    rows.append(f"| {name} | {len(runs)} | {', '.join(str(t['epochs']) for t, _ in runs)} | {f(clean)} | "
                + " | ".join(f(x) for x in cert)
                + f" | {st.mean(c['lipschitz']['value'] for _, c in runs):.3f} | {st.mean(t['time_s'] for t, _ in runs):.0f} | {viol} |")
print("\n".join(rows))
if len(sys.argv) > 2:
    json.dump(raw, open(sys.argv[2], "w"), indent=1)
