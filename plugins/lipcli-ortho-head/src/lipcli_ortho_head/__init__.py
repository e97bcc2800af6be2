"""lipcli plugin: the ``ortho`` head and the generic ``margin`` certificate."""

from .margin import MarginCertifier, head_lipschitz_bound, margin_radius
from .ortho import OrthoHead, orthonormalize

__version__ = "0.2.0"

__all__ = ["__version__", "MarginCertifier", "OrthoHead", "head_lipschitz_bound", "margin_radius", "orthonormalize"]
