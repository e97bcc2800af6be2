"""``lip import``: a checkpoint saved by another project's code -> a lipcli model file.

Steps (nothing is written until every check passed; the file is written through a temporary
name and a rename): resolve the ``importer`` component (``--from``); read the checkpoint
without running code (:func:`lipcli.sdk.checkpoints.read_checkpoint`); ask the importer for
its :class:`~lipcli.sdk.importers.ImportPlan` from the shapes alone; refuse missing keys,
unexpected keys, wrong shapes and non-finite values, one line each; build the lipcli model
(allocation guarded against the file's size); load the converted tensors strictly; compute
the guaranteed Lipschitz bound (as ``lip train`` does); write config, bound, data set and
``provenance`` (source, format, the checkpoint's SHA-256).
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from lipcli.host.locks import FileLock, check_unlocked, output_lock_path
from lipcli.host.modelcheck import check_config_limits, guarded_build
from lipcli.host.models import COMPONENT_KINDS, build_model, make_config, resolve_components, save_model
from lipcli.host.modelfile import read_metadata
from lipcli.host.plugins import Registry, get_registry
from lipcli.sdk.checkpoints import Checkpoint, CheckpointError, read_checkpoint
from lipcli.sdk.errors import LipError, LipUsageError, ModelFileError
from lipcli.sdk.importers import ImportPlan, SourceImporter
from lipcli.sdk.source_options import SourceOptions, parse_config_file, parse_option
from lipcli.sdk.specs import Component
from lipcli.importing.verify import DEFAULT_VERIFY_TOLERANCE, verify_logits

__all__ = ["ImportReport", "check_against_plan", "compare_imported", "import_checkpoint", "prepare", "source_options"]

#: how many names a missing/unexpected-key message lists
_SHOWN = 3
_MODEL_KEYS = ("num_classes", "in_channels", "image_size", "mean", "std")


@dataclass
class ImportReport:
    """What ``lip import`` did: the written file, its source and bound."""

    checkpoint: str
    out: str
    source: str
    importer: str
    format: str
    sha256: str
    description: str
    config: dict[str, Any]
    lipschitz_upper_bound: float | None
    ignored: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    verify: Any = None
    compare: Any = None
    #: the imported network (what ``--compare`` certifies, with the written file's tensors)
    model: Any = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("compare", "verify", "model")}
        out["compare"] = None if self.compare is None else self.compare.to_json()
        out["verify"] = None if self.verify is None else self.verify.to_json()
        return out


def _listed(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def check_against_plan(ckpt: Checkpoint, plan: ImportPlan, importer: str) -> None:
    """Refuse missing keys, unexpected keys, wrong shapes and non-finite values (one line
    each, :class:`CheckpointError`), before anything but the file's tensors is allocated."""
    present, expected = set(ckpt.tensors), dict(plan.expected)
    missing = sorted(set(expected) - present)
    if missing:
        raise CheckpointError(f"{ckpt.path}: missing keys for importer {importer!r}: {_listed(missing)}")
    extra = sorted(present - set(expected) - set(plan.ignored))
    if extra:
        raise CheckpointError(f"{ckpt.path}: unexpected keys for importer {importer!r}: {_listed(extra)}")
    for key, shape in expected.items():
        got = tuple(ckpt.tensors[key].shape)
        if got != tuple(shape):
            raise CheckpointError(
                f"{ckpt.path}: tensor {key!r} has shape {got}, expected {tuple(shape)} for "
                f"{plan.description or importer}")
    for key in expected:
        t = ckpt.tensors[key]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{ckpt.path}: tensor {key!r} contains NaN or infinite values")


