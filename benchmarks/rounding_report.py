"""How far float32 radii lie from float64 ones: ``lip certify --exact`` against the float32 paths.

    .venv/bin/python benchmarks/rounding_report.py [--out docs/data/cpu-rounding-report.json]
        [--quickstart MODEL] [--quickstart-epochs 3] [--epochs 2] [--limit-train 300]
        [--convs soc,bro,lot,cayley,sll,aol,bcop] [--no-export] [--model NAME=MODEL ...]

Models (trained here on the CPU, in this process, into ``--work``; seed 0):

* ``quickstart``: the README's first command, ``lip train --dataset digits --arch lipconvnet-5
  --width 8`` (LLN head), with ``--quickstart-epochs`` epochs instead of 30 unless
  ``--quickstart MODEL`` names a trained one (the report records which);
* one LipConvnet-5 of width 4 per convolution of ``--convs`` (the built-in ``soc`` and the
  plugins' ``bro``, ``lot``, ``cayley``, ``sll``, ``aol``, ``bcop``), ``--epochs`` epochs on
  ``--limit-train`` digits training images.

* ``--model NAME=MODEL`` (repeatable): a trained digits model file of any other kind (e.g. a
  ``lip train --recipe lipnext`` model), reported as ``NAME``.

Radii of every model on the 360 digits test points (input-space l2, the predicted class's):

* ``exact``: ``lip certify --exact`` (float64 copy of the model, literal layers) -- the reference;
* ``literal``: ``lip certify --series`` (float32, every layer in its literal form);
* ``default``: ``lip certify`` as it runs on these 360 points (the eval lowering decides);
* ``lowered``: the layers whose dense build pays off on the passes of a default ``--attack``
  check on these points (100 steps x 2 restarts) run as dense float32 matrices: the driver's
  steps on :func:`~lipcli.lowering.network.lowered_network` sized for those passes;
* ``pt2``: ``lip export --format pt2 --certify`` loaded with ``torch.export.load`` and run on
  the same images (``--no-export``: skipped).

Per float32 path against ``exact``: the largest absolute and relative differences (relative to
the exact radius, over points whose exact radius is > 0), the number of points where the
float32 radius is ABOVE the exact one (the direction that over-claims), and the number of
points predicted differently.  Writes the JSON report to ``--out`` and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from lipcli.certify import CertifyOptions, run_certification

DEFAULT_CONVS = "soc,bro,lot,cayley,sll,aol,bcop"


def train_model(out: Path, *, conv: str, width: int, epochs: int, limit_train: int | None) -> Path:
    from lipcli.train import TrainConfig, train

    cfg = TrainConfig(dataset="digits", arch="lipconvnet-5", conv=conv, width=width, epochs=epochs,
                      limit_train=limit_train, device="cpu", lipschitz_estimate=False, seed=0)
    train(cfg, out=str(out), quiet=True)
    return out


def lowered_radii(path: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(predictions, radii, dense layers)`` with the layers lowered that a default
    ``--attack`` check on the same points lowers, by the certify driver's own steps."""
    from lipcli.certify.data import load_dataset
    from lipcli.certify.steps import certify_features, extract_features, input_radii, lipschitz_constant
    from lipcli.host.models import load_model
    from lipcli.host.plugins import get_registry
    from lipcli.lowering.network import lowered_network

    reg = get_registry()
    options = CertifyOptions(write=False)
    model, mf = load_model(path, registry=reg, device="cpu")
    model.eval()
    dataset, info = load_dataset(reg, mf.metadata.get("dataset"), name=None, data_dir=None,
                                 download=False, split="test", model_path=path)
    n = len(dataset)
    inputs = CertifyOptions(attack=True).attack_inputs(n)
    network = lowered_network(model, tuple(dataset[0][0].shape), inputs=inputs)
    quiet = lambda *a: None  # noqa: E731
    feats = extract_features(model, dataset, n, options.batch_size, torch.device("cpu"), info.name,
                             quiet, network)
    cert = certify_features(reg, model, {}, feats.features, options, torch.device("cpu"), quiet, {})
    lip = lipschitz_constant(model, None, options, [], quiet, network)
    radius = input_radii(cert.result.radius.cpu().double(), lip.value)
    return cert.result.predictions.cpu().long(), radius, network.dense_layers


