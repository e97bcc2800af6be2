"""Conformance checks for plugin authors: run them in your plugin's test suite.

Every check raises :class:`AssertionError` with a message saying what is wrong (so they read
naturally inside pytest) and returns a small report of what it measured.

* :func:`check_component_spec` -- any spec: valid name, one-line description, parameters
  whose defaults validate, promises, and a factory that accepts the kind's call signature
  with the declared parameters (see :mod:`lipcli.sdk.specs` for the signatures).
* :func:`check_one_lipschitz` -- any map ``f``: empirical l2 Lipschitz checks in float64,
  on random pairs (dense and single-coordinate perturbations at many scales), on pairs
  pushed towards a larger ratio by gradient ascent, and the spectral norm of the full
  Jacobian at random points.  Passing is evidence, not proof: the *proof* is your
  docstring's argument.  A map that is not 1-Lipschitz almost always fails.
* :func:`check_pool_spec` -- a :class:`~lipcli.sdk.specs.PoolSpec`: the factory builds an
  ``nn.Module`` mapping ``(N, C, H, W)`` to ``(N, C/2, H, W)`` (also at ``H = W = 1``, as in
  LipConvnet's last block) with finite outputs and gradients, deterministic in eval mode,
  working in float32 and float64, 1-Lipschitz if it promises ``"1-lipschitz"`` -- as built
  and again with every parameter perturbed (random, large, negative values, a few optimiser
  steps on a random loss: a promise must hold for every value training can reach) --, its
  ``no_weight_decay`` names existing parameters, and its state dict surviving a safetensors
  round trip into a freshly built module (identical outputs: all state is in the state dict).
* :func:`check_activation_spec`, :func:`check_gradient_norm_preserving`,
  :func:`check_head_lipschitz` -- activations and heads; :func:`check_channel_module` holds
  the module checks pools and activations share.
* :func:`check_conv_spec`, :func:`check_conv_network_bound` -- convolutions;
  :func:`affine_matrix`, :func:`singular_values` and :func:`randomise_parameters` for a
  layer's own tests (its dense matrix, its spectrum, weights unlike the initialisation's).
* :func:`check_model_roundtrip` -- builds a tiny LipConvnet with your component through
  :func:`lipcli.host.models.create_model` (``width=4``), saves it as a lipcli model file, loads it
  back through the plugin registry and checks identical logits.

Example (a plugin's ``tests/test_conformance.py``)::

    from lipcli.testing import check_model_roundtrip, check_pool_spec
    from my_plugin.plugin import lip_pools

    def test_pool_conforms():
        for spec in lip_pools():
            check_pool_spec(spec, channels=8)

    def test_model_file_roundtrip():
        check_model_roundtrip(pool="my-pool")   # plugin installed (entry point)

Everything is imported from here; the modules behind it: :mod:`.specs`, :mod:`.lipschitz`,
:mod:`.modules` (checks shared by pools, activations and convolutions), :mod:`.components`
(pools, activations, heads), :mod:`.conv`, :mod:`.model` (model files), :mod:`.base`.
"""

from lipcli.testing.components import (
    ActivationCheckReport,
    HeadCheckReport,
    PoolCheckReport,
    check_activation_spec,
    check_gradient_norm_preserving,
    check_head_lipschitz,
    check_pool_spec,
    declared_lipschitz_bound,
    installed_plugin_modules,
)
from lipcli.testing.conv import (
    ConvCaseReport,
    affine_matrix,
    check_conv_network_bound,
    check_conv_spec,
    randomise_parameters,
    singular_values,
)
from lipcli.testing.lipschitz import LipschitzReport, check_one_lipschitz
from lipcli.testing.model import RoundtripReport, check_model_roundtrip
from lipcli.testing.modules import (
    ChannelCheckReport,
    ChannelModuleCheck,
    check_channel_module,
    check_channel_spec,
    check_state_roundtrip,
)
from lipcli.testing.specs import check_component_spec

__all__ = [
    "ActivationCheckReport",
    "ChannelCheckReport",
    "ChannelModuleCheck",
    "ConvCaseReport",
    "HeadCheckReport",
    "LipschitzReport",
    "PoolCheckReport",
    "RoundtripReport",
    "affine_matrix",
    "check_activation_spec",
    "check_channel_module",
    "check_channel_spec",
    "check_component_spec",
    "check_conv_network_bound",
    "check_conv_spec",
    "check_gradient_norm_preserving",
    "check_head_lipschitz",
    "check_model_roundtrip",
    "check_one_lipschitz",
    "check_pool_spec",
    "check_state_roundtrip",
    "declared_lipschitz_bound",
    "installed_plugin_modules",
    "randomise_parameters",
    "singular_values",
]
