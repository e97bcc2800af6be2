"""The JSON of every ``lip bench`` report, pinned: ``report.to_json()`` of one report of each
kind (every optional part present, and a CPU profile without them) must give exactly the
keys, order and values of ``reports_expected.json``, which was written by the report module
before it was split per command (commit 2f88262); ``--json`` and ``--output`` print this."""

from __future__ import annotations

import json
from pathlib import Path

import lipcli.bench.reports as R

EXPECTED = Path(__file__).with_name("reports_expected.json")


def build_reports(R):
    """One of each ``lip bench`` report, every optional part present (and one without)."""
    env = R.Environment(device="cuda:0", device_name="G", torch="2", python="3", lipcli="0",
                        platform="p", cpu_count=2, torch_threads=1, torch_interop_threads=1,
                        timestamp="t", load_average_1m_5m_15m=[1.0, 1.0, 1.0],
                        gpu=R.GpuEnvironment(cuda="12", cudnn=9, cudnn_benchmark=True,
                                             fp32_precision=["tf32", "ieee"], gpu_memory_gib=80.0),
                        load_average_after=[0.5, 0.5, 0.5])
    cpu_env = R.Environment(device="cpu", device_name="C", torch="2", python="3", lipcli="0",
                            platform="p", cpu_count=2, torch_threads=1, torch_interop_threads=1,
                            timestamp="t", load_average_1m_5m_15m=None)
    step = R.StepSettings(input_shape=[3, 32, 32], epoch_images=50000, steps_per_epoch=391,
                          optimizer="o", step="s", epoch_time="e", inputs="i")
    times = R.StepTimes(step_times_s=[0.1], median_step_s=0.1, min_step_s=0.1, max_step_s=0.1,
                        iqr_step_s=0.0, images_per_s=10.0, epoch_s=39.1)
    memory = R.StepMemory(method="m", peak_step_mib=1.0, peak_total_mib=2.0,
                          saved_activations_mib=0.5, saved_tensors=3)
    graphs = R.GraphUse.of({"captured": True, "replays": 5, "eager_steps": 3, "reason": None})
    floor = R.KernelFloor(conv_kernel_ms_per_step=1.0, gpu_kernel_ms_per_step=2.0,
                          profiled_step_ms=3.0, profiled_steps=4, step_over_conv_kernel=3.0)
    fast = R.ModelTiming(conv="soc-fast", times=times, cuda_graphs=graphs, kernel_floor=floor,
                         memory=memory)
    exact = R.ModelTiming(conv="soc", times=times, cuda_graphs=R.GraphUse(captured=False, reason="off"))
    train = R.TrainBenchReport(
        environment=env,
        settings=R.TrainBenchSettings(batch_size=128, steps=5, warmup=2, width=32, head="lln",
                                      pool="max", num_classes=10, seed=0, fast_conv="soc-fast",
                                      exact_conv="soc", schedule="s", cuda_graphs=True,
                                      kernel_floor=None, step=step),
        results=[R.Table1Row(arch="lipconvnet-5", soc_layers=6, parameters=7,
                             initial_state_identical=True,
                             first_step_loss=R.FastExact(fast=2.3, exact=2.3),
                             first_step_loss_abs_diff=0.0,
                             final_loss=R.FastExact(fast=2.2, exact=2.2), fast=fast, exact=exact,
                             reduction_pct=10.0, reduction_pct_paired=11.0)])
    row = R.VariantRow(label="a", components={"conv": "soc"}, parameters=7, times=times,
                       relative_to_reference=1.0, relative_to_reference_paired=1.0,
                       first_step_loss=2.3, final_loss=2.2, memory=memory)
    components = R.ComponentBenchReport(
        environment=cpu_env,
        settings=R.ComponentBenchSettings(batch_size=128, steps=5, warmup=2, width=32,
                                          num_classes=10, seed=0, choices={"conv": ["soc"]},
                                          schedule="s", step=step),
        results=[R.VariantsResult(arch="lipconvnet-5", reference="a", varying=["conv"],
                                  variants=[row])])
    q = R.Quantiles(min=0.0, median=1.0, max=2.0)
    certify = R.CertifyBenchReport(
        environment=cpu_env,
        settings=R.CertifyBenchSettings(arch="lipconvnet-5", conv="soc", pool="max", head="lln",
                                        num_classes=10, input_shape=[3, 32, 32], n=8,
                                        batch_size=4, top_k=None, weights="w", inputs="i",
                                        fit_head=R.HeadFit(max_steps=5, steps_taken=3,
                                                           target_loss=0.1, final_loss=0.2,
                                                           teacher_agreement=0.9)),
        parameters=7, power_refresh_s=0.1, power_refresh_steps=50,
        features=R.FeatureTiming(seconds=0.1, inputs_per_s=80.0, feature_dim=10, mode="m"),
        lipschitz=R.LipschitzTiming(upper_bound=1.0, upper_bound_s=0.1, estimate=None,
                                    estimate_s=0.0, estimate_iters=0, report_total_s=0.1),
        certificates=[R.CertificateTiming(method="lln", top_k=None, exact_classes=True,
                                          prepare_s=0.0, certify_s=0.1, inputs_per_s=None,
                                          feature_radius=q, input_radius=q, nonzero_fraction=1.0,
                                          notes=["n"], stats={"k": 1})],
        notes=[])
    profile = R.ProfileReport(
        environment=env,
        settings=R.ProfileSettings(arch="lipconvnet-5", conv="soc", head="lln", pool="max",
                                   width=32, batch_size=128, steps=5, warmup=2, num_classes=10,
                                   input_shape=[3, 32, 32], time_basis="t", convolution_rule="r"),
        step_ms_unprofiled_median=1.0, step_ms_profiled=2.0,
        categories=[R.CategoryTime(category="c", label="l", ms_per_step=1.0, share_pct=50.0)],
        convolution_share_pct=50.0, convolution_share_of_operators_pct=None,
        top_operators=[R.OperatorTime(op="aten::x", category="c", ms_per_step=1.0, share_pct=5.0)],
        backward_non_convolution_by_node=[R.NodeTime(node="n", ms_per_step=1.0, share_pct=1.0)],
        gpu=R.GpuProfile(gpu_busy_ms_per_step=1.0, gpu_idle_ms_per_step=0.5,
                         cpu_operator_ms_per_step=0.2, device_events_ms_per_step=0.1,
                         kernels_without_launch_record=[R.KernelTime(kernel="k", ms_per_step=0.1,
                                                                     category="c")]))
    profile_cpu = R.ProfileReport(
        environment=cpu_env, settings=profile.settings, step_ms_unprofiled_median=1.0,
        step_ms_profiled=2.0, categories=[], convolution_share_pct=50.0,
        convolution_share_of_operators_pct=60.0, top_operators=[],
        backward_non_convolution_by_node=[])
    profile_cpu.check_target(40.0)
    return {"train": train, "components": components, "certify": certify, "profile": profile,
            "profile_cpu": profile_cpu}


def test_every_report_gives_the_pinned_json_keys_order_and_values():
    got = {name: report.to_json() for name, report in build_reports(R).items()}
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    assert list(got) == list(expected)
    for name in expected:  # the same text, keys in the same order
        assert json.dumps(got[name]) == json.dumps(expected[name]), name


def test_graph_use_without_a_graph_has_no_step_counts():
    assert list(R.GraphUse(captured=False, reason="off").to_json()) == ["captured", "reason"]
    assert list(R.GraphUse(captured=False).to_json()) == ["captured", "reason"]
