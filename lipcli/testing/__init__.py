"""Conformance checks for plugin authors: run them in your plugin's test suite.

Every check raises :class:`AssertionError` with a message saying what is wrong (so they read
naturally inside pytest) and returns a small report of what it measured.

* :func:`check_component_spec` -- any spec: valid name, one-line description, parameters
  whose defaults validate, promises, and a factory that accepts the kind's call signature
  with the declared parameters (see :mod:`lipcli.sdk.specs` for the signatures).
* :func:`check_param_ranges` -- any spec: every parameter's declared range (``Param``'s
  ``min``/``max``/``odd``) accepts its edges and refuses one step beyond in one line
  (:mod:`.ranges`; :func:`range_edges` lists the values tried).
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
* :func:`check_augmentation` -- an augmentation policy: float ``[0, 1]`` images of the data
  set's shape, the same outputs for the same torch seed, the input left alone.
* :func:`check_conv_spec`, :func:`check_conv_network_bound` -- convolutions;
  :func:`affine_matrix`, :func:`singular_values` and :func:`randomise_parameters` for a
  layer's own tests (its dense matrix, its spectrum, weights unlike the initialisation's).
* :func:`check_model_roundtrip` -- builds a tiny LipConvnet with your component through
  :func:`lipcli.host.models.create_model` (``width=4``), saves it as a lipcli model file, loads it
  back through the plugin registry and checks identical logits.
* :func:`check_export_module`, :func:`check_export_follows`, :func:`check_aten_program`,
  :func:`run_exported_program` -- ``lip export``: a component's parameter-free stand-in
  (:mod:`.export`).
* :func:`check_eval_linear_map`, :func:`check_eval_error_covers`, :func:`check_dense_bound`,
  :func:`check_export_choice`, :func:`check_fourier_layer` and exact reference maps in 80-bit
  precision -- a convolution's eval lowering (``eval_linear_map``, :mod:`.lowering`).
* :func:`check_recipe`, :func:`check_recipes`, :func:`recipe_table` -- recipes: valid settings
  and sources, equal to a table written from the authors' files, and resolving against the
  installed components as ``lip train --recipe`` resolves them (:mod:`.recipes`).
* :func:`run_lip` -- ``lip ARGS`` in-process or as a subprocess, returning a
  :class:`LipResult`; :func:`install_distributions` installs source trees into a private folder
  for such subprocesses (:mod:`.cli`).
* :func:`plugin_registry`, :func:`registered`, :func:`installed_components` and the host and
  driver functions a plugin's tests drive (:func:`create_model`, :func:`save_model`,
  :func:`load_model`, :func:`read_model_metadata`, :func:`guaranteed_upper_bound`,
  :func:`perturbed_copies`, :func:`certify_model_file`; :mod:`.host`).
* :func:`check_import_fixture`, :func:`check_import_refused` -- an importer (``lip import``):
  a checkpoint made by the source's code imports to the recorded logits, provenance and a
  bound above the features' Jacobian norm; a bad one is one line (:mod:`.importing`).

A plugin's tests import lipcli through :mod:`lipcli.sdk`, :mod:`lipcli.numerics` and
:mod:`lipcli.testing` only.

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
(pools, activations, heads), :mod:`.conv`, :mod:`.model` (model files), :mod:`.export`,
:mod:`.lowering`, :mod:`.cli`, :mod:`.host`, :mod:`.importing`, :mod:`.base`.
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
from lipcli.testing.cli import LipResult, install_distributions, run_lip
from lipcli.testing.export import (
    ISOLATED_RUNNER,
    check_aten_program,
    check_export_follows,
    check_export_module,
    relative_error,
    run_exported_program,
)
from lipcli.testing.host import (
    InstalledComponent,
    certify_model_file,
    create_model,
    get_registry,
    guaranteed_upper_bound,
    installed_components,
    load_model,
    perturbed_copies,
    plugin_registry,
    read_model_metadata,
    registered,
    save_model,
)
from lipcli.testing.importing import ImportFixtureReport, check_import_fixture, check_import_refused
from lipcli.testing.lipschitz import LipschitzReport, check_one_lipschitz
from lipcli.testing.lowering import (
    LD,
    check_dense_bound,
    check_eval_error_covers,
    check_eval_linear_map,
    check_export_choice,
    check_fourier_layer,
    check_reference_is_the_layer,
    circular_conv_reference,
    extended_spectral_norm,
    fourier_reference,
    reference_on_input,
)
from lipcli.testing.model import RoundtripReport, check_model_roundtrip
from lipcli.testing.modules import (
    ChannelCheckReport,
    ChannelModuleCheck,
    check_channel_module,
    check_channel_spec,
    check_state_roundtrip,
)
from lipcli.testing.ranges import RangeEdge, check_param_ranges, range_edges
from lipcli.testing.recipes import check_recipe, check_recipes, recipe_table
from lipcli.testing.specs import check_component_spec
from lipcli.testing.augment import check_augmentation

__all__ = [
    "ActivationCheckReport",
    "ChannelCheckReport",
    "ChannelModuleCheck",
    "ConvCaseReport",
    "HeadCheckReport",
    "ImportFixtureReport",
    "InstalledComponent",
    "ISOLATED_RUNNER",
    "LD",
    "LipResult",
    "LipschitzReport",
    "PoolCheckReport",
    "RoundtripReport",
    "affine_matrix",
    "certify_model_file",
    "check_activation_spec",
    "check_aten_program",
    "check_channel_module",
    "check_channel_spec",
    "check_component_spec",
    "check_augmentation",
    "check_param_ranges",
    "range_edges",
    "RangeEdge",
    "check_conv_network_bound",
    "check_conv_spec",
    "check_dense_bound",
    "check_eval_error_covers",
    "check_eval_linear_map",
    "check_export_choice",
    "check_export_follows",
    "check_export_module",
    "check_fourier_layer",
    "check_gradient_norm_preserving",
    "check_head_lipschitz",
    "check_import_fixture",
    "check_import_refused",
    "check_model_roundtrip",
    "check_one_lipschitz",
    "check_pool_spec",
    "check_recipe",
    "check_recipes",
    "check_reference_is_the_layer",
    "check_state_roundtrip",
    "circular_conv_reference",
    "create_model",
    "declared_lipschitz_bound",
    "extended_spectral_norm",
    "fourier_reference",
    "get_registry",
    "guaranteed_upper_bound",
    "install_distributions",
    "installed_components",
    "installed_plugin_modules",
    "load_model",
    "perturbed_copies",
    "plugin_registry",
    "randomise_parameters",
    "read_model_metadata",
    "recipe_table",
    "reference_on_input",
    "registered",
    "relative_error",
    "run_exported_program",
    "run_lip",
    "save_model",
    "singular_values",
]