def _build(ckpt: Checkpoint, plan: ImportPlan, registry: Registry) -> tuple[nn.Module, dict[str, Component]]:
    choices = {kind: plan.model[kind] for kind in COMPONENT_KINDS if kind in plan.model}
    unstated = [key for key in ("arch", "head", "mean", "std") if key not in plan.model]
    if unstated:  # an importer bug: nothing stands in for what the source's network computes
        raise CheckpointError(f"{ckpt.path}: the importer does not state the network's {', '.join(unstated)} "
                              "(an input normalisation it has none of is mean 0, std 1)")
    components = resolve_components(choices, registry)
    lacking = [kind for kind in components if kind not in plan.model]
    if lacking:
        raise CheckpointError(f"{ckpt.path}: the importer does not state the network's {', '.join(lacking)}")
    sizes = {k: plan.model[k] for k in _MODEL_KEYS if k in plan.model}
    if "image_size" in sizes:
        sizes["image_size"] = tuple(sizes["image_size"])
    try:
        config = make_config(components, **sizes)
        check_config_limits(ckpt.path, config, COMPONENT_KINDS)
    except ValueError as exc:
        raise CheckpointError(f"{ckpt.path}: {exc}") from None
    except ModelFileError as exc:  # the limits a model file has: lipcli could not read it back
        reason = str(exc).split(f"{ckpt.path}: ", 1)[-1]
        raise CheckpointError(f"{ckpt.path}: the model file it makes would be refused: {reason}") from None
    model = guarded_build(ckpt.path, lambda: build_model(config, components), ckpt.tensors)
    return model, components


def _load(model: nn.Module, state: dict[str, torch.Tensor], importer: str, path: Any) -> None:
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:  # the importer's defect, not the checkpoint's
        raise LipError(f"importer {importer!r} produced tensors that do not fit the model "
                       f"(missing: {_listed(missing) or 'none'}; unexpected: {_listed(extra) or 'none'})")
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise LipError(f"importer {importer!r}: tensor {key!r} has shape "
                           f"{tuple(state[key].shape)}, the model's is {tuple(ref.shape)}")
    cast = {k: v.to(expected[k].dtype) for k, v in state.items()}
    for key, value in cast.items():  # e.g. float64 weights beyond float32's range become inf
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{path}: importer {importer!r}: tensor {key!r} is not finite in "
                                  f"{str(expected[key].dtype).removeprefix('torch.')} (values beyond its range)")
    model.load_state_dict(cast, strict=True)
    model.eval()


def _dataset_record(name: str | None, registry: Registry) -> dict[str, Any] | None:
    if name is None:
        return None
    comp = registry.component("dataset", name)
    spec = comp.spec
    return {"name": comp.name, "params": dict(comp.params), "provider": comp.provider,
            "distribution": comp.distribution, "num_classes": getattr(spec, "num_classes", None),
            "image_shape": list(getattr(spec, "image_shape", ()) or ()) or None}


def _check_out(out: Path, overwrite: bool) -> None:
    check_unlocked(output_lock_path(out), f"model file {out}")  # a lip train writing it
    if out.exists():
        if not overwrite:
            raise LipUsageError(f"{out} already exists; pass --overwrite to replace it")
        try:
            read_metadata(out)
        except LipError:
            raise LipUsageError(f"{out} exists and is not a lipcli model file; it is never replaced") from None
    if not out.parent.exists():
        raise LipUsageError(f"cannot write {out}: directory {out.parent} does not exist")


def source_options(ckpt: Checkpoint, config: str | os.PathLike | None = None,
                   options: list[str] | tuple[str, ...] = ()) -> SourceOptions:
    """The source's configuration stated by the checkpoint's own plain values (``configs``),
    ``--config FILE`` and ``--option NAME=VALUE`` (:mod:`lipcli.sdk.source_options`)."""
    stated = SourceOptions.from_checkpoint(ckpt.values)
    if config is not None:
        stated.add(f"--config {Path(config).name}", parse_config_file(config))
    if options:
        stated.add("--option", dict(parse_option(o) for o in options))
    return stated


def _plan(importer: SourceImporter, tensors: dict[str, Any], arch: str | None, stated: SourceOptions,
          told: bool) -> ImportPlan:
    try:
        takes = "options" in inspect.signature(importer.plan).parameters
    except (TypeError, ValueError):
        takes = False
    if takes:
        return importer.plan(tensors, arch, options=stated)
    if told:
        raise LipUsageError("--config/--option: this importer reads every option from the checkpoint's shapes "
                            "(leave them out)")
    return importer.plan(tensors, arch)


