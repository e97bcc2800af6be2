"""Every registered component's parameters (built-ins and every installed distribution,
derived from the registry as ``tests/plugin_tables.py`` does): each numeric one declares a
range, its edges are accepted and one step beyond is refused with one line naming the
setting and its range -- from the command line (``--conv NAME:key=value``, parsed by the
registry) and from a forged model file (its config rewritten, then loaded)."""

from __future__ import annotations

import math

import pytest

from lipcli.host.modelfile import read_metadata, update_metadata
from lipcli.host.models import COMPONENT_KINDS, resolve_components
from lipcli.sdk.errors import LipUsageError, ModelFileError
from lipcli.sdk.specs import Param
from lipcli.testing import (
    RangeEdge,
    check_param_ranges,
    create_model,
    load_model,
    plugin_registry,
    range_edges,
    run_lip,
    save_model,
)
from lipcli.testing.ranges import check_refusal

REGISTRY = plugin_registry(autoload=True)
KINDS = ("arch", "conv", "activation", "pool", "head", "certificate", "loss", "dataset")
SPECS = {(kind, name): REGISTRY.provided(kind, name).spec for kind in KINDS for name in REGISTRY.names(kind)}
EDGES = [(kind, name, edge) for (kind, name), spec in SPECS.items()
         for param in spec.params for edge in range_edges(param)]


def edge_id(case: tuple[str, str, RangeEdge]) -> str:
    kind, name, edge = case
    return f"{kind}-{name}-{edge.param.name}={edge.text}"


@pytest.mark.parametrize("kind,name", list(SPECS), ids=[f"{k}-{n}" for k, n in SPECS])
def test_every_numeric_parameter_declares_a_range_that_holds(kind, name):
    tried = check_param_ranges(SPECS[kind, name], require=True)
    numeric = [p for p in SPECS[kind, name].params if p.type in (int, float) and p.choices is None]
    assert {e.param.name for e in tried} == {p.name for p in numeric}


def test_the_components_the_issue_names_are_bounded():
    """The red team's values are refused (LOT's iterations, SLL's kernel, BRO's rank)."""
    names = {n for k, n in SPECS if k == "conv"}
    cases = [c for c in ("lot:iterations=100000", "sll:kernel=-3", "sll:kernel=4", "bro:rank=1000000",
                         "soc-fast:eval_terms=1000") if c.partition(":")[0] in names]
    assert "soc-fast:eval_terms=1000" in cases
    for choice in cases:
        with pytest.raises(LipUsageError, match="must be"):
            REGISTRY.component("conv", choice)


def check_each(cases: list[tuple[str, str, RangeEdge]], check) -> None:
    """``check(case)`` for every case (one collected test instead of hundreds: the per-test
    overhead dominated these millisecond checks); every failing case is reported by its
    id (``kind-name-param=value``) with its message."""
    failures = []
    for case in cases:
        try:
            check(case)
        except (Exception, pytest.fail.Exception) as exc:
            failures.append(f"{edge_id(case)}: {type(exc).__name__}: {exc}")
    assert not failures, f"{len(failures)} of {len(cases)} edges failed:\n" + "\n".join(failures)


def test_edges_from_the_command_line():
    def check(case):
        kind, name, edge = case
        choice = f"{name}:{edge.param.name}={edge.text}"
        if edge.accepted:
            assert REGISTRY.component(kind, choice).params[edge.param.name] == edge.value
            return
        with pytest.raises(LipUsageError) as info:
            REGISTRY.component(kind, choice)
        check_refusal(f"{kind} {name!r}", edge, info.value)
        assert str(info.value).startswith(f"{kind} {name!r}")

    assert len(EDGES) > 100  # every registered component's edges (hundreds)
    check_each(EDGES, check)


@pytest.fixture(scope="module")
def tiny_model_file(tmp_path_factory):
    model = create_model("lipconvnet-5:width=4", num_classes=2, registry=REGISTRY)
    return save_model(model, tmp_path_factory.mktemp("ranges") / "tiny.safetensors")


def forged(src, dst, kind: str, name: str, params: dict) -> dict:
    """``src``'s model file copied to ``dst`` with component ``kind`` set to ``name:params``."""
    dst.write_bytes(src.read_bytes())
    config = read_metadata(dst)["config"]
    config[kind] = {"name": name, "params": params}
    update_metadata(dst, {"config": config})
    return config


