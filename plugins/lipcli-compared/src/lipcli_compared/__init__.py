"""lipcli-compared: the comparison study of Prach, Brau, Buttazzo & Lampert, *1-Lipschitz Layers
Compared: Memory, Speed, and Certifiable Robustness* (CVPR 2024): its network
(``convnet-xs`` .. ``convnet-l``) for any installed convolution, its first-channels head and
its recipe ``layers-compared``."""

from __future__ import annotations

__version__ = "0.1.0"

from .network import SIZES, ComparedConvNet, FirstChannels  # noqa: E402

__all__ = ["__version__", "SIZES", "ComparedConvNet", "FirstChannels"]
