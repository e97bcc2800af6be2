"""``lip export``: a model file -> a standalone program for torch or onnxruntime, checked.

Steps of :func:`export_model` (nothing is written unless every step succeeds):

1. options and output checked (format known and installed, output writable, not an existing
   file unless ``overwrite``), before any work;
2. the model loaded in eval mode on the CPU (a missing plugin names its distribution);
3. with ``certify``: every layer the bound counts as 1 by its promise measured with the
   trained parameters at the check inputs of step 5
   (:func:`~lipcli.lipschitz.promises.verify_promises`: a broken promise raises
   :class:`~lipcli.lipschitz.promises.BrokenPromiseError`), the guaranteed Lipschitz bound of
   the feature map (computed now, normalisation included) and the head's certificate lowered
   (:func:`~lipcli.sdk.export.lower_certificate`);
4. the network lowered (:func:`~lipcli.export.program.build_program`; layers whose linear
   map fits ``dense_max_mib`` may become one dense matrix, see :mod:`lipcli.lowering`) and
   serialised with the metadata record
   (:func:`export_record`, which lists each layer's lowering);
5. written to a temporary file beside the output, **loaded back in the target runtime** and
   run on ``check_inputs`` inputs (the model's test images when its data set is available
   offline, else seeded uniform random images); compared with lipcli's own model (logits)
   and certificate (radii): the largest differences relative to the largest reference
   magnitude are reported, and above :data:`TOLERANCE` (or a different predicted class) the
   temporary file is removed and :class:`ExportCheckError` raised; else it is renamed.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from lipcli.version import __version__
from lipcli.sdk.errors import LipError, LipUsageError, SettingError, literal
from lipcli.export.formats import EXAMPLE_BATCH, ExportUsageError, format_for
from lipcli.sdk.export import ExportError, lower_certificate
from lipcli.export.options import ExportOptions
from lipcli.export.program import build_program
from lipcli._util.outputs import check_output_file
from lipcli.export.program import ROUND_DOWN
from lipcli.host.models import recorded_dataset
from lipcli.host.plugins import Registry, get_registry
from lipcli.lowering.caps import check_dense_max_mib
from lipcli.lowering.network import lowered_network
from lipcli.lipschitz.promises import verify_promises
from lipcli.lipschitz.bound import guaranteed_upper_bound, lowered_upper_bound, model_input_shape
from lipcli.host.modelfile import atomic_write_bytes
from lipcli.host.models import load_model

#: largest accepted difference between the exported program and lipcli, relative to the
#: largest magnitude of lipcli's logits (radii)
TOLERANCE = 1e-5
RECORD_FORMAT = "lipcli-export"
RECORD_VERSION = 1

Progress = Callable[[str, int, int], None]


class ExportCheckError(ExportError):
    """The exported program does not reproduce lipcli's outputs (nothing was written)."""


@dataclass
class ExportCheck:
    """The comparison of the written program with lipcli (step 5)."""

    inputs: int
    source: str
    max_rel_logit_diff: float
    max_rel_radius_diff: float | None
    prediction_mismatches: int
    exported_radius_max_excess: float | None = None  # max(exported - lipcli, 0) / scale


@dataclass
class ExportReport:
    """Result of :func:`export_model` (``to_json`` for ``--json``)."""

    model: str
    output: str
    format: str
    runtime: str
    bytes: int
    certificate: str | None
    lipschitz_upper_bound: float | None
    check: ExportCheck
    record: dict[str, Any]
    time_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_output(model_path: str | os.PathLike, suffix: str) -> Path:
    """``MODEL`` with its suffix replaced by the format's (``runs/x/model.pt2``)."""
    p = Path(model_path)
    return p.with_name(p.stem + suffix)


#: the most check inputs (``--check``), and the most bytes of float32 images they may take
from lipcli.export.options import MAX_CHECK_INPUTS  # noqa: E402  (declared with the setting)
MAX_CHECK_BYTES = 256 << 20


