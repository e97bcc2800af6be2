"""lipcli._util.records: typed results -> the JSON the commands print (keys in field order,
omitted ``None`` fields, inline parts)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lipcli._util.records import INLINE, JsonRecord, to_json


@dataclass
class _Part(JsonRecord):
    b: int
    c: list[int]


@dataclass
class _Row(JsonRecord):
    JSON_OMIT_NONE = ("maybe",)

    a: str
    part: _Part | None = field(default=None, metadata=INLINE)
    kept: float | None = None
    maybe: int | None = None


def test_inline_part_keys_stand_at_the_fields_place_and_none_leaves_nothing():
    row = _Row(a="x", part=_Part(b=1, c=[2, 3]), kept=None, maybe=4)
    assert json.dumps(row.to_json()) == '{"a": "x", "b": 1, "c": [2, 3], "kept": null, "maybe": 4}'
    bare = _Row(a="y")
    assert list(bare.to_json()) == ["a", "kept"]  # no part, maybe omitted, kept is null
    assert to_json([bare, {"k": (row,)}])[1]["k"][0]["b"] == 1


def test_bench_environment_puts_its_cuda_part_where_the_dict_had_it():
    from lipcli.bench.reports import Environment, GpuEnvironment

    env = Environment(device="cuda:0", device_name="G", torch="2", python="3", lipcli="0",
                      platform="p", cpu_count=2, torch_threads=1, torch_interop_threads=1,
                      timestamp="t", load_average_1m_5m_15m=None,
                      gpu=GpuEnvironment(cuda="12", cudnn=None, cudnn_benchmark=False,
                                         fp32_precision=["tf32", "ieee"], gpu_memory_gib=80.0))
    keys = list(env.to_json())
    assert keys[-6:] == ["load_average_1m_5m_15m", "cuda", "cudnn", "cudnn_benchmark",
                         "fp32_precision", "gpu_memory_gib"]
    assert env.to_json()["cudnn"] is None and env.to_json()["load_average_1m_5m_15m"] is None
    env.load_average_after = [0.5, 0.5, 0.5]
    assert list(env.to_json())[-1] == "load_average_after"


def test_bench_graph_use_is_the_host_summary_or_the_reason():
    from lipcli.bench.reports import GraphUse

    summary = {"captured": True, "replays": 5, "eager_steps": 3, "reason": None}
    assert json.dumps(GraphUse.of(summary).to_json()) == json.dumps(summary)  # same keys, order
    assert GraphUse(captured=False, reason="off").to_json() == {"captured": False, "reason": "off"}
