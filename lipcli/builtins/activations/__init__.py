"""The built-in activation ``maxmin`` (plugin ``lipcli.activations``, its hook in
:mod:`.plugin`; the layer in :mod:`.maxmin`, whose names are re-exported here)."""

from lipcli.builtins.activations.maxmin import MaxMin, PlainMaxMin, max_min

__all__ = ["MaxMin", "PlainMaxMin", "max_min"]
