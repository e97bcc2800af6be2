"""The margin certificate counts a head that promises ``"1-lipschitz"`` (without a
``lipschitz_upper_bound()``) as 1: ``lip certify`` measures that promise with the trained
parameters first and refuses a head whose learnable scale broke it."""

from __future__ import annotations

import json
import types

import pytest
import torch
from torch import nn

import lipcli_ortho_head.plugin as ortho_plugin
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ONE_LIPSCHITZ, HeadSpec
from lipcli.testing import create_model, registered, run_lip, save_model

DIGITS = {"name": "digits", "params": {}, "num_classes": 10}


class PaddedHead(nn.Module):
    """The features padded with zeros (or cut) to ``num_classes`` logits, times a learnable
    ``scale``: 1-Lipschitz only while ``|scale| <= 1``."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        pad = max(0, self.num_classes - y.shape[1])
        return nn.functional.pad(y, (0, pad))[:, : self.num_classes] * self.scale


@pytest.fixture
def scaled_head_plugin():
    module = types.ModuleType("scaled_head_plugin")
    module.lip_heads = hookimpl(lambda: [HeadSpec(
        name="scaledhead", factory=PaddedHead, promises=(ONE_LIPSCHITZ,), certificate="margin",
        description="padded features times a learnable scale (a FALSE promise)")])
    module.lip_heads.__name__ = "lip_heads"
    with registered(("ortho", ortho_plugin), ("scaledhead", module)):
        yield


@pytest.mark.parametrize("scale", [1.5, 0.5])
def test_certify_measures_a_promised_head(scaled_head_plugin, tmp_path, scale):
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4, pool="projection", head="scaledhead")
    model.refresh_power_iteration(10)
    with torch.no_grad():
        model.head.scale.fill_(scale)
    path = tmp_path / "m.safetensors"
    save_model(model, path, dataset=DIGITS)
    r = run_lip(["certify", str(path), "--no-write", "--limit", "16", "--json"])
    if scale < 1:  # a kept promise: certified, and the head is among the measured layers
        assert r.exit_code == 0, r.output
        rows = {row["layer"]: row for row in json.loads(r.stdout)["promises"]["layers"]}
        assert 0.49 < rows["head"]["max_ratio"] <= 0.5 + 1e-9
        return
    assert r.exit_code == 1, r.output
    line = r.stderr.strip()
    assert line.startswith("error: plugin scaledhead (distribution (in-process)) breaks its "
                           "1-Lipschitz promise (measured 1.5"), line
    assert "head 'scaledhead' at layer 'head'" in line and r.stdout == ""