def pt2_radii(path: Path, work: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(predictions, radii)`` of the pt2 program ``lip export --certify`` writes."""
    from lipcli.builtins.datasets.digits import load_digits_dataset
    from lipcli.export import ExportOptions, export_model

    out = work / (path.stem + ".pt2")
    export_model(path, ExportOptions(format="pt2", out=str(out), certify=True, overwrite=True))
    program = torch.export.load(str(out)).module()
    images = load_digits_dataset("test").images
    with torch.no_grad():
        logits, radius = program(images)
    return logits.argmax(1), radius.double()


def compare(pred: torch.Tensor, radius: torch.Tensor, ref_pred: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = radius.double() - ref
    positive = ref > 0
    rel = (diff[positive].abs() / ref[positive]) if bool(positive.any()) else torch.zeros(1)
    return {
        "max_abs_diff": float(diff.abs().max()),
        "max_rel_diff": float(rel.max()),
        "points_above": int((diff > 0).sum()),
        "max_above": float(diff.clamp_min(0).max()),
        "points_below": int((diff < 0).sum()),
        "prediction_differs": int((pred != ref_pred).sum()),
    }


def certified_at(radius: torch.Tensor, correct: torch.Tensor, eps: float) -> int:
    return int((correct & (radius >= eps)).sum())


def report_model(name: str, path: Path, source: str, work: Path, export: bool) -> dict:
    t0 = time.perf_counter()
    runs = {}
    exact = run_certification(path, CertifyOptions(write=False, exact=True))
    for key, opts in (("literal", dict(series=True)), ("default", {})):
        out = run_certification(path, CertifyOptions(write=False, **opts))
        runs[key] = (out.predictions, out.radius, out.summary.lipschitz.dense_layers)
    runs["lowered"] = lowered_radii(path)
    if export:
        runs["pt2"] = (*pt2_radii(path, work), None)
    correct = exact.predictions == exact.labels
    entry = {
        "model": name, "source": source, "points": int(exact.radius.shape[0]),
        "clean_correct": int(correct.sum()),
        "exact_certified_36_72_108": [certified_at(exact.radius, correct, e / 255) for e in (36, 72, 108)],
        "paths": {},
    }
    for key, (pred, radius, dense) in runs.items():
        row = compare(pred, radius, exact.predictions, exact.radius)
        if dense is not None:
            row["dense_layers"] = len(dense)
        ok = pred == exact.labels
        row["certified_36_72_108"] = [certified_at(radius, ok, e / 255) for e in (36, 72, 108)]
        entry["paths"][key] = row
    entry["time_s"] = round(time.perf_counter() - t0, 1)
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/data/cpu-rounding-report.json"))
    ap.add_argument("--work", type=Path, default=None, help="folder for the models (default: a temporary one)")
    ap.add_argument("--quickstart", type=Path, default=None, help="a trained quick-start model to use")
    ap.add_argument("--skip-quickstart", action="store_true", help="only the --convs models")
    ap.add_argument("--quickstart-epochs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--limit-train", type=int, default=300)
    ap.add_argument("--convs", default=DEFAULT_CONVS)
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=MODEL",
                    help="also a trained digits model file of another kind, reported as NAME")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="rounding-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    models: list[tuple[str, Path, str]] = []
    if args.skip_quickstart:
        pass
    elif args.quickstart is not None:
        models.append(("quickstart", args.quickstart, f"given: {args.quickstart}"))
    else:
        path = train_model(work / "quickstart.safetensors", conv="soc", width=8,
                           epochs=args.quickstart_epochs, limit_train=None)
        models.append(("quickstart", path, f"lip train --dataset digits --arch lipconvnet-5 --width 8 "
                       f"--epochs {args.quickstart_epochs} (README: 30)"))
    for conv in [c for c in args.convs.split(",") if c]:
        path = train_model(work / f"{conv}.safetensors", conv=conv, width=4, epochs=args.epochs,
                           limit_train=args.limit_train)
        models.append((conv, path, f"lip train --dataset digits --arch lipconvnet-5 --conv {conv} "
                       f"--width 4 --epochs {args.epochs} --limit-train {args.limit_train}"))
    for item in args.model:
        name, _, path = item.partition("=")
        if not name or not path:
            ap.error(f"--model {item!r}: use NAME=MODEL")
        models.append((name, Path(path), f"given: {path}"))
    report = {
        "command": "python benchmarks/rounding_report.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
        "reference": "lip certify --exact (float64 copy of the model, literal layers)",
        "models": [], "time_s": None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name, path, source in models:  # the report is rewritten after every model
        entry = report_model(name, path, source, work, not args.no_export)
        report["models"].append(entry)
        report["time_s"] = round(time.perf_counter() - t_start, 1)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{name:10s}" + "".join(
            f"  {k}: max abs {r['max_abs_diff']:.2g} rel {r['max_rel_diff']:.2g} above {r['points_above']}"
            for k, r in entry["paths"].items()), flush=True)
    print(f"written {args.out} ({report['time_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
