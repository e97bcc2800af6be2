"""``lip info``: a model card read from the model file alone (no data, no network built).

Only the safetensors header is parsed (tensor names, dtypes and shapes, and lipcli's JSON
metadata), so the card works for a file whose plugins are not installed: every component is
checked against the installed registry and the missing ones are listed with the
distribution that provides them.  Stored values are reported with how they were obtained
(the guaranteed Lipschitz bound, the power-method estimate, labelled, and the empirical
lower bound; ``lip certify``'s results with its certificate and soundness flag).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lipcli.sdk.errors import ModelFileError
from lipcli.host.modelfile import read_metadata
from lipcli._util.safetext import clean, install_hint
from lipcli.host.plugins import get_registry
from lipcli.sdk.errors import LipError

COMPONENT_KINDS = ("arch", "conv", "activation", "pool", "head")


@dataclass
class ComponentCard:
    kind: str
    name: str
    params: dict[str, Any]
    distribution: str
    installed: bool


@dataclass
class StoredLipschitz:
    """The model file's ``lipschitz`` slot, as stored (with how each number was obtained)."""

    upper_bound: Any
    upper_bound_label: Any
    estimate: Any
    estimate_label: Any
    estimate_iters: Any
    includes_normalization: Any
    weights_sha256: Any
    empirical_lower: Any  # the stored lower bound's value
    how: str = (
        "upper bound: product of per-layer guaranteed bounds (SPEC §5); estimate: product "
        "of per-layer power-method estimates (not guaranteed)"
    )
    weights_match: bool | None = None  # stored for the file's weights (None: not recorded)


@dataclass
class StoredCertification:
    """What ``lip certify`` stored in the model file's ``results["certify"]`` (its headline)."""

    dataset: Any
    clean_accuracy: Any
    total: Any
    radii: list[dict[str, Any]]
    radius_unit: Any
    certificate: Any  # its name
    lipschitz: Any  # the label of the Lipschitz constant used
    sound: Any
    attack: dict[str, Any] | None
    weights_sha256: Any = None
    weights_match: bool | None = None  # certified the file's weights (None: not recorded)


