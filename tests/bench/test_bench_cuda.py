"""``lip bench train`` on CUDA (``cuda`` marker): CUDA graphs for both models and the
convolution-kernel floor beside the step time."""

from __future__ import annotations

import pytest

from lipcli.bench import bench_train


@pytest.mark.cuda
def test_bench_train_graphs_and_conv_kernel_floor_on_cuda():
    report = bench_train(["lipconvnet-5"], batch_size=64, steps=3, warmup=3, device="cuda",
                         width=16, measure_memory=False, cuda_graphs=True, floor=True)
    r = report.results[0]
    for model in (r.fast, r.exact):
        graphs = model.cuda_graphs
        assert graphs.captured and graphs.replays >= 3 and graphs.reason is None, graphs
        fl = model.kernel_floor
        assert 0 < fl.conv_kernel_ms_per_step < fl.gpu_kernel_ms_per_step, fl
        assert fl.step_over_conv_kernel > 1.0
    data = report.to_json()["results"][0]["fast"]  # the JSON keeps the flat keys
    assert list(data)[:2] == ["conv", "step_times_s"] and "kernel_floor" in data
