"""The LLN built-in plugin (registered as ``lipcli.lln``): the ``lln`` head (last layer
normalisation) and its exact margin certificate ``lln`` (SPEC §4)."""

from lipcli.builtins.lln.certificate import lip_certificates
from lipcli.builtins.lln.head import lip_heads

__all__ = ["lip_certificates", "lip_heads"]
