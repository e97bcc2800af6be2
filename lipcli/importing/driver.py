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
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lipcli.host.modelcheck import guarded_build
from lipcli.host.models import build_model, make_config, resolve_components, save_model
from lipcli.host.modelfile import read_metadata
from lipcli.host.plugins import Registry, get_registry
from lipcli.sdk.checkpoints import Checkpoint, CheckpointError, read_checkpoint
from lipcli.sdk.errors import LipError, LipUsageError
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

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("compare", "verify")}
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
    choices = {kind: plan.model[kind] for kind in ("arch", "conv", "activation", "pool", "head")}
    components = resolve_components(choices, registry)
    sizes = {k: plan.model[k] for k in _MODEL_KEYS if k in plan.model}
    if "image_size" in sizes:
        sizes["image_size"] = tuple(sizes["image_size"])
    config = make_config(components, **sizes)
    model = guarded_build(ckpt.path, lambda: build_model(config, components), ckpt.tensors)
    return model, components


def _load(model: nn.Module, state: dict[str, torch.Tensor], importer: str) -> None:
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:  # the importer's defect, not the checkpoint's
        raise LipError(f"importer {importer!r} produced tensors that do not fit the model "
                       f"(missing: {_listed(missing) or 'none'}; unexpected: {_listed(extra) or 'none'})")
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise LipError(f"importer {importer!r}: tensor {key!r} has shape "
                           f"{tuple(state[key].shape)}, the model's is {tuple(ref.shape)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)
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
    _load(model, state, comp.name)
    return model, ckpt, plan, comp, importer


def import_checkpoint(
    checkpoint: str | os.PathLike, source: str, out: str | os.PathLike, *, arch: str | None = None,
    overwrite: bool = False, registry: Registry | None = None, config: str | os.PathLike | None = None,
    options: list[str] | tuple[str, ...] = (), verify: str | os.PathLike | None = None,
    verify_tolerance: float = DEFAULT_VERIFY_TOLERANCE,
) -> ImportReport:
    """Import ``checkpoint`` with the importer named ``source`` and write ``out`` (see the module)."""
    from lipcli.train.evaluation import lipschitz_record

    out = Path(out)
    _check_out(out, overwrite)
    reg = registry or get_registry()
    model, ckpt, plan, comp, _importer = prepare(checkpoint, source, arch=arch, registry=reg, config=config,
                                                 options=options)
    checked = None if verify is None else verify_logits(model, verify, verify_tolerance)
    lipschitz = lipschitz_record(model, estimate=True)
    spec = comp.spec
    provenance = {
        "source": getattr(spec, "source", ""), "importer": comp.to_config(), "format": ckpt.format,
        "sha256": ckpt.sha256, "checkpoint": Path(ckpt.path).name, "description": plan.description,
        "ignored": sorted(plan.ignored), "options": dict(plan.options),
    }
    if checked is not None:
        provenance["verified"] = checked.to_json()
    save_model(model, out, dataset=_dataset_record(plan.dataset, reg), lipschitz=lipschitz,
               provenance=provenance)
    return ImportReport(
        checkpoint=str(checkpoint), out=str(out), source=provenance["source"], importer=comp.name,
        format=ckpt.format, sha256=ckpt.sha256, description=plan.description,
        config=dict(model.lipcli_config), lipschitz_upper_bound=lipschitz.get("upper_bound"),
        ignored=sorted(plan.ignored), options=dict(plan.options), verify=checked,
    )


def compare_imported(report: ImportReport, options: Any, registry: Registry | None = None) -> Any:
    """``lip import --compare``: the written model certified by the source's rule and by
    lipcli's (:func:`lipcli.importing.compare.compare_certificates`; ``options`` a
    :class:`~lipcli.certify.CertifyOptions`); stored in ``report.compare`` and returned."""
    from lipcli.importing.compare import compare_certificates

    reg = registry or get_registry()
    importer = reg.component("importer", report.importer).build()
    report.compare = compare_certificates(report.out, importer, options, reg)
    return report.compare
