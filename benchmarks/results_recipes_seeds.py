"""Each recipe against lipcli's defaults for the same network, on digits, over seeds.

    python benchmarks/results_recipes_seeds.py OUTDIR [--epochs 30] [--seeds 0,1,2] [--jobs 6]
        [--device cuda] [--deadline-s S] [--only CONFIG,...] [--widths RECIPE=W,...]
        [--arch-set "RECIPE:KEY=V,...;..."] [--smoke]
    python benchmarks/results_seeds.py OUTDIR --raw FILE          # the table, mean ± sd

For every recipe of ``CONFIGS`` two configs, each trained once per seed on the digits set:

* ``R@recipe``: ``lip train --recipe R`` with only the budget changed: ``--epochs`` (and the
  recipe's warm-up scaled by the same factor), the data set, and for the widest networks
  ``--width`` (``WIDTHS``);
* ``R@defaults``: the same network (the recipe's arch, conv, activation, pool and head, same
  width) with every training setting at lipcli's defaults (SGD 0.1, step schedule, its loss).

plus ``lc5@defaults``, the quick start's LipConvnet-5 (width 8), the reference of the residual
networks at the same number of epochs.  Every model is certified at 36/72/108 on all 360 test
images and checked by 50-step l2 PGD (``--attack``).  Up to ``--jobs`` runs at a time (one GPU
holds them all); a run not finished by ``--deadline-s`` is stopped and left out (the table
shows how many seeds each row has).  A finished step (its output file) is skipped on a rerun.
The recipes' values come from the installed plugins: ``lip plugins -v --json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: recipe -> the width it trains at here (None: the recipe's own), in the order they run
WIDTHS = {"liresnet": 128, "bronet-lipconvnet": None, "lot": None, "sll-small": None,
          "lipconvnet": None, "bronet": 128, "lot-residual": 16, "lipnext": 64}
#: the network settings a recipe fixes (the rest is training)
NETWORK = ("arch", "conv", "activation", "pool", "head")
#: a recipe's epochs-long settings scaled with --epochs
SCALED = ("warmup_epochs",)


def recipe_values(lip: list[str]) -> dict[str, dict]:
    """``{recipe: values}`` from ``lip plugins -v --json``."""
    out = subprocess.run([*lip, "plugins", "-v", "--json"], capture_output=True, text=True,
                         check=True).stdout
    recipes = json.loads(out)["components"]["recipes"]
    found = {r["name"]: dict(r["values"]) for r in recipes}
    return found


def set_params(arch: str, params: dict[str, str]) -> str:
    """``arch`` (``name[:k=v,...]``) with ``params`` set (replaced where present, else added)."""
    for key, value in params.items():
        pattern = rf"([:,]){re.escape(key)}=[^,]*"
        if re.search(pattern, arch):
            arch = re.sub(pattern, rf"\g<1>{key}={value}", arch)
        else:
            arch += ("," if ":" in arch else ":") + f"{key}={value}"
    return arch


def configs(values: dict[str, dict], epochs: int, widths: dict[str, int | None] = WIDTHS,
            arch_set: dict[str, dict[str, str]] | None = None) -> dict[str, list[str]]:
    """``{config: lip train options}`` (without seed, output and device); ``widths``: recipe ->
    the width it trains at (None: its own); ``arch_set``: recipe -> architecture parameters
    set for both of its configs (e.g. a CPU's ``dense_width``)."""
    arch_set = arch_set or {}
    runs = {"lc5@defaults": ["--arch", "lipconvnet-5", "--width", "8", "--epochs", str(epochs)]}
    for name, width in widths.items():
        if name not in values:
            continue
        v, common = values[name], ["--epochs", str(epochs)]
        arch, params = str(v.get("arch", "")), dict(arch_set.get(name, {}))
        inside = width is not None and re.search(r"[:,]width=\d+", arch) is not None
        if inside:  # the width inside the arch: lip train refuses a second one
            params["width"] = str(width)
        elif width is not None:
            common += ["--width", str(width)]
        arch = set_params(arch, params)
        if name in arch_set:  # the recipe's arch replaced as a whole
            recipe = ["--recipe", name, *common, "--arch", arch]
        else:  # the recipe's own arch; only its width overridden
            recipe = ["--recipe", name, *common] + (["--width", str(width)] if inside else [])
        for key in SCALED:
            if v.get(key):
                recipe += [f"--{key.replace('_', '-')}", f"{v[key] * epochs / v['epochs']:g}"]
        runs[f"{name}@recipe"] = recipe
        defaults = ["--epochs", str(epochs)]
        for key in NETWORK:
            if v.get(key):
                defaults += [f"--{key}", arch if key == "arch" else str(v[key])]
        if width is not None and not inside:
            defaults += ["--width", str(width)]
        runs[f"{name}@defaults"] = defaults
    return runs


def parse_arch_set(text: str) -> dict[str, dict[str, str]]:
    """``"liresnet:dense_width=256;bronet:dense_width=256"`` -> ``{recipe: {key: value}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in filter(None, text.split(";")):
        name, _, rest = item.partition(":")
        pairs = [p.partition("=") for p in rest.split(",") if p]
        if name not in WIDTHS or not pairs or any(not k or not v for k, _, v in pairs):
            raise SystemExit(f"--arch-set: {item!r} is not RECIPE:KEY=VALUE,... with RECIPE one of "
                             f"{', '.join(WIDTHS)}")
        out[name] = {k: v for k, _, v in pairs}
    return out


def parse_widths(text: str, base: dict[str, int | None] = WIDTHS) -> dict[str, int | None]:
    """``"liresnet=16,lot=8"`` -> ``base`` with those recipes' widths replaced (unknown: error)."""
    widths = dict(base)
    for item in filter(None, text.split(",")):
        name, _, width = item.partition("=")
        if name not in widths or not width.isdigit():
            raise SystemExit(f"--widths: {item!r} is not RECIPE=WIDTH with RECIPE one of {', '.join(widths)}")
        widths[name] = int(width)
    return widths


def run_one(lip: list[str], out: Path, name: str, options: list[str], device: str,
            extra: list[str], attack_steps: int, deadline: float) -> str:
    model, train, cert = (out / f"{name}.safetensors", out / f"{name}.train.json",
                          out / f"{name}.certify.json")
    start = time.time()
    steps = [([*lip, "train", "--dataset", "digits", *options, *extra, "--device", device,
               "--out", str(model), "--overwrite", "-q", "--json"], train),
             ([*lip, "certify", str(model), "--radii", "36,72,108", "--device", device,
               "--attack", "--attack-steps", str(attack_steps), "--attack-restarts", "1",
               "--json", "-q"], cert)]
    for cmd, dest in steps:
        if dest.exists() and dest.stat().st_size:
            continue
        left = deadline - time.time()
        if left <= 0:
            return f"{name}: skipped (deadline)"
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=min(left, 86400))
        except subprocess.TimeoutExpired:
            return f"{name}: skipped (stopped at the deadline)"
        if res.returncode != 0:
            return f"{name}: skipped (rc {res.returncode}: {res.stderr.strip().splitlines()[-1:]})"
        tmp = dest.with_suffix(".tmp")
        tmp.write_text(res.stdout)
        tmp.replace(dest)
    model.unlink(missing_ok=True)  # the reports hold the figures; the weights are large
    shutil.rmtree(out / f"{name}-run", ignore_errors=True)
    return f"{name}: done in {time.time() - start:.0f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--deadline-s", type=float, default=1e9)
    ap.add_argument("--only", default="", help="configs, comma-separated (default: all)")
    ap.add_argument("--attack-steps", type=int, default=50)
    ap.add_argument("--widths", default="", help="RECIPE=W,... : train these recipes' networks at "
                    "width W (a CPU's scale) instead of WIDTHS'")
    ap.add_argument("--arch-set", default="", help="RECIPE:KEY=VALUE,...;... : architecture "
                    "parameters set for both of a recipe's configs (a CPU's dense_width)")
    ap.add_argument("--smoke", action="store_true", help="tiny runs: checks every config starts")
    ap.add_argument("--list", action="store_true", help="print the configs' commands and stop")
    args = ap.parse_args(argv)
    lip = [sys.executable, "-m", "lipcli"]
    deadline = time.time() + args.deadline_s
    widths = dict.fromkeys(WIDTHS, 8) if args.smoke else parse_widths(args.widths)  # smoke: all at 8
    runs = configs(recipe_values(lip), 1 if args.smoke else args.epochs, widths,
                   parse_arch_set(args.arch_set))
    if args.only:
        runs = {k: v for k, v in runs.items() if k in args.only.split(",")}
    extra = ["--limit-train", "48", "--limit-test", "16", "--batch-size", "16"] if args.smoke else []
    if args.list:
        for k, v in runs.items():
            print(k, " ".join(v))
        return 0
    args.outdir.mkdir(parents=True, exist_ok=True)
    jobs = [(f"{c}-s{s}", [*o, "--seed", s]) for c, o in runs.items() for s in args.seeds.split(",")]
    log = args.outdir / "times.txt"
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, lip, args.outdir, n, o, args.device, extra,
                               2 if args.smoke else args.attack_steps, deadline) for n, o in jobs]
        for f in futures:
            line = f.result()
            print(line, flush=True)
            with log.open("a") as fh:
                fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.exit(main())
