"""Build models from registered components; save and load them as lipcli model files.

A model config is plain JSON::

    {"arch": {"name": "lipconvnet-20", "params": {"width": 32}, "provider": ..., "distribution": ...},
     "conv": {...}, "activation": {...}, "pool": {...}, "head": {...},
     "num_classes": 10, "in_channels": 3, "image_size": [32, 32],
     "mean": [0.4914, 0.4822, 0.4465], "std": [0.2507, 0.2507, 0.2507]}

Every component records its parameters and the distribution that provides it, so a model
file can be rebuilt from its metadata alone, or name the package to install when it cannot.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lipcli.sdk.errors import LipUsageError, MissingPluginError, ModelFileError, UnknownComponentError
from lipcli.host.modelfile import ModelFile, read_model_file, save_model_file
from lipcli.host.plugins import Registry, get_registry
from lipcli.sdk.specs import Component

from lipcli._util.constants import CIFAR_MEAN, CIFAR_STD  # the default input normalisation
from lipcli._util.safetext import clean, install_hint, is_distribution_name
from lipcli.host.defaults import DEFAULT_COMPONENTS, LAYER_KINDS
from lipcli.host.modelcheck import check_config_limits, guarded_build
from lipcli.host.plugins import DISABLE_AUTOLOAD_ENV, autoload_disabled
from lipcli.sdk.loading import adopt_lazy_buffers, loading_tensors
COMPONENT_KINDS = ("arch", "conv", "activation", "pool", "head")
#: the default layer components (from :data:`~lipcli.host.defaults.DEFAULT_COMPONENTS`)
DEFAULTS = {kind: DEFAULT_COMPONENTS[kind] for kind in LAYER_KINDS}


def resolve_components(
    choices: Mapping[str, str | dict[str, Any] | None], registry: Registry | None = None,
    arch_params: dict[str, Any] | None = None,
) -> dict[str, Component]:
    """The model's components resolved from their choices (``"name"``,
    ``"name:key=value,..."`` or a config entry): the architecture, then the layer kinds that
    are its slots (:meth:`~lipcli.sdk.specs.ArchSpec.slots_for`; a slot without a choice gets
    lipcli's default, a choice for a kind the network fixes itself is not used);
    ``arch_params`` are added to the architecture's parameters.  The one place a model's
    component choices are resolved."""
    reg = registry or get_registry()
    arch = reg.component("arch", choices["arch"], arch_params)
    head = reg.component("head", choices.get("head") or DEFAULTS["head"])
    out = {"arch": arch}
    for kind in arch.spec.slots_for(arch.params, head.spec):
        out[kind] = head if kind == "head" else reg.component(kind, choices.get(kind) or DEFAULTS[kind])
    return out


def make_config(
    components: Mapping[str, Component],
    *,
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: tuple[int, int] = (32, 32),
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
) -> dict[str, Any]:
    """The model config of resolved ``components`` (:func:`resolve_components`) and the
    input's shape and normalisation."""
    mean = tuple(float(m) for m in (mean if mean is not None else CIFAR_MEAN))
    std = tuple(float(s) for s in (std if std is not None else CIFAR_STD))
    if len(mean) != in_channels or len(std) != in_channels or min(std) <= 0:
        raise ValueError("mean/std must have one entry per input channel and std > 0")
    if num_classes < 2:
        raise ValueError("num_classes must be at least 2")
    config: dict[str, Any] = {kind: c.to_config() for kind, c in components.items()}
    config.update(
        num_classes=int(num_classes), in_channels=int(in_channels),
        image_size=[int(image_size[0]), int(image_size[1])], mean=list(mean), std=list(std),
    )
    return config


def _format_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def non_default_params(component: Component) -> dict[str, Any]:
    """The parameters of ``component`` that differ from its spec's defaults (what was chosen)."""
    defaults = {p.name: p.default for p in component.spec.params}
    return {k: v for k, v in component.params.items() if k not in defaults or defaults[k] != v}


class ComponentParameterError(LipUsageError, ValueError):
    """A component's factory rejected the parameters it was built with (exit 2).

    Raised by :func:`build_model` when a factory raises ``ValueError`` or ``TypeError`` while
    the network is constructed: the choices (``--width 3``, ``pool polygon:radius=0``) are
    bad input, not a bug.  Also a ``ValueError`` for Python callers of :func:`create_model`.
    Attributes: ``kind``, ``name``, ``params`` (the failing component's non-default
    parameters), ``reason`` (the factory's message) and, when the failing component was
    built inside another one (e.g. an activation inside the architecture), ``context``:
    ``(kind, name, non-default params)`` of the architecture.
    """

    def __init__(
        self, kind: str, name: str, params: dict[str, Any], reason: str,
        context: tuple[str, str, dict[str, Any]] | None = None,
    ) -> None:
        self.kind, self.name, self.params, self.reason, self.context = kind, name, params, reason, context
        if params:
            text = f"{kind} {name!r} rejected {_format_params(params)}: {reason}"
        elif context is not None and context[2]:
            text = f"{context[0]} {context[1]!r} with {_format_params(context[2])}: {kind} {name!r}: {reason}"
        else:
            text = f"{kind} {name!r}: {reason}"
        super().__init__(text)


@dataclasses.dataclass(frozen=True)
class _CheckedComponent(Component):
    """A :class:`Component` whose ``build`` reports a factory's ``ValueError``/``TypeError`` as
    a :class:`ComponentParameterError` naming the component (only the construction step)."""

    context: Component | None = None

    def build(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().build(*args, **kwargs)
        except ComponentParameterError:
            raise
        except (ValueError, TypeError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            ctx = self.context
            raise ComponentParameterError(
                self.spec.kind, self.name, non_default_params(self), reason,
                None if ctx is None else (ctx.spec.kind, ctx.name, non_default_params(ctx)),
            ) from exc


def _checked(component: Component, context: Component | None = None) -> _CheckedComponent:
    return _CheckedComponent(
        spec=component.spec, params=component.params, provider=component.provider,
        distribution=component.distribution, context=context,
    )


def _accepts_keyword(factory: Any, name: str) -> bool:
    """Whether ``factory`` takes the keyword argument ``name`` (or ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def build_model(config: dict[str, Any], components: Mapping[str, Component]) -> nn.Module:
    """Instantiate the network described by ``config`` from its resolved ``components``
    (:func:`resolve_components`; they replace the config's component entries).

    A factory that rejects its parameters (``ValueError``/``TypeError`` while the network is
    constructed) raises :class:`ComponentParameterError` naming the component.
    """
    comps = {kind: _checked(c, None if kind == "arch" else components["arch"]) for kind, c in components.items()}
    sized = {}
    if _accepts_keyword(comps["arch"].spec.factory, "image_size"):  # optional in the protocol
        sized["image_size"] = tuple(int(v) for v in config.get("image_size") or (32, 32))
    layers = {kind: comps.get(kind) for kind in LAYER_KINDS}  # None: a kind the network fixes itself
    model = comps["arch"].build(
        **layers, num_classes=config["num_classes"],
        in_channels=config["in_channels"], mean=tuple(config["mean"]), std=tuple(config["std"]),
        **sized,
    )
    model.lipcli_config = {**config, **{k: c.to_config() for k, c in components.items()}}
    return model


def create_model(
    arch: str = DEFAULT_COMPONENTS["arch"],
    *,
    conv: str = DEFAULTS["conv"],
    activation: str = DEFAULTS["activation"],
    pool: str = DEFAULTS["pool"],
    head: str = DEFAULTS["head"],
    num_classes: int = 10,
    in_channels: int = 3,
    image_size: tuple[int, int] = (32, 32),
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    registry: Registry | None = None,
    **arch_params: Any,
) -> nn.Module:
    """Python API mirroring ``lip train``'s model options.

    >>> model = create_model("lipconvnet-20", head="mlp", pool="projection")  # doctest: +SKIP

    Extra keyword arguments are architecture parameters (e.g. ``width=32``).  Component
    names accept inline parameters: ``conv="soc-fast:train_terms=8"``.
    """
    choices = {"arch": arch, "conv": conv, "activation": activation, "pool": pool, "head": head}
    components = resolve_components(choices, registry, arch_params)
    config = make_config(components, num_classes=num_classes, in_channels=in_channels,
                         image_size=image_size, mean=mean, std=std)
    return build_model(config, components)


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers (the state dict) as detached tensors."""
    return {k: v.detach() for k, v in model.state_dict().items()}


def _is_installed(distribution: str) -> bool:
    import importlib.metadata as md

    try:
        md.distribution(distribution)
    except md.PackageNotFoundError:
        return False
    return True


def save_model(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    dataset: dict[str, Any] | None = None,
    lipschitz: dict[str, Any] | None = None,
    results: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
    cache: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (built by :func:`build_model`) to a model file, atomically.

    The metadata slots are JSON objects (or ``None``); ``dataset`` is e.g.
    ``{"name": "digits", "params": {}, "num_classes": 10, "classes": [...]}``; ``provenance``
    (written only when given) records where imported weights came from (``lip import``)."""
    for slot, value in (("dataset", dataset), ("lipschitz", lipschitz), ("results", results),
                        ("training", training), ("cache", cache), ("provenance", provenance)):
        if value is not None and not isinstance(value, dict):
            raise TypeError(
                f"save_model: {slot} must be a dict or None, got {type(value).__name__} "
                f"{value!r:.60}"
            )
    config = getattr(model, "lipcli_config", None)
    if config is None:
        raise ValueError("model has no lipcli_config; build it with lipcli.create_model")
    metadata = {
        "config": config,
        "dataset": dataset,
        "normalization": {"mean": config["mean"], "std": config["std"]},
        "lipschitz": lipschitz,
        "results": results,
        "training": training,
        "cache": cache,
    }
    if provenance is not None:
        metadata["provenance"] = provenance
    return save_model_file(path, model_tensors(model), metadata)


def load_model(
    path: str | os.PathLike, *, registry: Registry | None = None, device: str | torch.device = "cpu"
) -> tuple[nn.Module, ModelFile]:
    """Rebuild a model from a model file's metadata and load its tensors (validated).

    The model is returned in eval mode.  Its power-iteration vectors are the saved ones,
    so the operator evaluated (and bounded by ``lip lipschitz``) is exactly the saved one.
    """
    mf = read_model_file(path)
    config = mf.config
    _check_config(path, config)
    check_config_limits(path, config, COMPONENT_KINDS)
    reg = registry or get_registry()
    try:  # nothing much larger than the file's tensors is allocated
        components = resolve_components(config, reg)
        with loading_tensors():  # components may skip init work the file's tensors replace
            model = guarded_build(path, lambda: build_model(config, components), mf.tensors)
    except UnknownComponentError as exc:
        raise _missing_component(path, exc, config.get(exc.kind) or {}, reg) from None
    except LipUsageError as exc:  # e.g. a parameter the component does not have: the file is bad
        raise ModelFileError(f"{path}: metadata: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(f"{path}: model config is invalid: {exc}") from None
    adopt_lazy_buffers(model, mf.tensors)  # buffers a layer sizes from its first input
    expected = model.state_dict()
    missing = sorted(set(expected) - set(mf.tensors))
    extra = sorted(set(mf.tensors) - set(expected))
    if missing or extra:
        raise ModelFileError(
            f"{path}: tensors do not match the model config "
            f"(missing: {', '.join(missing[:3]) or 'none'}; unexpected: {', '.join(extra[:3]) or 'none'})"
        )
    for key, ref in expected.items():
        got = mf.tensors[key]
        if got.shape != ref.shape or got.dtype != ref.dtype:
            raise ModelFileError(
                f"{path}: tensor {key!r} has shape {tuple(got.shape)} {got.dtype}, expected "
                f"{tuple(ref.shape)} {ref.dtype}"
            )
        if got.is_floating_point() and not torch.isfinite(got).all():
            raise ModelFileError(f"{path}: tensor {key!r} contains NaN or infinite values")
    model.load_state_dict(mf.tensors, strict=True)
    model.to(device)
    model.eval()
    return model, mf


def _broken(reg: Registry, distribution: Any) -> str | None:
    """``"installed but BROKEN (plugin ...: error); see `lip plugins`"`` when a plugin of
    ``distribution`` failed to load, else ``None``."""
    for info in reg.plugins.values():
        if info.error and info.distribution == distribution:
            return (f"installed but BROKEN (plugin {info.name!r}: {clean(info.error)}); "
                    "see `lip plugins`")
    return None


def _missing_component(
    path: str | os.PathLike, exc: UnknownComponentError, entry: dict[str, Any], reg: Registry
) -> MissingPluginError:
    """The error for a model that needs a component no loaded plugin provides: the
    distribution is broken (its error), not loaded (autoload disabled) or not installed (with
    ``pip install NAME`` when the recorded NAME is a valid distribution name)."""
    dist = entry.get("distribution") or "the plugin that provides it"
    needs = f"{path}: model needs {exc.kind} {exc.name!r} from distribution {clean(repr(dist))}"
    external = dist not in ("lipcli", "(in-process)")
    broken = _broken(reg, dist)
    if external and broken:
        return MissingPluginError(f"{needs}, which is {broken}")
    if autoload_disabled() and external and is_distribution_name(dist) and _is_installed(dist):
        return MissingPluginError(
            f"{needs}, which is installed, but installed plugins are not loaded "
            f"({DISABLE_AUTOLOAD_ENV} is set)"
        )
    hint = (
        install_hint(dist) if external
        else "it was provided by a different lipcli version or an in-process plugin"
    )
    return MissingPluginError(f"{needs}, which is not installed ({hint})")


def _check_config(path: str | os.PathLike, config: dict[str, Any]) -> None:
    for kind in COMPONENT_KINDS:  # arch and head always; the other kinds where the network has them
        entry = config.get(kind)
        if entry is None and kind not in ("arch", "head"):
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ModelFileError(f"{path}: model config lacks a valid {kind!r} entry")
        if not isinstance(entry.get("params", {}), dict):
            raise ModelFileError(f"{path}: model config {kind!r} params must be an object")
    for key in ("num_classes", "in_channels"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise ModelFileError(f"{path}: model config {key!r} must be a positive integer")
    for key in ("mean", "std"):
        vals = config.get(key)
        if not isinstance(vals, list) or len(vals) != config["in_channels"] or not all(
            isinstance(v, (int, float)) for v in vals
        ):
            raise ModelFileError(f"{path}: model config {key!r} must list one number per channel")
    if min(config["std"]) <= 0:
        raise ModelFileError(f"{path}: model config 'std' must be positive")


def recorded_dataset(
    path: str | os.PathLike, recorded: Any, registry: Registry | None = None
) -> Component | None:
    """The data-set component named by a model file's ``dataset`` slot (``None`` if null).

    ``recorded`` is ``ModelFile.metadata["dataset"]``.  A defective slot is a defect of the
    file, reported as one line naming it: not an object with a string ``name``, or parameters
    the data set does not have (:class:`ModelFileError`); a data set that no installed plugin
    provides (:class:`MissingPluginError`, with the distribution to install when recorded).
    Both exit 1; callers that take ``--dataset NAME`` should only call this without one.
    """
    if recorded is None:
        return None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("name"), str):
        raise ModelFileError(f"{path}: metadata: 'dataset' must be an object with a string 'name'")
    params = recorded.get("params") or {}
    if not isinstance(params, dict):
        raise ModelFileError(f"{path}: metadata: dataset 'params' must be an object")
    reg = registry or get_registry()
    try:
        return reg.component("dataset", {"name": recorded["name"], "params": params})
    except UnknownComponentError as exc:
        dist = recorded.get("distribution")
        broken = _broken(reg, dist) if isinstance(dist, str) else None
        if broken:
            raise MissingPluginError(f"{path}: metadata: {exc}; distribution {dist!r} is {broken}") from None
        hint = (f"{install_hint(dist)}, or pass --dataset NAME"
                if isinstance(dist, str) and dist and dist not in ("lipcli", "(in-process)")
                else "pass --dataset NAME")
        raise MissingPluginError(f"{path}: metadata: {exc} ({hint})") from None
    except LipUsageError as exc:
        raise ModelFileError(f"{path}: metadata: {exc}") from None
