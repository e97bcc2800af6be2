"""Old-versus-new behaviour check for refactors: the same scenarios run with two commits' code.

    python tools/compare_versions.py OLD_COMMIT [NEW_COMMIT] [--out DIR]

Each commit is checked out into a temporary git worktree and run with this checkout's Python
(``.venv/bin/python`` unless ``PYTHON`` is set) and the commit's source on ``PYTHONPATH`` (lipcli
and the plugin of :data:`PLUGIN_SRC`, which must be installed). The scenarios train tiny digits
models (fixed seed, one thread): the quick start's and two more, one of them with the plugin
convolution ``lot``; they run ``lip certify``, ``lip lipschitz`` and ``lip bench certify`` on them. Compared: every tensor of every model file
(bit for bit) and every JSON report with timings, paths, versions and plugin provider names
removed. Keys that only the new version reports are listed (new
features), not counted. Exit status 0 when everything else is identical, 1 otherwise (the
differences are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = {
    "lln-max": ["--width", "4", "--epochs", "2"],
    "mlp-projection": ["--width", "4", "--epochs", "2", "--head", "mlp:hidden=64", "--pool", "projection"],
    "lot-lln": ["--width", "4", "--epochs", "2", "--conv", "lot"],  # a plugin convolution
}
#: the plugin of the ``--conv lot`` scenario, run from the commit's source like lipcli
PLUGIN_SRC = "plugins/lipcli-lot/src"
#: JSON keys whose values are allowed to differ (timings, file locations, versions, providers)
VOLATILE = re.compile(r"(time|seconds|_s$|per_s|throughput|wall|elapsed|created|date|path|file|"
                      r"version|provider|distribution|commit|host|pid|out$|dir$|memory|rss|load_average)", re.I)


def run(py: str, src: Path, args: list[str], cwd: Path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(src), str(src / PLUGIN_SRC))), OMP_NUM_THREADS="1",
               LIPCLI_RUNS=str(cwd / "runs"))
    proc = subprocess.run([py, "-m", "lipcli", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{src.name}: lip {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def scrub(obj, work: Path):
    """``obj`` without volatile keys, with the run's folder written as ``WORK`` in strings."""
    if isinstance(obj, dict):
        return {k: scrub(v, work) for k, v in sorted(obj.items()) if not VOLATILE.search(k)}
    if isinstance(obj, list):
        return [scrub(v, work) for v in obj]
    if isinstance(obj, str):
        return obj.replace(str(work), "WORK")
    return obj


def tensors(path: Path) -> dict[str, bytes]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k).numpy().tobytes() for k in f.keys()}


def scenarios(py: str, src: Path, work: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, opts in TRAIN.items():
        model = work / f"{name}.safetensors"
        run(py, src, ["train", "--dataset", "digits", "--arch", "lipconvnet-5", *opts, "--out", str(model),
                      "--overwrite", "-q"], work)
        out[f"{name}: tensors"] = tensors(model)
        out[f"{name}: certify"] = scrub(json.loads(run(py, src, ["certify", str(model), "--radii", "36,72,108",
                                                                   "--json", "-q"], work)), work)
        out[f"{name}: lipschitz"] = scrub(json.loads(run(py, src, ["lipschitz", str(model), "--json", "-q"], work)), work)
    out["bench certify (random lln)"] = scrub(json.loads(run(py, src, [
        "bench", "certify", "--arch", "lipconvnet-5", "--width", "4", "--batch-size", "8", "--n", "16", "--json"], work)), work)
    out["bench certify (mlp model)"] = scrub(json.loads(run(py, src, [
        "bench", "certify", str(work / "mlp-projection.safetensors"), "--batch-size", "8", "--n", "16", "--json"], work)), work)
    return out


@dataclass
class JsonDiff:
    """Differences between two scrubbed JSON values.  ``added``: keys only the new version
    reports (new features: listed, not differences); ``near``: relative differences of
    numbers within ``rtol`` (counted as equal)."""

    rtol: float = 0.0
    added: list[str] = field(default_factory=list)
    near: list[float] = field(default_factory=list)

    def __call__(self, a, b, where: str = "") -> list[str]:
        if type(a) is not type(b):
            return [f"{where}: {a!r} != {b!r}"]
        if isinstance(a, dict):
            lines = [f"{where}/{k}: only in old" for k in sorted(set(a) - set(b))]
            self.added += [f"{where}/{k}" for k in sorted(set(b) - set(a))]
            for k in sorted(set(a) & set(b)):
                lines += self(a[k], b[k], f"{where}/{k}")
            return lines
        if isinstance(a, list):
            if len(a) != len(b):
                return [f"{where}: {len(a)} items != {len(b)} items"]
            return [line for i, (x, y) in enumerate(zip(a, b)) for line in self(x, y, f"{where}[{i}]")]
        if a == b:
            return []
        if isinstance(a, float) and abs(a - b) <= self.rtol * max(abs(a), abs(b)):
            self.near.append(abs(a - b) / max(abs(a), abs(b)))
            return []
        return [f"{where}: {str(a)[:80]} != {str(b)[:80]}"]


def checkout(commit: str, parent: Path) -> Path:
    path = parent / f"src-{commit}"
    if path.exists():  # left by an interrupted run
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)
        subprocess.run(["rm", "-rf", str(path)], check=False)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), commit], check=True)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default="HEAD")
    ap.add_argument("--rtol", type=float, default=0.0,
                    help="JSON numbers within this relative difference count as equal (reported)")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    py = os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    base = args.out or Path(tempfile.mkdtemp(prefix="lipcli-compare-"))
    base.mkdir(parents=True, exist_ok=True)
    results, sources = {}, []
    try:
        for label, commit in (("old", args.old), ("new", args.new)):
            src = checkout(commit, base)
            sources.append(src)
            work = base / label
            work.mkdir(exist_ok=True)
            results[label] = scenarios(py, src, work)
    finally:
        for src in sources:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)], check=False)
    problems = []
    for key in results["old"]:
        a, b = results["old"][key], results["new"].get(key)
        if key.endswith("tensors"):
            assert isinstance(a, dict) and isinstance(b, dict)
            same = a.keys() == b.keys() and all(a[k] == b[k] for k in a)
            print(f"{key}: {len(a)} tensors, {'bit-identical' if same else 'DIFFERENT'}")
            if not same:
                problems.append(key)
        else:
            d = JsonDiff(rtol=args.rtol)
            lines = d(a, b)
            print(f"{key}: {'identical (timings, paths, versions, providers removed)' if not lines else 'DIFFERENT'}"
                  + (f"; {len(d.near)} numbers within rtol (max {max(d.near):.1e})" if d.near else "")
                  + (f"; new keys: {', '.join(d.added)}" if d.added else ""))
            for line in lines[:20]:
                print("   ", line)
            if lines:
                problems.append(key)
    print(f"old {args.old} vs new {args.new}: {'no difference' if not problems else 'differences in ' + ', '.join(problems)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
