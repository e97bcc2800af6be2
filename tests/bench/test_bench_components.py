"""``lip bench train`` with component lists (``--conv a,b``, ``--activation``, several
``--pool``/``--head``): list parsing, the variants, the JSON report, a plugin's component
benched without editing lipcli, the table, and bad input.  No timing assertions."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from lipcli.bench.compare import component_variants, variant_label
from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.hookspecs import hookimpl
from lipcli.host.plugins import register_plugin, split_component_choices, unregister_plugin
from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec

TINY = ["--archs", "5", "--width", "4", "--batch-size", "4", "--steps", "2", "--warmup", "1",
        "--device", "cpu", "--threads", "1", "--quiet"]


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_split_component_choices_keeps_inline_parameters():
    assert split_component_choices("soc-fast,soc") == ["soc-fast", "soc"]
    assert split_component_choices("soc-fast:train_terms=4,eval_terms=8,soc , cayley") == [
        "soc-fast:train_terms=4,eval_terms=8", "soc", "cayley"]
    for bad in ("a,,b", "vertices=3,polygon", ",a", "a,", "max,radius=1"):
        with pytest.raises(LipUsageError):
            split_component_choices(bad)


def test_component_variants_product_and_labels():
    variants = component_variants({"conv": ["a", "b", "a"], "activation": ["x", "y"], "pool": ["max"]})
    assert [(v["conv"], v["activation"]) for v in variants] == [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]
    assert all(v["pool"] == "max" for v in variants)
    assert variant_label(variants[1], ["conv", "activation"]) == "a + y"
    assert variant_label({"conv": "a"}, []) == "a"
    with pytest.raises(LipUsageError):
        component_variants({"conv": []})


def _run(args):
    result = CliRunner().invoke(app, ["bench", "train", *args])
    assert result.exit_code == 0, result.output
    return result


def test_conv_list_json_report():
    report = json.loads(_run([*TINY, "--conv", "soc-fast,soc", "--json"]).stdout)
    assert report["benchmark"] == "train-components"
    assert report["settings"]["choices"] == {
        "conv": ["soc-fast", "soc"], "activation": ["maxmin"], "pool": ["max"], "head": ["lln"]}
    (res,) = report["results"]
    assert res["arch"] == "lipconvnet-5" and res["reference"] == "soc-fast" and res["varying"] == ["conv"]
    first, second = res["variants"]
    assert first["components"] == {"conv": "soc-fast", "activation": "maxmin", "pool": "max", "head": "lln"}
    assert second["label"] == "soc"
    assert first["relative_to_reference"] == 1.0 == first["relative_to_reference_paired"]
    for row in res["variants"]:
        assert len(row["step_times_s"]) == 2 and all(t > 0 for t in row["step_times_s"])
        assert row["images_per_s"] == pytest.approx(4 / row["median_step_s"])
        assert row["relative_to_reference"] == pytest.approx(row["median_step_s"] / first["median_step_s"])
        assert row["parameters"] > 0 and math.isfinite(row["first_step_loss"])
        assert row["memory"]["saved_activations_mib"] > 0
    # same seed and the same parameters: the two SOC variants start from the same weights
    assert first["first_step_loss"] == pytest.approx(second["first_step_loss"], rel=1e-5)


class _Swap(nn.Module):
    """Swaps the two channel halves: a permutation, 1-Lipschitz."""

    def forward(self, z):
        h = z.shape[1] // 2
        return torch.cat((z[:, h:], z[:, :h]), 1)


class _SwapPlugin:
    @hookimpl
    def lip_activations(self):
        return [ActivationSpec(name="test-swap", factory=lambda channels: _Swap(),
                               description="swap halves", promises=(ONE_LIPSCHITZ,))]


def test_a_plugin_component_is_benched_without_editing_lipcli():
    register_plugin(_SwapPlugin(), "test-swap-plugin")
    try:
        out = _run([*TINY, "--activation", "maxmin,test-swap", "--pool", "max", "--no-memory"])
    finally:
        unregister_plugin("test-swap-plugin")
    text = out.stdout
    assert "lipconvnet-5" in text and "test-swap" in text and "relative" in text
    assert "1.00x" in text  # the reference row


def test_several_pools_switch_to_the_comparison():
    report = json.loads(_run([*TINY, "--pool", "max,projection", "--no-memory", "--json"]).stdout)
    assert report["benchmark"] == "train-components"
    assert [v["label"] for v in report["results"][0]["variants"]] == ["max", "projection"]


@pytest.mark.parametrize("args", [
    ["--conv", "soc-fast,nope"], ["--activation", "maxmin,"], ["--pool", "max,radius=1"],
    ["--conv", "soc-fast:bogus=1"],
])
def test_bad_lists_exit_2_with_one_line(args):
    result = CliRunner().invoke(app, ["bench", "train", *TINY, *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
