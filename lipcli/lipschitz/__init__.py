"""The network's Lipschitz constant and the promises it rests on (SPEC §5), used by every
driver (train, certify, lipschitz, export, bench) and by built-ins:

* :mod:`lipcli.lipschitz.bound`: the GUARANTEED upper bound of ``Lip(g)`` (product of the
  per-layer bounds and promises), also of the operator that runs after the eval lowering
  (:mod:`lipcli.lowering`: dense matrices where cheaper), and the layer-shape helpers;
* :mod:`lipcli.lipschitz.empirical`: the empirical LOWER bound;
* :mod:`lipcli.lipschitz.report`: the power-iteration estimate and :class:`LipschitzReport`
  (``lip lipschitz``);
* :mod:`lipcli.lipschitz.promises`: the ``1-lipschitz`` promises checked with the
  parameters in use (a broken promise is an error, never a certificate).
"""

from lipcli._util.lazy import callable_package

#: ``lipcli.lipschitz(model, ...)``: the Python twin of ``lip lipschitz`` (:mod:`~lipcli.lipschitz.api`)
callable_package(__name__, "api", "run")
