"""The lowering protocol (plugin SDK): how a component takes part in ``lip export``.

The exported program is built from the model's **eval-mode** network, one child at a time,
without the export driver knowing any component:

* every child of ``model.body`` (the feature map ``g``: normalisation, convolutions,
  activations, pools, flatten) and ``model.head`` is replaced by ``child.export_module()``,
  a module of **plain torch operations** with the current weights baked in (no custom
  autograd functions, no in-place writes into views, no backend-specific calls, no Python
  control flow that depends on the values).  It must compute what ``child`` computes in
  eval mode, up to floating-point rounding; the driver checks the whole program against
  lipcli on real or random inputs after writing it (``--check``).  A module whose forward
  already is plain may return ``self``;
* a component that can choose between lowerings may take one argument,
  ``export_module(context)``: a :class:`~lipcli.sdk.lowering.LoweringContext` with the shape
  of one input example of the module (the program's input shape is fixed except the batch)
  and the cap the user set (``--dense-max-mib``; :data:`ExportContext` is another name of the
  same class, kept for plugins); it may describe its choice on the returned module as a
  JSON-serialisable dict ``export_lowering`` (recorded per layer in the
  export's metadata and printed by ``lip export``);
* modules of ``torch.nn`` itself (``nn.Flatten``, ``nn.Identity``, ...) without parameters
  are taken as they are;
* the head's certificate (``HeadSpec.certificate``) takes part when its certifier has
  ``export_certificate(head) -> ExportedCertificate`` (see :class:`ExportedCertificate`).

Anything else is an :class:`ExportError` naming the layer and the component that provides
it.  Plugin authors implement ``export_module()`` on their ``nn.Module`` (and
``export_certificate`` on their certifier); nothing needs registering.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from lipcli.sdk.errors import LipError
from lipcli.sdk.lowering import LoweringContext

#: name of the method a module implements to take part in export
EXPORT_METHOD = "export_module"
#: name of the method a certifier implements to take part in ``lip export --certify``
CERTIFICATE_METHOD = "export_certificate"
#: attribute of a lowered module describing its lowering (a JSON-serialisable dict)
LOWERING_ATTRIBUTE = "export_lowering"


#: another name of :class:`~lipcli.sdk.lowering.LoweringContext` (plugins may import either)
ExportContext = LoweringContext


class ExportError(LipError):
    """The model cannot be exported (a component without a lowering, a failed check) (exit 1)."""


@dataclass
class ExportedCertificate:
    """A certificate lowered to plain torch operations.

    Attributes:
        module: ``nn.Module`` mapping the float32 features ``y`` ``(N, D)`` to
            ``(predictions LongTensor[N], radius float64[N])``: the feature-space l2 radius
            around ``y`` on which the head's (float64) prediction cannot change, ``>= 0``,
            equal to what ``reference`` gives for the same features up to float32 rounding,
            in either direction (the export check bounds the difference by 1e-5 of the
            largest radius; neither certificate covers the forward pass's float32 rounding).
        reference: lipcli's own computation of the same certificate: features ``(N, D)`` ->
            feature-space radius ``float64[N]`` (what the exported one is compared with).
        kind: the certificate's name (``"lln"``, ``"crc-lip"``).
        description: what is computed, for people (stored in the export's metadata).
        record: JSON-serialisable details for the metadata (bounds used, their level, ...).
    """

    module: nn.Module
    reference: Callable[[torch.Tensor], torch.Tensor]
    kind: str
    description: str
    record: dict[str, Any] = field(default_factory=dict)


def describe_origin(module: nn.Module) -> str:
    """``"<kind> '<name>' from distribution '<dist>'"`` when the architecture recorded the
    component on the module (``lip_component``), else the class and its top-level package."""
    comp = getattr(module, "lip_component", None)
    if isinstance(comp, dict) and comp.get("name"):
        dist = comp.get("distribution") or "?"
        return f"{comp.get('kind', 'component')} {comp['name']!r} from distribution {dist!r}"
    cls = type(module)
    return f"{cls.__name__} from package {cls.__module__.split('.')[0]!r}"


def _plain_torch(module: nn.Module) -> bool:
    """A parameter-free module of ``torch.nn`` itself (Flatten, Identity, ...)."""
    cls = type(module)
    return cls.__module__.startswith("torch.nn.") and next(module.parameters(), None) is None and all(
        _plain_torch(child) for child in module.children()
    )


def _call_component(call: Callable[[], Any], who: str, method: str, expected: type) -> Any:
    """``call()`` (a component's own lowering code): its failures and a result of the wrong
    type become one-line :class:`ExportError` naming ``who``; lipcli errors pass through."""
    try:
        result = call()
    except LipError:
        raise
    except Exception as exc:  # noqa: BLE001 - foreign component code
        raise ExportError(
            f"{who} failed to lower itself for export: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())}"
        ) from None
    if not isinstance(result, expected):
        raise ExportError(
            f"{who}: {method}() returned {type(result).__name__}, not {expected.__name__}"
        )
    return result


def _takes_context(method: Callable[..., Any]) -> bool:
    """Whether ``export_module`` accepts the :class:`LoweringContext` (one positional argument)."""
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    return any(p.kind in positional for p in params)


def lower_module(module: nn.Module, where: str, context: LoweringContext | None = None) -> nn.Module:
    """The plain-torch stand-in of ``module`` (see the module docstring); ``where`` names the
    layer in errors (``"layer 'block1_pool'"``); ``context`` is passed to an
    ``export_module(context)`` that takes it."""
    lower = getattr(module, EXPORT_METHOD, None)
    if callable(lower):
        who = f"{where} ({describe_origin(module)})"
        if context is not None and _takes_context(lower):
            call = lambda: lower(context)  # noqa: E731
        else:
            call = lower
        return _call_component(call, who, EXPORT_METHOD, nn.Module).eval()
    if _plain_torch(module):
        return module
    raise ExportError(
        f"{where} ({describe_origin(module)}) cannot be exported: {type(module).__name__} has "
        f"no {EXPORT_METHOD}() method (see lipcli.sdk.export for the protocol)"
    )


def lower_certificate(certifier: Any, head: nn.Module, name: str) -> ExportedCertificate:
    """``certifier.export_certificate(head)``, or an :class:`ExportError` naming ``name``."""
    method = getattr(certifier, CERTIFICATE_METHOD, None)
    if not callable(method):
        raise ExportError(
            f"certificate {name!r} cannot be exported: its certifier "
            f"({type(certifier).__name__}) has no {CERTIFICATE_METHOD}() method; export "
            "without --certify"
        )
    return _call_component(lambda: method(head), f"certificate {name!r}", CERTIFICATE_METHOD,
                           ExportedCertificate)
