"""The lipcli plugin module (entry point ``ortho`` in the ``lipcli`` group).

Provides the head ``ortho`` (``lip train --head ortho``), certified by the certificate
``margin``, which also certifies any third-party head that declares a guaranteed Lipschitz
bound: such a head's spec just names ``certificate="margin"``.
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import SOUND, CertificateSpec, HeadSpec

from .margin import NAME as MARGIN, MarginCertifier
from .ortho import OrthoHead


def head_factory(in_features: int, num_classes: int) -> OrthoHead:
    """HeadSpec factory: ``(N, in_features) -> (N, num_classes)``."""
    return OrthoHead(in_features, num_classes)


def certificate_factory() -> MarginCertifier:
    return MarginCertifier()


def ortho_spec() -> HeadSpec:
    return HeadSpec(
        name="ortho",
        factory=head_factory,
        description="orthogonal last layer: W y + b with orthonormal rows (paper code's 'ortho')",
        certificate=MARGIN,
        features="pool",
    )


def margin_spec() -> CertificateSpec:
    return CertificateSpec(
        name=MARGIN,
        factory=certificate_factory,
        description="margin / (sqrt(2) L) for any head with a guaranteed Lipschitz bound L",
        promises=(SOUND,),
    )


@hookimpl
def lip_heads() -> list[HeadSpec]:
    return [ortho_spec()]


@hookimpl
def lip_certificates() -> list[CertificateSpec]:
    return [margin_spec()]
