"""The LLN built-in plugin (registered as ``lipcli.lln``): the ``lln`` head (last layer
normalisation, :mod:`.head`) and its exact margin certificate ``lln`` (:mod:`.certificate`;
SPEC §4)."""

from __future__ import annotations

from lipcli.builtins.lln.certificate import LLNCertifier
from lipcli.builtins.lln.head import LLNHead
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import SOUND, CertificateSpec, HeadSpec

__all__ = ["lip_certificates", "lip_heads"]


def _lln_head_factory(in_features: int, num_classes: int) -> LLNHead:
    return LLNHead(in_features, num_classes)


def _lln_certificate_factory() -> LLNCertifier:
    return LLNCertifier()


@hookimpl
def lip_heads() -> list[HeadSpec]:
    return [
        HeadSpec(
            name="lln",
            factory=_lln_head_factory,
            description="linear head with last layer normalisation (exact certificate)",
            certificate="lln",
            features="pool",
        ),
    ]


@hookimpl
def lip_certificates() -> list[CertificateSpec]:
    return [
        CertificateSpec(
            name="lln",
            factory=_lln_certificate_factory,
            description="exact margin certificate of a linear head (all classes, float64)",
            promises=(SOUND,),
        )
    ]
