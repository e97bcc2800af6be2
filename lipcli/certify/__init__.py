"""Certification driver: model file + data set -> certified accuracy at l2 radii (SPEC §4, §5).

Pipeline (:func:`run_certification`, :mod:`lipcli.certify.driver`):

1. load the model file (:func:`lipcli.host.models.load_model`, eval mode, the saved power-iteration
   vectors: the operator certified is exactly the saved one) and the data set named on the
   command line or recorded in the file's ``dataset`` slot; check classes and input shape;
2. features ``y = g(x)`` in float32, batched, eval mode, no gradients; then every layer
   counted as 1 by its promise is measured with the trained parameters at the first data
   points (:mod:`lipcli.lipschitz.promises`: a broken promise is an error, never a certificate);
3. the head's certificate (``HeadSpec.certificate``; all classes unless ``top_k``):
   ``prepare(head, cache)`` with the file's ``cache[<name>]`` slot, then ``certify`` on the
   features; the certifier works in float64 and returns feature-space radii ``r_y``;
4. ``Lip(g)``: by default the GUARANTEED upper bound of :mod:`lipcli.lipschitz.bound`, computed
   fresh (normalisation included); ``lipschitz="estimate"`` uses the reference's product of
   power-method estimates, labelled "ESTIMATE (paper convention, not guaranteed)";
5. input-space radius ``r = r_y / Lip(g)`` (rounded down by one ulp), SPEC §4.

Definitions reported (``N`` points, ``correct_i`` = prediction equals the label, ``r_i`` the
certified radius of the *predicted* class):

* clean accuracy ``= mean_i correct_i``;
* certified accuracy at ``eps`` ``= mean_i [correct_i and r_i >= eps]`` (SPEC §4);
* mean certified radius, ``"all"``: ``mean_i correct_i * r_i`` (0 for misclassified points,
  averaged over all ``N``); ``"correct"``: ``mean`` of ``r_i`` over correctly classified points.

Floating point: the certificates are statements about the network in exact arithmetic with
the stored float32 weights. The head's certificate is computed in float64 with its rounding
accounted for by the certifier, and ``r_y / Lip`` is rounded down; the float32 rounding of
the features themselves is not (``benchmarks/rounding_report.py`` measures the float32 radii
against float64 ones, docs/guide.md), which matters only for radii that close to a requested
radius.  ``exact`` (``lip certify --exact``, :mod:`lipcli.certify.exact`) computes the
features, logits and margins in float64 on a float64 copy of the model instead.  The same holds for projection pooling, whose
``cos``/``sin`` of the angle are float32 numbers (unit length up to ~1e-7).

Optional PGD check (:mod:`lipcli.certify.pgd`) at each radius ``eps``: every point whose
prediction is certified at ``eps`` is attacked at ``eps``; a success within its certified
radius is a SOUNDNESS VIOLATION. Correctly classified points are attacked too, giving the
empirical robust accuracy ``mean_i [correct_i and attack at eps failed]`` (an upper bound
on the true robust accuracy, which the certified accuracy bounds from below).
"""

from __future__ import annotations

import importlib
from typing import Any

from lipcli._util.lazy import callable_package

#: public name -> submodule defining it (imported on first use: ``lip --help`` and the CLI's
#: option defaults import :mod:`lipcli.certify.options` without torch)
_EXPORTS = {
    "CertifyOptions": "options", "DEFAULT_RADII": "options", "LIPSCHITZ_METHODS": "options",
    "parse_radii": "options",
    "AttackInfo": "results", "BOUND_TEXT": "results", "CertificateUsed": "results",
    "CertifyOutcome": "results", "CertifySummary": "results", "ESTIMATE_WARNING": "results",
    "EvalDataset": "results", "LipschitzUsed": "results", "MeanCertifiedRadius": "results",
    "RadiusRow": "results", "ResultsNotWrittenError": "results", "Violation": "results",
    "check_class_names": "data", "check_compatible": "data", "load_dataset": "data",
    "RESULTS_KEY": "driver", "run_certification": "driver",
    "Progress": "steps", "input_radii": "steps",
}
__all__ = sorted(_EXPORTS)
#: ``lipcli.certify(model, radii=..., ...)``: the Python twin of ``lip certify`` (:mod:`~lipcli.certify.api`)
callable_package(__name__, "api", "run")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    if name in ("api", "attack", "data", "driver", "exact", "options", "plot", "results", "steps"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
