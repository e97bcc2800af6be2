"""The built-in training losses ``ce``, ``cr`` and ``margin-offset`` (plugin
``lipcli.losses``, its hook in :mod:`.plugin`; the losses in :mod:`.objectives`, whose names
are re-exported here).  The CRC-Lip loss ``crc-lip`` is part of :mod:`lipcli.builtins.crc`."""

from lipcli.builtins.losses.objectives import (
    DEFAULT_EPS,
    CertificateRegularizedLoss,
    CrossEntropyLoss,
    MarginOffsetLoss,
)

__all__ = ["DEFAULT_EPS", "CertificateRegularizedLoss", "CrossEntropyLoss", "MarginOffsetLoss"]