@dataclass
class ModelCard:
    """Everything ``lip info`` shows (``to_json`` for ``--json``)."""

    file: str
    bytes: int
    sha256: str
    weights_sha256: str | None  # fingerprint of the tensors (stored results carry theirs)
    written_by: str | None
    format_version: int
    components: list[ComponentCard]
    missing: list[str]
    num_classes: Any
    input_shape: list[Any]
    parameters: dict[str, int]
    dataset: dict[str, Any] | None
    normalization: dict[str, Any] | None
    lipschitz: StoredLipschitz | None
    results: dict[str, Any] | None  # the stored results; "certify" as a StoredCertification
    training: dict[str, Any] | None
    notes: list[str] = field(default_factory=list)
    #: the recipe the model was trained from (``lip train --recipe``): ``name`` (``name@version``)
    #: and ``overrides`` (setting -> {"recipe": its value, "value": the one used}); None: none
    recipe: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _parameter_counts(path: Path) -> dict[str, int]:
    """Element counts per top-level module (``body``, ``head``) from the safetensors header;
    power-iteration vectors (``power_*``) counted apart as buffers."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    counts: dict[str, int] = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        n = math.prod(int(d) for d in entry.get("shape", []))
        leaf = name.rsplit(".", 1)[-1]
        group = "buffers" if leaf.startswith("power_") or leaf in ("mean", "std") else name.split(".", 1)[0]
        counts[group] = counts.get(group, 0) + n
    counts["total_trainable"] = sum(v for k, v in counts.items() if k != "buffers")
    return counts


def _shown_kinds(config: dict[str, Any], reg: Any) -> list[str]:
    """The component kinds of the network: the architecture and its slots (a kind an older
    file records for a network that fixes it itself is not shown); arch and head always."""
    kinds = [k for k in COMPONENT_KINDS if k in ("arch", "head") or config.get(k) is not None]
    if reg is None:
        return kinds
    try:
        arch = reg.component("arch", config["arch"])
        head = reg.component("head", config["head"])
        slots = arch.spec.slots_for(arch.params, head.spec)
    except (LipError, KeyError, TypeError, ValueError):
        return kinds
    return [k for k in kinds if k == "arch" or k in slots]


def _components(config: dict[str, Any]) -> tuple[list[ComponentCard], list[str]]:
    try:
        reg = get_registry()
    except LipError:
        reg = None
    cards, missing = [], []
    for kind in _shown_kinds(config, reg):
        entry = config.get(kind) if isinstance(config.get(kind), dict) else {}
        name = str(entry.get("name", "?"))
        dist = str(entry.get("distribution") or "?")
        installed = False
        if reg is not None:
            try:
                reg.get(kind, name)
                installed = True
            except LipError:
                installed = False
        if not installed:  # file strings: escaped, and a pip command only for a valid name
            missing.append(f"{kind} {clean(repr(name))} ({install_hint(dist)})"
                           if dist not in ("lipcli", "?", "(in-process)")
                           else f"{kind} {clean(repr(name))} (from {dist})")
        params = entry.get("params") if isinstance(entry.get("params"), dict) else {}
        cards.append(ComponentCard(kind, name, dict(params), dist, installed))
    return cards, missing


def _weights_sha256(path: Path) -> str | None:
    """The fingerprint of the file's tensors (:func:`~lipcli.host.modelfile.tensors_fingerprint`);
    ``None`` when they cannot be read (the card is still shown)."""
    from lipcli.host.modelfile import read_model_file, tensors_fingerprint

    try:
        return tensors_fingerprint(read_model_file(path).tensors)
    except ModelFileError:
        return None


def _matches(record: Any, weights: str | None) -> bool | None:
    """Whether a stored record's ``weights_sha256`` is the file's (``None``: unknown)."""
    stored = record.get("weights_sha256") if isinstance(record, dict) else None
    if not isinstance(stored, str) or weights is None:
        return None
    return stored == weights


def _lipschitz(meta: dict[str, Any], weights: str | None = None) -> StoredLipschitz | None:
    lip = meta.get("lipschitz")
    if not isinstance(lip, dict):
        return None
    emp = lip.get("empirical_lower")
    return StoredLipschitz(
        **{k: lip.get(k) for k in ("upper_bound", "upper_bound_label", "estimate", "estimate_label",
                                    "estimate_iters", "includes_normalization", "weights_sha256")},
        empirical_lower=emp.get("value") if isinstance(emp, dict) else emp,
        weights_match=_matches(lip, weights),
    )


def _results(meta: dict[str, Any], weights: str | None = None) -> dict[str, Any] | None:
    res = meta.get("results")
    if not isinstance(res, dict):
        return None
    out: dict[str, Any] = {k: v for k, v in res.items() if k not in ("certify", "certify_runs")}
    if "weights_sha256" in res:  # lip train's evaluation
        out["weights_match"] = _matches(res, weights)
    if isinstance(res.get("certify"), dict):
        out["certify"] = _certification(res["certify"], weights)
    if isinstance(res.get("certify_runs"), list):  # every distinct certification stored
        out["certify_runs"] = [_certification(r, weights) for r in res["certify_runs"] if isinstance(r, dict)]
    return out


def _certification(cert: dict[str, Any], weights: str | None) -> StoredCertification:
    return StoredCertification(
        dataset=cert.get("dataset"),
        clean_accuracy=cert.get("clean_accuracy"),
        total=cert.get("total"),
        radii=[{k: r.get(k) for k in ("radius_units", "radius", "certified_accuracy")}
               for r in cert.get("radii", []) if isinstance(r, dict)],
        radius_unit=cert.get("radius_unit"),
        certificate=(cert.get("certificate") or {}).get("name"),
        lipschitz=(cert.get("lipschitz") or {}).get("label"),
        sound=cert.get("sound"),
        attack=None if not isinstance(cert.get("attack"), dict) else {
            k: cert["attack"].get(k) for k in ("steps", "restarts", "violations")},
        weights_sha256=cert.get("weights_sha256"), weights_match=_matches(cert, weights),
    )


def _training(meta: dict[str, Any]) -> dict[str, Any] | None:
    tr = meta.get("training")
    if not isinstance(tr, dict):
        return None
    keys = ("epochs", "steps", "time_s", "images_per_s", "seed", "device", "world_size",
            "lipcli_version", "torch_version", "resumed_from_epochs", "run_dir")
    return {k: tr.get(k) for k in keys if k in tr}


def _recipe(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe recorded in the training settings (``None`` for a model trained without one,
    and for files from before recipes)."""
    tr = meta.get("training")
    cfg = tr.get("config") if isinstance(tr, dict) else None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("recipe"), str):
        return None
    overrides = cfg.get("recipe_overrides")
    return {"name": cfg["recipe"], "overrides": dict(overrides) if isinstance(overrides, dict) else {}}


def model_card(path: str | os.PathLike) -> ModelCard:
    """Read the card of the model file at ``path`` (:class:`ModelFileError` when it is not one)."""
    p = Path(path)
    meta = read_metadata(p)  # validates: exists, safetensors, lipcli metadata
    config = meta["config"]
    components, missing = _components(config)
    notes = []
    if missing:
        notes.append("not installed: " + "; ".join(missing) + " (the card is read from the file alone; "
                     "certify, lipschitz and export need them)")
    prov = meta.get("provenance")
    if isinstance(prov, dict):  # lip import
        notes.append(f"imported by lip import --from {(prov.get('importer') or {}).get('name', '?')} from "
                     f"{prov.get('source', '?')}: {prov.get('checkpoint', '?')} ({prov.get('format', '?')}, "
                     f"sha256 {prov.get('sha256', '?')})")
    try:
        params = _parameter_counts(p)
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{p}: cannot read the tensor header: {exc}") from None
    image = config.get("image_size") or [32, 32]
    weights = _weights_sha256(p)
    return ModelCard(
        file=str(p), bytes=p.stat().st_size, sha256=_sha256(p), weights_sha256=weights,
        written_by=meta.get("version"),
        format_version=meta.get("format_version"), components=components, missing=missing,
        num_classes=config.get("num_classes"), input_shape=[config.get("in_channels"), *image],
        parameters=params, dataset=meta.get("dataset"), normalization=meta.get("normalization"),
        lipschitz=_lipschitz(meta, weights), results=_results(meta, weights), training=_training(meta), notes=notes,
        recipe=_recipe(meta),
    )
