"""``liresnet:layers=cholesky`` is the authors' trained network: their checkpoints
(``tools/make_import_fixtures_liresnet.py``, their code at 0c0611a run unmodified) loaded
parameter by parameter, nothing folded (the stem's filter and bias, the residual blocks' ``W``,
``γ``, bias and running mean, the neck's ``kernel`` and ``weight`` before Cholesky, each dense
layer's ``W`` and ``γ`` of ``X = I + (W ⊙ γ)·n^-1/2``), give their evaluation logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lipcli.sdk.checkpoints import read_checkpoint
from lipcli.testing import create_model, guaranteed_upper_bound

DATA = Path(__file__).with_name("data")
CASES = ["liresnet_cifar10_d2_w4", "liresnet_cifar100_d3_w6"]


def _unfolded(case: str) -> tuple[torch.nn.Module, dict]:
    record = json.loads((DATA / f"{case}.logits.json").read_text())
    tensors = {k.removeprefix("backbone.").removeprefix("module."): v
               for k, v in read_checkpoint(DATA / f"{case}.pth").tensors.items()}
    d, w = tensors["conv.weights"].shape[:2]
    n, D = tensors["linear.weights"].shape[:2]
    K = tensors["head.bias"].shape[0]
    centred = "conv.running_mean" in tensors
    model = create_model("liresnet", depth=d, width=w, dense=n, dense_width=D, num_classes=K, head="lln",
                         gamma=True, depth_scale=True, centering=centred, stem_kernel=5, neck="patch",
                         features="act", layers="cholesky", mean=(0.5,) * 3, std=(1.0,) * 3)
    state = model.state_dict()
    state.update({"body.stem_conv.weight": tensors["stem.0.weight"], "body.stem_conv.bias": tensors["stem.0.bias"],
                  "body.neck_conv.weight": tensors["neck.kernel"], "body.neck_dense.weight": tensors["neck.weight"],
                  "body.neck_dense.bias": tensors["neck.bias"],
                  "head.weight": tensors["head.weight"], "head.bias": tensors["head.bias"]})
    for i in range(d):
        b = f"body.block{i + 1}_res."
        state.update({b + "weight": tensors["conv.weights"][i], b + "bias": tensors["conv.bias"][i],
                      b + "gamma": tensors["conv.gamma"][i].reshape(w)})
        if centred:
            state[b + "running_mean"] = tensors["conv.running_mean"][i]
    for j in range(n):
        b = f"body.dense{j + 1}."
        state.update({b + "weight": tensors["linear.weights"][j], b + "gamma": tensors["linear.gamma"][j],
                      b + "bias": tensors["linear.bias"][j]})
    model.load_state_dict(state)
    return model.eval(), record


@pytest.mark.parametrize("case", CASES)
def test_the_authors_parameters_unfolded_give_their_logits(case):
    model, record = _unfolded(case)
    x = torch.rand(*record["inputs"], generator=torch.Generator().manual_seed(record["input_seed"]))
    expected = torch.tensor(record["logits"])
    with torch.no_grad():
        logits = model(x)
    assert float((logits - expected).abs().max()) < 1e-6 * max(1.0, float(expected.abs().max()))
    # the authors' evaluation estimate (500 power steps on the stem and each block, SVDs of the
    # Cholesky matrices; their input shift has std 1) is below lipcli's guaranteed bound
    assert record["source_lipschitz"] <= guaranteed_upper_bound(model)[0]
