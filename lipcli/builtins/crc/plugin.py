"""The CRC-Lip built-in plugin (registered as ``lipcli.crc``): the ``mlp`` head, the
``crc-lip`` curvature certificate and the ``crc-lip`` training loss (paper §5, SPEC §4, §6)."""

from lipcli.builtins.crc.certifier import lip_certificates
from lipcli.builtins.crc.head import lip_heads
from lipcli.builtins.crc.loss import lip_losses

__all__ = ["lip_certificates", "lip_heads", "lip_losses"]
