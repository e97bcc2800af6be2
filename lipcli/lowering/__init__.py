"""The eval lowering: a model run with its fixed linear layers as dense matrices where cheaper.

In eval mode a layer that knows its fixed linear map (:mod:`lipcli.sdk.lowering`: SOC and any
plugin implementing ``eval_linear_map``) may run as one dense matrix product on inputs of a
known shape, which on small images costs far fewer operations than its literal form (SOC:
14 convolutions of the 15-term series).  The layer decides in its
``export_module(context)``, told its input shape and the cap in a
:class:`~lipcli.sdk.lowering.LoweringContext` (dense where its float32 matrix fits the cap,
is at least ``DENSE_MIN_GAIN`` times cheaper per input and its build pays off on the number
of inputs it will run on, :func:`lipcli.sdk.lowering.pays_off`; its literal form
otherwise); this package applies that decision to a whole model, for ``lip certify``,
``lip bench certify``, ``lip lipschitz --empirical``, the attack and promise checks and
``lip export``:

* :mod:`lipcli.lowering.caps` (no torch): the one setting, ``dense_max_mib`` (MiB of float32
  per layer): ``lip export``'s default :data:`~lipcli.lowering.caps.EXPORT_DENSE_MAX_MIB`,
  the per-device default of lipcli's own eval runs
  :data:`~lipcli.lowering.caps.CERTIFY_DENSE_MAX_MIB`, its one check
  :func:`~lipcli.lowering.caps.check_dense_max_mib` and its conversion to bytes
  :func:`~lipcli.lowering.caps.dense_max_bytes`;
* :mod:`lipcli.lowering.network`: :func:`lower_body` walks ``model.body`` child by child;
  with ``plain=True`` (``lip export``) every child becomes its plain-torch stand-in,
  otherwise only the dense stand-ins replace their layers.  :func:`lowered_network` returns
  a :class:`LoweredNetwork` (``features``, ``forward``) cached on the model for its input
  shape, cap, device and weights (a changed parameter or buffer builds it again);
  ``series=True`` returns the model's own layers (no lowering), for comparison.

The GUARANTEED bound of the operator that runs is
:func:`lipcli.lipschitz.bound.lowered_upper_bound`: the model's per-layer bounds with each
dense layer's ``U`` replaced by ``U + bound_excess``, multiplied rounded up.
"""

from __future__ import annotations

from lipcli._util.lazy import lazy_exports

#: public name -> submodule defining it (imported on first use: help texts read
#: :mod:`lipcli.lowering.caps` without torch)
_EXPORTS: dict[str, str] = {
    "CERTIFY_DENSE_MAX_MIB": "caps", "CERTIFY_DENSE_MAX_MIB_OTHER": "caps",
    "EXPORT_DENSE_MAX_MIB": "caps", "certify_dense_max_mib": "caps",
    "check_dense_max_mib": "caps", "dense_max_bytes": "caps", "describe_certify_default": "caps",
    "LoweredNetwork": "network", "default_dense_max_mib": "network", "lower_body": "network",
    "lowered_network": "network",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)  # the names above, listed once
