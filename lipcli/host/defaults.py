"""The default component of each kind, written once (torch-free).

Read by :class:`~lipcli.train.config.TrainConfig` (``lip train``'s defaults and their help),
:func:`~lipcli.host.models.create_model`, ``lip bench`` and the conformance helpers of
:mod:`lipcli.testing`: the paper's CPU-friendly baseline LipConvnet-5 with SOC (fast filter
gradient), MaxMin, max pooling and the LLN head, trained on CIFAR-10.
"""

from __future__ import annotations

#: component kind -> the name used when none is chosen
DEFAULT_COMPONENTS: dict[str, str] = {
    "arch": "lipconvnet-5",
    "conv": "soc-fast",
    "activation": "maxmin",
    "pool": "max",
    "head": "lln",
    "dataset": "cifar10",
    "augmentation": "crop-flip",
}
#: the ``lip train`` settings that name a component, each of the kind of the same name
COMPONENT_SETTINGS: tuple[str, ...] = ("arch", "conv", "activation", "pool", "head", "dataset", "loss", "augmentation")
#: the layer kinds an architecture is assembled from (the keys ``create_model`` takes; declared
#: with the architecture's slots in the SDK)
from lipcli.sdk.specs import LAYER_KINDS  # noqa: E402,F401
