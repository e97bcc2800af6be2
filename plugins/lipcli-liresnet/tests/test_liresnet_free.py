"""``--arch liresnet:layers=free``: the free layers (:class:`lipcli_liresnet.free_conv.FreeConv`,
tested in lipcli's tests/sdk/test_free_conv.py) replace exactly the stem, neck and dense
convolutions, and the training estimate counts them by their guaranteed bounds."""

from __future__ import annotations

import torch

from lipcli_liresnet.free_conv import FreeConv


def _network(**options):
    from lipcli.testing import create_model

    return create_model("liresnet", depth=2, width=4, dense=1, dense_width=16, neck="patch", features="act",
                        num_classes=10, **options)


def test_layers_free_replaces_exactly_the_conv_layers():
    torch.manual_seed(0)
    default, free = _network(), _network(layers="free", stem_kernel=5)
    names = dict(default.body.named_children())
    frees = {n for n, m in free.body.named_children() if isinstance(m, FreeConv)}
    assert frees == {"stem_conv", "neck_conv", "neck_dense", "dense1"}
    assert list(names) == [n for n, _ in free.body.named_children()]
    assert not any(isinstance(m, FreeConv) for m in default.modules())
    assert free.body.stem_conv.weight.shape == (4, 3, 5, 5) and free.body.stem_conv.stride == 2
    # the training estimate counts a free layer by its guaranteed bound
    with torch.no_grad():
        free.body.dense1.weight.mul_(10.0)
    free.eval()
    est = float(free.lipschitz_training_estimate().detach())
    assert est >= free.body.dense1.lipschitz_upper_bound() * free.body.stem_conv.lipschitz_upper_bound() * 0.99
