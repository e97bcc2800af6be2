"""Spec objects that plugins return from their ``lip_*`` hooks.

A spec is an immutable description of one component: its unique CLI name, a factory that
builds it, typed parameters with defaults, a one-line description and what it promises
(for example ``"1-lipschitz"``).  The host never imports a plugin's classes directly: it only
sees specs, so built-in and third-party components are handled identically.

Factory signatures by kind (``**params`` are the spec's declared :class:`Param` values):

===============  ===========================================================================
kind             factory call
===============  ===========================================================================
``conv``         ``factory(in_channels, out_channels, kernel_size, stride, **params)`` ->
                 ``nn.Module`` mapping ``(N, in, H, W)`` to ``(N, out, H/stride, W/stride)``
``activation``   ``factory(channels, **params)`` -> ``nn.Module`` keeping the shape
``pool``         ``factory(channels, **params)`` -> ``nn.Module`` mapping ``C`` to ``C/2``
                 channels at the same spatial size
``head``         ``factory(in_features, num_classes, **params)`` -> ``nn.Module`` mapping
                 ``(N, in_features)`` to logits ``(N, num_classes)``
``certificate``  ``factory(**params)`` -> a certifier (see :mod:`lipcli.sdk.certificates`)
``arch``         ``factory(*, conv, activation, pool, head, num_classes, in_channels, mean,
                 std, **params)`` -> ``nn.Module``; the first four are :class:`Component`
``dataset``      ``factory(root, split, *, download=False, augment=False, **params)`` ->
                 a ``torch.utils.data.Dataset`` yielding ``(image in [0, 1], label)``
``loss``         ``factory(context, **params)`` -> a training loss ``nn.Module``:
                 ``loss(model, images, labels) -> LossOutput`` (see :mod:`lipcli.sdk.losses`)
``augmentation`` ``factory(base, **params)`` -> the training transform ``(C, H, W) -> (C, H, W)``;
                 ``base`` is the data set's :class:`~lipcli.sdk.augment.RandomCropFlip`
                 (see :mod:`lipcli.sdk.augment`)
``recipe``       ``factory()`` -> a copy of the recipe's ``values`` (set by
                 :class:`RecipeSpec` itself; a recipe is data, see :mod:`lipcli.sdk.recipes`)
``importer``     ``factory(**params)`` -> a source importer (``plan``, ``convert``, optional
                 ``source_certificates``; see :mod:`lipcli.sdk.importers`)
``optimizer``    ``factory(context, **params)`` -> a ``torch.optim.Optimizer`` over
                 ``context.groups`` (see :mod:`lipcli.sdk.optimizers`)
===============  ===========================================================================
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from lipcli.sdk.params import PARAM_TYPES, Param  # noqa: F401 - Param: part of every spec (and re-exported)
from lipcli.sdk.recipes import RecipeResult, RecipeSource  # noqa: F401 - the recipe spec's parts

#: the layer kinds an architecture is assembled from (its possible slots: :attr:`ArchSpec.slots`)
LAYER_KINDS: tuple[str, ...] = ("conv", "activation", "pool", "head")

#: Promise: the component is 1-Lipschitz in the l2 norm (exactly, by construction).
ONE_LIPSCHITZ = "1-lipschitz"
#: Promise: the component is orthogonal (norm preserving) up to a bounded series truncation.
ORTHOGONAL = "orthogonal"
#: Promise: the certificate method never over-claims (sound lower bound on the true radius).
SOUND = "sound"

#: ``torch.profiler`` range name under which a convolution component may run the
#: convolutions it computes in another form (a fused convolution-plus-add, a matrix product
#: for 1×1 filters on 1×1 images), so that ``lip bench profile`` counts them as convolution
CONVOLUTION_PROFILE_LABEL = "lipcli::soc_convolution"

@dataclass(frozen=True, kw_only=True)
class ComponentSpec:
    """Base spec. Subclasses fix :attr:`kind`."""

    kind: ClassVar[str] = "component"

    name: str
    factory: Callable[..., Any]
    description: str
    params: tuple[Param, ...] = ()
    promises: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.strip() or " " in self.name:
            raise ValueError(f"invalid component name {self.name!r}")
        if not callable(self.factory):
            raise TypeError(f"{self.kind} {self.name!r}: factory is not callable")
        seen = set()
        for p in self.params:
            if p.name in seen:
                raise ValueError(f"{self.kind} {self.name!r}: duplicate parameter {p.name!r}")
            seen.add(p.name)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        valid = ", ".join(p.name for p in self.params) or "none"
        raise KeyError(f"{self.kind} {self.name!r} has no parameter {name!r} (valid: {valid})")

    def resolve_params(self, given: dict[str, Any] | None = None, *, from_text: bool = False) -> dict[str, Any]:
        """Defaults overlaid with ``given`` (validated, :meth:`Param.check`); unknown names
        raise ``KeyError``, bad values ``ValueError``.  With ``from_text`` a string value is
        read as on the command line (:meth:`Param.parse`: ``"8"`` for an int, ``"yes"`` for a
        bool), as the host does for every component choice."""
        out = {p.name: p.default for p in self.params}
        for key, value in (given or {}).items():
            param = self.param(key)
            out[key] = param.parse(value) if from_text and isinstance(value, str) else param.check(value)
        return out


@dataclass(frozen=True, kw_only=True)
class ConvSpec(ComponentSpec):
    """A convolution layer (e.g. ``soc-fast``)."""

    kind: ClassVar[str] = "conv"


@dataclass(frozen=True, kw_only=True)
class ActivationSpec(ComponentSpec):
    """A shape-preserving activation (e.g. ``maxmin``)."""

    kind: ClassVar[str] = "activation"


@dataclass(frozen=True, kw_only=True)
class PoolSpec(ComponentSpec):
    """A pooling layer that halves the number of channels (e.g. ``max``, ``projection``)."""

    kind: ClassVar[str] = "pool"


@dataclass(frozen=True, kw_only=True)
class HeadSpec(ComponentSpec):
    """A classification head and the certificate method that certifies it.

    ``features`` says what the architecture feeds the head: ``"pool"`` (the last SOC output
    pooled to half its channels, as for LLN) or ``"activation"`` (MaxMin of it, full width,
    as for the CRC-Lip MLP).  ``loss`` is the training loss the head is trained with by
    default (``"ce"``; the CRC-Lip MLP: ``"crc-lip"``).
    """

    kind: ClassVar[str] = "head"
    certificate: str
    features: str = "pool"
    #: the training loss (a ``loss`` component choice) used when ``--loss`` is not given
    loss: str = "ce"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.features not in ("pool", "activation"):
            raise ValueError(f"head {self.name!r}: features must be 'pool' or 'activation'")


@dataclass(frozen=True, kw_only=True)
class CertificateSpec(ComponentSpec):
    """A certificate method: builds a certifier for a head (see :mod:`lipcli.certify`)."""

    kind: ClassVar[str] = "certificate"


@dataclass(frozen=True, kw_only=True)
class ArchSpec(ComponentSpec):
    """A network architecture (e.g. ``lipconvnet-20``).

    ``slots``: the layer kinds (:data:`LAYER_KINDS`) the network takes from the user
    (``--conv``, ``--activation``, ``--pool``, ``--head``); a kind it does not list it fixes
    itself, and is then neither passed to its factory (``None`` instead) nor recorded in model
    files.  A tuple, or ``slots(params, head)`` of the architecture's parameters and the head's
    spec when they decide it (a network whose pool exists only for heads that ask for it).
    The head is always a slot.
    """

    kind: ClassVar[str] = "arch"
    slots: tuple[str, ...] | Callable[[dict[str, Any], Any], tuple[str, ...]] = LAYER_KINDS

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.slots):
            self.slots_for({})  # a declaration outside the layer kinds fails here, at registration

    def slots_for(self, params: dict[str, Any], head: Any = None) -> tuple[str, ...]:
        """The slots of this architecture at ``params`` (with the ``head`` spec), in
        :data:`LAYER_KINDS` order; a declaration outside them is a spec bug (``TypeError``)."""
        kinds = tuple(self.slots(dict(params), head) if callable(self.slots) else self.slots)
        if not set(kinds) <= set(LAYER_KINDS) or "head" not in kinds:
            raise TypeError(f"arch {self.name!r}: slots must be layer kinds ({', '.join(LAYER_KINDS)}) "
                            f"including head, got {kinds!r}")
        return tuple(k for k in LAYER_KINDS if k in kinds)


@dataclass(frozen=True, kw_only=True)
class DatasetSpec(ComponentSpec):
    """A data set. ``num_classes`` may be ``None`` when it depends on the data on disk."""

    kind: ClassVar[str] = "dataset"
    num_classes: int | None
    image_shape: tuple[int, int, int] = (3, 32, 32)
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    needs_root: bool = True


@dataclass(frozen=True, kw_only=True)
class LossSpec(ComponentSpec):
    """A training loss (e.g. ``ce``, ``crc-lip``); the protocol is in :mod:`lipcli.sdk.losses`.

    ``recipe`` (optional): ``recipe(dataset_name) -> dict`` of parameter values that a
    published recipe uses for that data set; the trainer applies them to every parameter the
    user did not give (e.g. CRC-Lip's radius and weight differ for CIFAR-100).
    ``grad_clip``: the gradient-norm clipping the loss's recipe trains with when the user
    gives none (0 = off).
    """

    kind: ClassVar[str] = "loss"
    recipe: Callable[[str], dict[str, Any]] | None = None
    grad_clip: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.recipe is not None and not callable(self.recipe):
            raise TypeError(f"loss {self.name!r}: recipe is not callable")
        if not self.grad_clip >= 0:
            raise ValueError(f"loss {self.name!r}: grad_clip must be >= 0")


@dataclass(frozen=True, kw_only=True)
class AugmentationSpec(ComponentSpec):
    """A training augmentation policy (``lip train --augmentation NAME``): the transform the
    training split applies to each image instead of its own crop and flip (protocol in
    :mod:`lipcli.sdk.augment`)."""

    kind: ClassVar[str] = "augmentation"


@dataclass(frozen=True, kw_only=True)
class RecipeSpec(ComponentSpec):
    """A named, versioned set of ``lip train`` settings (``values``: settings keys ->
    values, component choices as ``"name:key=value,..."``) from ``paper``, each value with
    the :class:`RecipeSource` it was read from (``sources``, one per value), the paper's
    ``reported`` accuracies and the authors' settings lipcli cannot express yet
    (``pending``, in words).  ``--recipe NAME`` makes ``values`` the defaults."""

    kind: ClassVar[str] = "recipe"
    factory: Callable[..., Any] = field(default=dict, compare=False)  # set to: a copy of ``values``
    version: str
    paper: str
    values: dict[str, Any]
    sources: dict[str, RecipeSource]
    reported: tuple[RecipeResult, ...] = ()
    pending: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "factory", functools.partial(dict, self.values))
        super().__post_init__()
        if self.params:
            raise ValueError(f"recipe {self.name!r}: a recipe has values, not params")
        if not self.version.strip() or "@" in self.version or not self.paper.strip():
            raise ValueError(f"recipe {self.name!r}: needs a version (no '@') and a paper")
        for key, value in self.values.items():
            if not all(isinstance(v, PARAM_TYPES) for v in (value if isinstance(value, list) else [value])):
                raise TypeError(f"recipe {self.name!r}: value {key!r} must be int, float, str, bool or a list")
        unsourced = sorted(set(self.values) ^ set(self.sources))
        if unsourced:
            raise ValueError(f"recipe {self.name!r}: every value needs one source, and every source "
                             f"a value: {', '.join(unsourced)}")

    @property
    def label(self) -> str:
        """``name@version``, as model files record it."""
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, kw_only=True)
class ImporterSpec(ComponentSpec):
    """A checkpoint importer (``lip import CHECKPOINT --from NAME``): reads the state dict that
    another project's code saved and maps it onto lipcli components (protocol in
    :mod:`lipcli.sdk.importers`).  ``source`` names the code whose checkpoints it reads
    (e.g. ``"github.com/singlasahil14/improved_l2_robustness"``)."""

    kind: ClassVar[str] = "importer"
    source: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.source or not isinstance(self.source, str):
            raise ValueError(f"importer {self.name!r}: source must name the code it reads")


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec(ComponentSpec):
    """An optimiser (``lip train --optimizer NAME``; protocol in :mod:`lipcli.sdk.optimizers`).
    ``default_lr``: the learning rate it trains with when ``--lr`` is not given."""

    kind: ClassVar[str] = "optimizer"
    default_lr: float

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.default_lr > 0:
            raise ValueError(f"optimizer {self.name!r}: default_lr must be positive")


SPEC_KINDS: dict[str, type[ComponentSpec]] = {
    cls.kind: cls
    for cls in (ConvSpec, ActivationSpec, PoolSpec, HeadSpec, CertificateSpec, ArchSpec,
                DatasetSpec, LossSpec, AugmentationSpec, RecipeSpec, ImporterSpec, OptimizerSpec)
}


@dataclass(frozen=True)
class Component:
    """A resolved component: its spec, validated parameters and providing plugin."""

    spec: ComponentSpec
    params: dict[str, Any] = field(default_factory=dict)
    provider: str = ""
    distribution: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Call the spec's factory with the positional arguments and the resolved params.

        A module it builds is stamped here, the one place this happens, with the spec's
        promises (``lip_promises``, what the guaranteed bound and the promise check read) and
        with the component that built it (``lip_component``: kind, name, provider,
        distribution; named in promise checks and export errors)."""
        built = self.spec.factory(*args, **kwargs, **self.params)
        torch = sys.modules.get("torch")  # no torch imported: nothing built is a module
        if torch is not None and isinstance(built, torch.nn.Module):
            built.lip_promises = tuple(self.spec.promises)
            built.lip_component = {"kind": self.spec.kind, "name": self.name,
                                   "provider": self.provider, "distribution": self.distribution}
        return built

    def to_config(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "params": dict(self.params),
            "provider": self.provider,
            "distribution": self.distribution,
        }


def replace(spec: ComponentSpec, **changes: Any) -> ComponentSpec:
    """``dataclasses.replace`` for specs (handy for tests and plugin authors)."""
    return dataclasses.replace(spec, **changes)
