"""The source-importer protocol (``lip import CHECKPOINT --from NAME``).

An importer is what an :class:`~lipcli.sdk.specs.ImporterSpec` factory returns
(``factory(**params)``, the spec's declared parameters).  It maps a state dict saved by
another project's code onto a lipcli model built from registered components.  The host does
the rest: it reads the checkpoint without running code (:mod:`lipcli.sdk.checkpoints`), checks
the keys and shapes against the importer's :class:`ImportPlan` *before* it builds anything,
refuses non-finite weights, builds the model, loads :meth:`SourceImporter.convert`'s tensors
strictly, computes the guaranteed bound and writes the model file.

``plan(tensors, arch)`` or ``plan(tensors, arch, options=...)``
    From the checkpoint's tensors (the file's own, by flattened name; nothing else is
    allocated yet: decide from their shapes, read a value only after checking its shape) and
    the user's ``--arch`` (``None``: infer it), return an :class:`ImportPlan`: the
    lipcli component choices and input description, every source key it reads with its shape
    (:attr:`ImportPlan.expected`), the keys it knows but does not import
    (:attr:`ImportPlan.ignored`) and the data set.  Raise :class:`ImportRefused` (one line,
    naming the missing piece) for what lipcli cannot represent, ``LipUsageError`` for a bad
    ``--arch``.  An importer whose source has options the shapes cannot tell declares the
    ``options`` parameter: a :class:`~lipcli.sdk.source_options.SourceOptions` with what the
    checkpoint's own values, ``--config FILE`` and ``--option NAME=VALUE`` state; it takes
    every such option from there and never assumes one (``options.require``/``choose`` refuse,
    naming it).  Its table of the source's options that change the function is its ``OPTIONS``
    (:class:`~lipcli.sdk.source_options.SourceOption` rows).
``convert(tensors, plan)``
    The lipcli state dict (every key of the built model's ``state_dict()``) from the source
    tensors (the keys of ``plan.expected``, shapes already checked, all finite).
``source_certificates(model, images)`` (optional, for ``--compare``)
    The source's own certificate rule applied to the imported ``model`` (the same function as
    the source's): a :class:`SourceCertificates` with the predictions and, per image, the
    radius the source's code would report (its Lipschitz *estimate*, its head formula, its
    top-k).  An importer without it makes ``--compare`` report lipcli's side only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lipcli.sdk.checkpoints import CheckpointError

__all__ = [
    "ImportPlan", "ImportRefused", "SourceCertificates", "SourceImporter", "strip_prefix",
]


class ImportRefused(CheckpointError):
    """The checkpoint holds something lipcli cannot represent (yet); the message names it."""


@dataclass(frozen=True)
class ImportPlan:
    """What an importer makes of a checkpoint (see the module).

    ``model``: the component choices by kind (``arch``, ``head`` and every other slot of the
    architecture: ``conv``, ``activation``, ``pool`` where it has them; each ``"name"``,
    ``"name:key=value,..."`` or a config entry), the input normalisation ``mean`` and ``std``
    of the source's network (required: nothing stands in for it; mean 0 and std 1 where it
    has none), and optionally ``num_classes``, ``in_channels``, ``image_size`` (as
    :func:`lipcli.host.models.make_config` takes them).  ``expected``: source key -> shape,
    every tensor the importer reads (a checkpoint key outside ``expected`` and ``ignored`` is
    refused as unexpected).  ``ignored``: source keys accepted and not imported (estimator
    state lipcli has no use for).  ``dataset``: the data set the source trains on (a
    ``dataset`` component name) or ``None``.  ``description``: one line for the report (e.g.
    ``"LipConvNet-10 (width 32), SOC, LLN head"``).  ``source_state``: values the importer's
    ``source_certificates`` needs later (e.g. the source's own head weights), JSON-free.
    ``options``: the source's options that decided the network (name -> value, JSON values),
    recorded in the model file's provenance.
    """

    model: Mapping[str, Any]
    expected: Mapping[str, tuple[int, ...]]
    ignored: Sequence[str] = ()
    dataset: str | None = None
    description: str = ""
    source_state: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceCertificates:
    """The source's own certificate rule on some images: ``predictions`` (N,) and ``radii``
    (N,), the radius the source reports for the predicted class (0 where it certifies none);
    ``lipschitz`` the constant it divided by and ``label`` what that constant is (e.g.
    ``"power-iteration estimate (exact=True, 50 steps)"``).  The source certifies an image at
    radius ``r`` when its prediction is right and ``radius > r`` (or ``>=``: ``strict``)."""

    predictions: Any
    radii: Any
    lipschitz: float
    label: str
    strict: bool = True


@runtime_checkable
class SourceImporter(Protocol):
    """What an ``importer`` factory returns (see the module for the contract)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None) -> ImportPlan: ...

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]: ...


def strip_prefix(shapes: Mapping[str, Any], prefixes: Sequence[str] = ("module.",)) -> str:
    """The prefix (one of ``prefixes``, e.g. ``DataParallel``'s ``"module."``) every key
    starts with, else ``""``: importers read ``key[len(prefix):]``."""
    for prefix in prefixes:
        if shapes and all(key.startswith(prefix) for key in shapes):
            return prefix
    return ""
