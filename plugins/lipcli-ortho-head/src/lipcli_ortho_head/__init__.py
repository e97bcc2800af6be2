"""lipcli plugin: the ``ortho`` head and the generic ``margin`` certificate."""

from .margin import MarginCertifier, head_lipschitz_bound, margin_radius
from .ortho import OrthoHead, orthonormalize

__all__ = ["MarginCertifier", "OrthoHead", "head_lipschitz_bound", "margin_radius", "orthonormalize"]
