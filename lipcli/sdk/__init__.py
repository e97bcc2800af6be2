"""The plugin SDK: everything a plugin distribution imports from lipcli (with
:mod:`lipcli.numerics` for verified bound helpers).  Import the modules themselves; this
``__init__`` imports nothing, so a plugin loads only what it uses:

* :mod:`~lipcli.sdk.hookspecs`: the ``lip_*`` hooks and ``hookimpl``;
* :mod:`~lipcli.sdk.specs`: spec objects (``ConvSpec``, ``HeadSpec``, ...), ``Param``, promises;
* :mod:`~lipcli.sdk.recipes`: the parts of a ``RecipeSpec`` (``RecipeSource``, ``RecipeResult``);
* :mod:`~lipcli.sdk.losses`: the training-loss protocol;
* :mod:`~lipcli.sdk.certificates`: the certifier protocol and its result type;
* :mod:`~lipcli.sdk.errors`: the error classes;
* :mod:`~lipcli.sdk.convbase`: a base class for convolutions;
* :mod:`~lipcli.sdk.loading`: the load-time contract;
* :mod:`~lipcli.sdk.importers`: the ``lip import`` source-importer protocol (``ImportPlan``),
  with :mod:`~lipcli.sdk.checkpoints` (reading a checkpoint without running code);
* :mod:`~lipcli.sdk.export`: the ``lip export`` protocol (``export_module``,
  ``ExportedCertificate``, ``lower_module``);
* :mod:`~lipcli.sdk.lowering`: the eval lowering protocol (``LoweringContext``, also named
  ``ExportContext`` in :mod:`~lipcli.sdk.export`; ``eval_linear_map``, ``dense_lowering``).

See docs/plugins.md.
"""