MODEL_EDGES = [c for c in EDGES if c[0] in COMPONENT_KINDS and math.isfinite(c[2].value)]


def test_edges_from_a_forged_model_file(tiny_model_file, tmp_path):
    def check(case):
        kind, name, edge = case
        path = tmp_path / f"{edge_id(case)}.safetensors"
        config = forged(tiny_model_file, path, kind, name, {edge.param.name: edge.value})
        if edge.accepted:  # the loader's resolution takes it (building may fail on the tensors)
            resolved = resolve_components(config, REGISTRY)
            assert resolved[kind].params[edge.param.name] == edge.value
            try:
                load_model(path, registry=REGISTRY)
            except ModelFileError as exc:
                assert edge.param.range_text() not in str(exc)
            return
        with pytest.raises(ModelFileError) as info:
            load_model(path, registry=REGISTRY)
        check_refusal(f"{kind} {name!r} in a model file", edge, info.value)
        assert str(path) in str(info.value)

    assert len(MODEL_EDGES) > 100
    check_each(MODEL_EDGES, check)


def test_a_forged_model_file_is_refused_in_one_line_by_lip(tiny_model_file, tmp_path):
    path = tmp_path / "forged.safetensors"
    forged(tiny_model_file, path, "conv", "soc-fast", {"eval_terms": 65})
    result = run_lip(["lipschitz", str(path)])
    assert result.exit_code == 1, result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "eval_terms must be in 2..64" in result.stderr


@pytest.mark.parametrize("args", [
    ["train", "--conv", "soc-fast:train_terms=65"],
    ["train", "--arch", "lipconvnet-5:width=257"],
    ["train", "--head", "mlp:hidden=0"],
])
def test_the_cli_refuses_before_any_work(args, tmp_path):
    result = run_lip([*args, "--out", str(tmp_path / "m.safetensors"), "--epochs", "1"])
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "must be in" in result.stderr
    assert not any(tmp_path.iterdir())


def test_a_param_declares_a_consistent_range():
    with pytest.raises(ValueError, match="must be in 1..8"):
        Param(name="steps", type=int, default=0, min=1, max=8)
    with pytest.raises(TypeError):
        Param(name="mode", type=str, default="a", min=1)
    with pytest.raises(ValueError, match="above max"):
        Param(name="steps", type=int, default=1, min=2, max=1)
    kernel = Param(name="kernel", type=int, default=0, min=1, max=7, odd=True, auto=0)
    assert kernel.range_text() == "an odd number in 1..7 (or 0)"
    assert [kernel.check(v) for v in (0, 1, 7)] == [0, 1, 7]
    for bad in (-1, 2, 9):
        with pytest.raises(ValueError, match="kernel must be an odd number in 1..7"):
            kernel.check(bad)
    ratio = Param(name="ratio", type=float, default=0.5, min=0.0, min_open=True, max=1.0)
    assert ratio.range_text() == "(0, 1]" and ratio.check(1) == 1.0
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        ratio.parse("0")


def test_the_kit_catches_a_range_that_does_not_hold():
    """A spec whose Param claims a range its check does not keep fails the kit."""

    class Loose(Param):
        def check(self, value):
            return value

    from lipcli.sdk.specs import ConvSpec

    spec = ConvSpec(name="loose", factory=lambda *a, **k: None, description="d",
                    params=(Loose(name="steps", type=int, default=1, min=1, max=4),))
    with pytest.raises(AssertionError, match="beyond 1..4 but accepted"):
        check_param_ranges(spec)
    bare = ConvSpec(name="bare", factory=lambda *a, **k: None, description="d",
                    params=(Param(name="steps", type=int, default=1),))
    assert check_param_ranges(bare) == []
    with pytest.raises(AssertionError, match="declares no range"):
        check_param_ranges(bare, require=True)


def test_a_rank_above_the_layer_channels_is_a_usage_error():
    """BRO's rank is within its declared range, but above a width-4 layer's channels."""
    if "bro" not in REGISTRY.names("conv"):
        pytest.skip("lipcli-bro is not installed")
    from lipcli.host.models import ComponentParameterError

    with pytest.raises(ComponentParameterError, match="rank must be at most the layer's channels"):
        create_model("lipconvnet-5:width=4", conv="bro:rank=64", registry=REGISTRY)
    assert create_model("lipconvnet-5:width=4", conv="bro:rank=4", registry=REGISTRY) is not None