def _check_count(n: int, shape: tuple[int, ...]) -> None:
    """``n`` check images of ``shape`` fit :data:`MAX_CHECK_BYTES` (refused before allocating)."""
    per = 4 * math.prod(shape)
    if n * per > MAX_CHECK_BYTES:
        raise SettingError("check_inputs", f"check_inputs must be at most {max(1, MAX_CHECK_BYTES // per)} for "
                           f"this model's {'x'.join(map(str, shape))} inputs ({MAX_CHECK_BYTES >> 20} MiB of "
                           f"images), got {n}")


def _check_options(model_path: Path, options: ExportOptions) -> tuple[Any, Path]:
    fmt = format_for(options.format, options.out)
    if not 1 <= options.check_inputs <= MAX_CHECK_INPUTS:
        raise SettingError("check_inputs", f"check_inputs must be in 1..{MAX_CHECK_INPUTS}, got {options.check_inputs}")
    check_dense_max_mib(options.dense_max_mib)
    if not model_path.exists():
        raise LipUsageError(f"model file not found: {model_path}")
    if model_path.is_dir():
        raise LipUsageError(f"{model_path} is a directory, not a model file")
    out = Path(options.out) if options.out is not None else default_output(model_path, fmt.suffix)
    try:
        check_output_file(out, "output")
    except LipUsageError as exc:
        raise SettingError("output", str(exc)) from None
    if out.resolve() == model_path.resolve():
        raise ExportUsageError(f"{{output}} {literal(out)} is the model file itself")
    if out.name.lower().endswith(".safetensors"):  # overwrite or not: never a model file's name
        raise ExportUsageError(f"{{output}} {literal(out)} has the model files' suffix .safetensors; an "
                               f"export is a {fmt.suffix} program: give a {fmt.suffix} file name")
    if out.exists() and not options.overwrite:
        raise ExportUsageError(f"{literal(out)} already exists; pass {{overwrite}} to replace it or choose "
                               "another {output}")
    fmt.available()
    return fmt, out


