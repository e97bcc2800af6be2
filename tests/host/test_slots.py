"""Networks declare their slots: the layer kinds they take from the user (ArchSpec.slots).

A kind a network fixes itself is neither built, nor recorded in the model file, nor shown by
``lip info``; choosing it is a one-line usage error.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lipcli.host.models import create_model, load_model, save_model
from lipcli.host.plugins import get_registry
from lipcli.sdk.specs import LAYER_KINDS, ArchSpec

REG = get_registry()
#: a tiny LiResNet with the authors' layer types (free stem, Cholesky neck and dense layers)
CHOLESKY = "liresnet:depth=1,width=4,dense=1,dense_width=32,neck=patch,layers=cholesky,features=act"


def _built_kinds(model: torch.nn.Module) -> set[str]:
    """The kinds of the components that built the network's modules (lipcli stamps each)."""
    return {m.lip_component["kind"] for m in model.modules() if hasattr(m, "lip_component")}


def test_every_architecture_declares_layer_kinds_with_a_head():
    head = REG.component("head", "lln").spec
    for name in REG.names("arch"):
        spec = REG.get("arch", name)
        slots = spec.slots_for({p.name: p.default for p in spec.params}, head)
        assert set(slots) <= set(LAYER_KINDS) and "head" in slots, name


@pytest.mark.parametrize(("arch", "head", "slots"), [
    ("lipconvnet-5:width=4", "lln", ("conv", "activation", "pool", "head")),
    ("liresnet:depth=1,width=4,dense=1,dense_width=32", "lln", ("conv", "activation", "pool", "head")),
    ("liresnet:depth=1,width=4,dense=1,dense_width=32", "mlp", ("conv", "activation", "head")),
    (CHOLESKY, "lln", ("activation", "head")),
    ("sll-small:depth=1,dense=1,width=4,dense_hidden=8", "lln", ("conv", "head")),
])
def test_a_network_builds_and_records_exactly_its_slots(tmp_path, arch, head, slots):
    conv = "sll" if arch.startswith("sll") else "soc-fast"
    model = create_model(arch, conv=conv, head=head, pool="max", num_classes=10)
    assert tuple(k for k in LAYER_KINDS if k in model.lipcli_config) == slots
    assert _built_kinds(model) - {"arch"} <= set(slots)
    path = save_model(model, tmp_path / "m.safetensors")
    loaded, mf = load_model(path)
    assert tuple(k for k in LAYER_KINDS if k in mf.metadata["config"]) == slots
    x = torch.rand(2, 3, 32, 32)
    model.eval()
    assert torch.equal(loaded(x), model(x))


def test_a_file_that_records_a_kind_the_network_fixes_loads_to_the_same_network(tmp_path):
    """Older files recorded every kind (conv soc-fast, pool max for a cholesky LiResNet): the
    recorded choice is not built, the network and its logits are the same."""
    model = create_model(CHOLESKY, num_classes=10).eval()
    path = save_model(model, tmp_path / "new.safetensors")
    _, mf = load_model(path)
    config = dict(mf.metadata["config"])
    config["conv"] = {"name": "soc-fast", "params": {}, "provider": "lipcli.soc", "distribution": "lipcli"}
    config["pool"] = {"name": "max", "params": {}, "provider": "lipcli.pooling", "distribution": "lipcli"}
    model.lipcli_config = config
    old = save_model(model, tmp_path / "old.safetensors")
    loaded, _ = load_model(old)
    x = torch.rand(3, 3, 32, 32)
    assert torch.equal(loaded(x), model(x))
    assert _built_kinds(loaded) - {"arch"} <= {"activation", "head"}


def test_a_slot_declaration_without_a_head_is_a_spec_bug():
    with pytest.raises(TypeError, match="including head"):
        ArchSpec(name="no-head", description="", factory=lambda **_: None, slots=("conv",))
    spec = ArchSpec(name="late", description="", factory=lambda **_: None, slots=lambda params, head: ("pool",))
    with pytest.raises(TypeError, match="including head"):
        spec.slots_for({})


@pytest.mark.parametrize(("args", "text"), [
    (["--arch", CHOLESKY, "--pool", "max"], "--pool max: arch liresnet has no pool slot (it fixes its own pool; "
                                            "it takes activation, head)"),
    (["--arch", "sll-small", "--conv", "sll", "--activation", "maxmin"], "--activation maxmin: arch sll-small "
                                                                         "has no activation slot"),
])
def test_choosing_a_kind_the_network_fixes_is_one_usage_line(tmp_path, args, text):
    res = subprocess.run([sys.executable, "-m", "lipcli", "train", "--dataset", "digits", "--epochs", "1",
                          *args, "--out", str(tmp_path / "m.safetensors")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and text in res.stderr, res.stderr
    assert not (tmp_path / "m.safetensors").exists()
