"""lipcli-lipnext: LipNeXt (Hu, Hu, Fredrikson, ICLR 2026) and its manifold optimiser ``so-adam``."""

__version__ = "0.1.0"
