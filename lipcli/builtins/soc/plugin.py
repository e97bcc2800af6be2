"""The SOC built-in plugin (registered as ``lipcli.soc``): the ``soc`` and ``soc-fast``
convolutions (skew orthogonal convolution, exact and fast weight gradient; SPEC §2)."""

from lipcli.builtins.soc.layer import lip_convolutions

__all__ = ["lip_convolutions"]