def prepare(checkpoint: str | os.PathLike, source: str, *, arch: str | None = None,
            registry: Registry | None = None, config: str | os.PathLike | None = None,
            options: list[str] | tuple[str, ...] = ()) -> tuple[nn.Module, Checkpoint, ImportPlan, Component, SourceImporter]:
    """Read, check, build and load (no file written): the imported model and what made it."""
    reg = registry or get_registry()
    comp = reg.component("importer", source)
    importer = comp.build()
    ckpt = read_checkpoint(checkpoint)
    stated = source_options(ckpt, config, options)
    plan = _plan(importer, dict(ckpt.tensors), arch, stated, told=config is not None or bool(options))
    check_against_plan(ckpt, plan, comp.name)
    model, _components = _build(ckpt, plan, reg)
    with torch.no_grad():
        state = importer.convert({k: ckpt.tensors[k] for k in plan.expected}, plan)
    _load(model, state, comp.name, ckpt.path)
    return model, ckpt, plan, comp, importer


def import_checkpoint(
    checkpoint: str | os.PathLike, source: str, out: str | os.PathLike, *, arch: str | None = None,
    overwrite: bool = False, registry: Registry | None = None, config: str | os.PathLike | None = None,
    options: list[str] | tuple[str, ...] = (), verify: str | os.PathLike | None = None,
    verify_tolerance: float = DEFAULT_VERIFY_TOLERANCE,
    before_write: Callable[[dict[str, Any] | None], None] | None = None,
) -> ImportReport:
    """Import ``checkpoint`` with the importer named ``source`` and write ``out`` (see the module).

    ``before_write(dataset record)``, when given, runs once everything is checked and before
    the file is written (``--compare`` reads its data there); the file is written holding the
    lock ``lip train`` holds on its model file, so a run writing ``out`` is never overwritten."""
    from lipcli.train.evaluation import lipschitz_record

    out = Path(out)
    _check_out(out, overwrite)
    reg = registry or get_registry()
    model, ckpt, plan, comp, _importer = prepare(checkpoint, source, arch=arch, registry=reg, config=config,
                                                 options=options)
    checked = None if verify is None else verify_logits(model, verify, verify_tolerance)
    try:
        lipschitz = lipschitz_record(model, estimate=True)
    except (ArithmeticError, ValueError) as exc:  # e.g. a zero std, zero power vectors
        raise CheckpointError(f"{ckpt.path}: the imported network has no guaranteed bound: "
                              f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
    bound = lipschitz.get("upper_bound")
    if bound is not None and not math.isfinite(bound):
        raise CheckpointError(f"{ckpt.path}: the imported network's guaranteed bound is {bound} "
                              "(a zero or non-finite scale in the checkpoint)")
    spec = comp.spec
    provenance = {
        "source": getattr(spec, "source", ""), "importer": comp.to_config(), "format": ckpt.format,
        "sha256": ckpt.sha256, "checkpoint": Path(ckpt.path).name, "description": plan.description,
        "ignored": sorted(plan.ignored), "options": dict(plan.options),
    }
    if checked is not None:
        provenance["verified"] = checked.to_json()
    record = _dataset_record(plan.dataset, reg)
    if before_write is not None:
        before_write(record)
    lock = FileLock(output_lock_path(out), f"model file {out}").acquire()
    try:
        save_model(model, out, dataset=record, lipschitz=lipschitz, provenance=provenance)
    finally:
        lock.release()
    return ImportReport(
        checkpoint=str(checkpoint), out=str(out), source=provenance["source"], importer=comp.name,
        format=ckpt.format, sha256=ckpt.sha256, description=plan.description,
        config=dict(model.lipcli_config), lipschitz_upper_bound=lipschitz.get("upper_bound"),
        ignored=sorted(plan.ignored), options=dict(plan.options), verify=checked, model=model,
    )


def compare_imported(report: ImportReport, options: Any, registry: Registry | None = None,
                     data: Any = None) -> Any:
    """``lip import --compare``: the written model certified by the source's rule and by
    lipcli's (:func:`lipcli.importing.compare.compare_certificates`; ``options`` a
    :class:`~lipcli.certify.CertifyOptions`); stored in ``report.compare`` and returned.
    One walk: the imported network itself, given the written file's tensors (read once), and
    ``data`` (``(dataset, info)``) when the caller read it already."""
    from lipcli.host.modelfile import read_model_file
    from lipcli.importing.compare import compare_certificates

    reg = registry or get_registry()
    importer = reg.component("importer", report.importer).build()
    loaded = None
    if report.model is not None:
        mf = read_model_file(report.out)
        report.model.load_state_dict(mf.tensors, strict=True)  # exactly what the file stores
        loaded = (report.model, mf, data)
    report.compare = compare_certificates(report.out, importer, options, reg, loaded=loaded)
    return report.compare
