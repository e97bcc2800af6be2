"""The comparison study's network, head, loss and recipe: sizes and parameter counts as the
study's, the layout, every installed convolution builds and is bounded, the offset loss equals
the study's formula, the recipe resolves, and ``lip train --recipe layers-compared`` runs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lipcli.sdk.losses import LossContext
from lipcli.testing import (check_recipe, create_model, guaranteed_upper_bound, plugin_registry,
                            run_lip)
from lipcli_compared.loss import OffsetCrossEntropy
from lipcli_compared.plugin import lip_recipes


def _model(conv: str, size: str = "xs", **params):
    torch.manual_seed(0)
    return create_model(f"convnet-{size}", conv=conv, head="first-channels", num_classes=10,
                        registry=plugin_registry(autoload=True), **params)


def test_parameter_counts_are_the_studys():
    """Table 5-7 of the study: 1.57M (XS) and 6.28M (S) parameters with k^2 c^2 per convolution
    (CPL's filter is c x c x 3 x 3, as the study's standard count)."""
    for size, millions in (("xs", 1.57), ("s", 6.28)):
        model = _model("cpl", size)
        weights = sum(p.numel() for n, p in model.named_parameters() if n.endswith(".kernel"))
        assert abs(weights / 1e6 - millions) < 0.01, (size, weights)


def test_layout_and_bound_for_every_installed_convolution():
    registry = plugin_registry(autoload=True)
    convs = sorted(registry.names("conv")) if hasattr(registry, "names") else ["cpl", "sandwich", "aol"]
    for conv in convs:
        model = _model(conv, width=4)
        names = [n for n, _ in model.body.named_children()]
        assert names[:4] == ["normalize", "pad", "conv0", "act0"] and names[-2:] == ["dense", "flatten"]
        assert sum(n.startswith("b1c") for n in names) == 5 and "b5shuffle" in names
        model.eval()
        with torch.no_grad():
            x = torch.rand(2, 3, 32, 32)
            assert model(x).shape == (2, 10) and model.features(x).shape == (2, 128)
        bound, _rows = guaranteed_upper_bound(model)
        assert 0.99 < bound < 1.01, (conv, bound)  # centred inputs (std 1), every layer ~1


def test_offset_loss_is_the_studys_formula():
    ctx = LossContext(model=torch.nn.Identity(), num_classes=5, dataset="x", mean=(0.0,), std=(0.2,))
    loss = OffsetCrossEntropy(ctx)
    logits, labels = torch.randn(7, 5), torch.randint(0, 5, (7,))
    shifted = logits.scatter_add(1, labels[:, None], torch.full((7, 1), -0.3993))
    expected = F.cross_entropy(shifted / 0.25, labels) * 0.25
    torch.testing.assert_close(loss.objective(logits, labels), expected)
    assert math.isclose(2 * math.sqrt(2) * 36 / 255, 0.3993, abs_tol=1e-4)


def test_recipe_resolves():
    (recipe,) = lip_recipes()
    assert recipe.name == "layers-compared"
    check_recipe(recipe)


def test_train_with_the_recipe_any_conv(tmp_path):
    out = tmp_path / "m.safetensors"
    result = run_lip(["train", "--recipe", "layers-compared", "--conv", "sandwich", "--dataset", "digits",
                      "--width", "4", "--epochs", "1", "--batch-size", "32", "--limit-train", "64",
                      "--limit-test", "32", "--no-lipschitz-estimate", "-q", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    cert = run_lip(["certify", str(out), "--radii", "36", "--json", "--attack"])
    assert cert.exit_code == 0, cert.stderr
