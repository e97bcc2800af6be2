"""lipcli: train provably 1-Lipschitz convolutional networks and certify their l2 robustness.

Implements Singla & Feizi, *Improved techniques for deterministic l2 robustness* (NeurIPS
2022): SOC convolutions with the fast weight gradient, MaxMin, projection pooling,
LipConvnet-n, and the LLN and CRC-Lip certificates.
"""

from __future__ import annotations

from lipcli.version import __version__

__all__ = ["__version__", "certify", "create_model", "import_checkpoint", "lipschitz", "load_model",
           "save_model", "train"]
#: the Python twins of ``lip train``, ``lip certify`` and ``lip lipschitz``: callable packages
#: (``lipcli.train(recipe="lipconvnet", dataset="digits")``; each package's ``api`` module)
_TWINS = ("train", "certify", "lipschitz")


def __getattr__(name: str):  # lazy: keep `import lipcli` (and `lip --help`) light
    import importlib

    if name in ("create_model", "save_model", "load_model"):
        from lipcli.host import models

        return getattr(models, name)
    if name in _TWINS:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "import_checkpoint":  # the twin of ``lip import``
        from lipcli.importing.api import run

        return run
    raise AttributeError(name)


def __dir__() -> list[str]:  # the lazy names too (tab completion, dir(lipcli))
    return sorted(set(globals()) | set(__all__))
