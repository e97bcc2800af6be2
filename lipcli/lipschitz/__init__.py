"""The network's Lipschitz constant and the promises it rests on (SPEC §5), used by every
driver (train, certify, lipschitz, export, bench) and by built-ins:

* :mod:`lipcli.lipschitz.bound`: the GUARANTEED upper bound of ``Lip(g)`` (product of the
  per-layer bounds and promises), the power-iteration estimate, :class:`LipschitzReport`;
* :mod:`lipcli.lipschitz.promises`: the ``1-lipschitz`` promises checked with the
  parameters in use (a broken promise is an error, never a certificate).
"""
