"""The network's Lipschitz constant and the promises it rests on (SPEC §5), used by every
driver (train, certify, lipschitz, export, bench) and by built-ins:

* :mod:`lipcli.lipschitz.bound`: the GUARANTEED upper bound of ``Lip(g)`` (product of the
  per-layer bounds and promises) and the model-shape helpers;
* :mod:`lipcli.lipschitz.empirical`: the empirical LOWER bound;
* :mod:`lipcli.lipschitz.lowered`: the eval lowering (dense matrices where cheaper), built
  once per model and input shape, and the GUARANTEED bound of the operator that runs;
* :mod:`lipcli.lipschitz.report`: the power-iteration estimate and :class:`LipschitzReport`
  (``lip lipschitz``);
* :mod:`lipcli.lipschitz.promises`: the ``1-lipschitz`` promises checked with the
  parameters in use (a broken promise is an error, never a certificate).
"""