def export_record(model: torch.nn.Module, mf: Any, model_path: Path, fmt: Any, certificate: Any,
                  lipschitz: float | None, input_shape: tuple[int, int, int],
                  lowering: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metadata record stored inside the exported file (``lowering``: the per-layer
    lowering, see :func:`lowering_record`)."""
    config = model.lipcli_config
    return {
        "format": RECORD_FORMAT,
        "format_version": RECORD_VERSION,
        "lipcli_version": __version__,
        "torch_version": torch.__version__,
        "export_format": fmt.name,
        "source_model": {"file": model_path.name, "sha256": file_sha256(model_path)},
        "config": config,
        "dataset": mf.metadata.get("dataset"),
        "normalization": {"mean": config["mean"], "std": config["std"], "inside_program": True},
        "input": {"name": "image", "dtype": "float32", "shape": ["N", *input_shape],
                  "range": [0.0, 1.0]},
        "outputs": ["logits", "radius"] if certificate is not None else ["logits"],
        "lipschitz": None if lipschitz is None else {
            "upper_bound": lipschitz, "label": "GUARANTEED upper bound",
            "includes_normalization": True,
        },
        "certificate": None if certificate is None else {
            "kind": certificate.kind, "description": certificate.description,
            "radius": "input-space l2 radius of argmax(logits), float64; 0 where the float64 "
            "certificate predicts another class",
            **certificate.record,
        },
        "lowering": lowering,
    }


def lowering_record(program: Any, dense_max_mib: float) -> dict[str, Any]:
    """How the layers were lowered: the cap, the layers that describe their lowering
    (``[{"layer", "lowering": "dense" | "series", ...}]``), the dense ones and their MiB."""
    layers = list(getattr(program, "lowering", []))
    dense = [entry for entry in layers if entry.get("lowering") == "dense"]
    return {"dense_max_mib": dense_max_mib, "layers": layers,
            "dense_layers": [entry["layer"] for entry in dense],
            "dense_mib": sum(float(entry.get("dense_mib", 0.0)) for entry in dense)}


def check_inputs(mf: Any, n: int, shape: tuple[int, int, int], seed: int) -> tuple[torch.Tensor, str]:
    """``n`` test images of the model's data set when it loads offline (recorded root or none
    needed), else ``n`` seeded uniform random images in ``[0, 1]``."""
    recorded = mf.metadata.get("dataset")
    try:
        comp = recorded_dataset("model", recorded) if recorded is not None else None
        if comp is not None:
            root = recorded.get("root") if isinstance(recorded, dict) else None
            if root is not None or not getattr(comp.spec, "needs_root", True):
                data = comp.build(root, "test", download=False, augment=False)
                count = min(n, len(data))
                images = torch.stack([torch.as_tensor(data[i][0], dtype=torch.float32) for i in range(count)])
                if tuple(images.shape[1:]) == shape and count > 0:
                    return images.contiguous(), f"{count} {comp.name} test images"
    except Exception:  # noqa: BLE001 - any data problem: fall back to random inputs
        pass
    gen = torch.Generator().manual_seed(seed)
    return torch.rand((n, *shape), generator=gen), f"{n} uniform random images (seed {seed})"


def _relative(diff: np.ndarray, ref: np.ndarray) -> float:
    finite = np.isfinite(ref)
    scale = float(np.abs(ref[finite]).max()) if finite.any() else 0.0
    d = np.abs(diff[finite]) if finite.any() else np.zeros(0)
    worst = float(d.max()) if d.size else 0.0
    return worst / scale if scale > 0 else worst


def compare(run: Any, model: torch.nn.Module, certificate: Any,
            images: torch.Tensor, source: str, batch: int = 256) -> ExportCheck:
    """Run the loaded program and lipcli on ``images``; differences (see module docstring).
    lipcli's side is what ``lip certify`` runs: its eval lowering
    (:func:`lipcli.lowering.network.lowered_network`, device defaults) and the guaranteed
    bound of that operator."""
    network = lowered_network(model)
    lipschitz = lowered_upper_bound(model, network)[0] if certificate is not None else None
    got_logits, got_radius, ref_logits, ref_radius = [], [], [], []
    with torch.no_grad():
        for s in range(0, images.shape[0], batch):
            x = images[s : s + batch]
            logits, radius = run(x.numpy())
            got_logits.append(np.asarray(logits, dtype=np.float64))
            y = network.features(x)
            ref_logits.append(network.head(y).double().numpy())
            if certificate is not None:
                got_radius.append(np.asarray(radius, dtype=np.float64))
                r = certificate.reference(y).double() / lipschitz * ROUND_DOWN
                ref_radius.append(r.numpy())
    gl, rl = np.concatenate(got_logits), np.concatenate(ref_logits)
    mismatches = int((gl.argmax(1) != rl.argmax(1)).sum())
    rel_r = excess = None
    if certificate is not None:
        gr, rr = np.concatenate(got_radius), np.concatenate(ref_radius)
        inf_mismatch = np.isinf(gr) != np.isinf(rr)
        both = ~np.isinf(gr) & ~np.isinf(rr)
        rel_r = math.inf if inf_mismatch.any() else _relative(gr[both] - rr[both], rr[both])
        scale = float(np.abs(rr[both]).max()) if both.any() and np.abs(rr[both]).max() > 0 else 1.0
        excess = float(np.clip(gr[both] - rr[both], 0, None).max(initial=0.0)) / scale
    return ExportCheck(images.shape[0], source, _relative(gl - rl, rl), rel_r, mismatches, excess)


def _lowered_certificate(model: torch.nn.Module, reg: Registry, images: torch.Tensor) -> Any:
    """The head's certificate lowered for export (step 3).  Every layer the bound counts as 1
    by its promise is measured first, with the trained parameters at the check images (as
    lip certify does): a broken promise is an error, never a GUARANTEED bound in the exported
    program; nothing is written."""
    verify_promises(model, images)
    name = reg.get("head", model.lipcli_config["head"]["name"]).certificate
    certifier = reg.component("certificate", name).build()
    return lower_certificate(certifier, model.head, name)


def _serialise(fmt: Any, program: Any, example: torch.Tensor, record: dict[str, Any]) -> bytes:
    """``fmt.serialise``; a failure of the exporter is one line (:class:`ExportError`)."""
    try:
        return fmt.serialise(program, example, record)
    except LipError:
        raise
    except Exception as exc:  # noqa: BLE001 - exporter failures are one line
        first = " ".join(str(exc).split())[:300]
        raise ExportError(f"{fmt.name} export failed: {type(exc).__name__}: {first}") from None


def _read_back(tmp: Path, fmt: Any, record: dict[str, Any], model: torch.nn.Module,
               certificate: Any, images: torch.Tensor, source: str) -> ExportCheck:
    """Load the written temporary file in the target runtime, check its record and compare
    it with lipcli on the check images (step 5)."""
    try:
        run, stored = fmt.load(tmp)
    except Exception as exc:  # noqa: BLE001
        raise ExportCheckError(
            f"the written {fmt.name} file does not load in {fmt.runtime}: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        ) from None
    if stored != record:
        raise ExportCheckError("the metadata record read back differs from the one written")
    return compare(run, model, certificate, images, source)


def _require_agreement(check: ExportCheck) -> None:
    """Raise :class:`ExportCheckError` when the exported program differs from lipcli by more
    than :data:`TOLERANCE` or predicts another class on some check input."""
    worst = max(check.max_rel_logit_diff, check.max_rel_radius_diff or 0.0)
    if check.prediction_mismatches or not worst <= TOLERANCE:
        raise ExportCheckError(
            f"the exported program differs from lipcli on {check.inputs} inputs: max relative "
            f"logit difference {check.max_rel_logit_diff:.3g}, radius difference "
            f"{check.max_rel_radius_diff if check.max_rel_radius_diff is not None else 0:.3g}, "
            f"{check.prediction_mismatches} different predictions (tolerance {TOLERANCE:g}); "
            "nothing was written"
        )


def export_model(model_path: str | os.PathLike, options: ExportOptions, *,
                 progress: Progress | None = None) -> ExportReport:
    """Export the model in ``model_path`` (see the module docstring)."""

    report = progress or (lambda stage, done, total: None)
    model_path = Path(model_path)
    fmt, out = _check_options(model_path, options)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    reg = get_registry()
    model, mf = load_model(model_path, registry=reg, device="cpu")
    model.eval()
    shape = model_input_shape(model)
    _check_count(options.check_inputs, shape)
    times["load"] = time.perf_counter() - t0

    images, source = check_inputs(mf, options.check_inputs, shape, options.seed)
    with torch.no_grad():  # CPU only: no TF32 to switch off
        certificate = lipschitz = None
        if options.certify:
            t0 = time.perf_counter()
            report("certificate", 0, 1)
            certificate = _lowered_certificate(model, reg, images)
            report("certificate", 1, 1)
            times["certificate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        report("export", 0, 1)
        # with a certificate, the program divides by the GUARANTEED bound of its own lowered
        # operator (dense layers' float32 matrices included, lipcli.lowering)
        program = build_program(model, certificate, None, shape, options.dense_max_bytes)
        lipschitz = program.lipschitz if certificate is not None else None
        record = export_record(model, mf, model_path, fmt, certificate, lipschitz, shape,
                               lowering_record(program, options.dense_max_mib))
        example = torch.rand((EXAMPLE_BATCH, *shape), generator=torch.Generator().manual_seed(0))
        blob = _serialise(fmt, program, example, record)
        report("export", 1, 1)
        times["export"] = time.perf_counter() - t0

        outcome: dict[str, ExportCheck] = {}

        def verify(tmp: Path) -> None:
            t1 = time.perf_counter()
            report("check", 0, 1)
            check = _read_back(tmp, fmt, record, model, certificate, images, source)
            outcome["check"] = check
            report("check", 1, 1)
            times["check"] = time.perf_counter() - t1
            _require_agreement(check)

        try:
            atomic_write_bytes(out, blob, check=verify)
        except OSError as exc:
            raise LipError(f"cannot write {out}: {exc.strerror or exc}") from None
    return ExportReport(
        model=str(model_path), output=str(out), format=fmt.name, runtime=fmt.runtime,
        bytes=len(blob), certificate=None if certificate is None else certificate.kind,
        lipschitz_upper_bound=lipschitz, check=outcome["check"], record=record, time_s=times,
    )
