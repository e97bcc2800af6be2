"""The ``lip bench profile`` report's tables: category shares, top operators, backward nodes
and the GPU summary, built from the profiler's sums (:func:`lipcli.bench.profile._sum_events`)."""

from __future__ import annotations

from typing import Any

from lipcli.bench.reports import CategoryTime, GpuProfile, KernelTime, NodeTime, OperatorTime

CATEGORY_LABELS: dict[str, str] = {
    "convolution": "convolution (forward, input and weight gradients)",
    "conv_power": "conv layers: power iteration / σ (mm, mv, norm)",
    "conv_other": "conv layers: other forward (skew, series adds, unshuffle, pad, copies)",
    "activation": "activations (MaxMin) forward",
    "pool": "pooling forward",
    "head": "head forward",
    "normalize": "input normalisation forward",
    "other_forward": "other forward (flatten, glue)",
    "loss": "loss (cross-entropy) forward",
    "backward": "backward, non-convolution",
    "optimizer": "optimizer (zero_grad, clipping, SGD step)",
    "unlabelled": "operators outside the labelled phases",
    "untracked": "time outside profiled operators (Python, launch gaps)",
    "unattributed_kernels": "device kernels without a recorded launch, not named as convolutions",
}

#: what the shares are of, by whether the device's kernel times are used
TIME_BASIS = {True: "CUDA kernel time, each kernel once via the operator that launched it",
              False: "operator self CPU time; shares are of profiled wall time"}
#: how ``lip bench profile`` decides what is convolution (reported with its settings)
CONVOLUTION_RULE = (
    "an operator counts as convolution when it or an operator it was called "
    "from is a convolution op (aten:: conv2d, convolution, "
    "convolution_backward, mkldnn/cudnn/slow conv; mkldnn:: fused "
    "convolution-plus-add) or lies inside a SOC layer's "
    "'lipcli::soc_convolution' range (its convolutions, including the Horner "
    "add fused into them and 1x1 convolutions on 1x1 images computed as "
    "matrix products)"
)


def _top_kernels(unlinked: dict[tuple[str, str], list[float]], steps: int, top_ops: int) -> list[KernelTime]:
    """The ``top_ops`` longest kernels without a launch record, per step."""
    return [KernelTime(kernel=name, ms_per_step=us / 1e3 / steps, category=cat)
            for (name, cat), (us,) in sorted(unlinked.items(), key=lambda kv: -kv[1][0])[:top_ops]]


def profile_breakdown(sums: tuple[Any, ...], wall_us: float, steps: int, top_ops: int,
                      use_device: bool) -> dict[str, Any]:
    """The :class:`~lipcli.bench.reports.ProfileReport` fields computed from the profiler's
    ``sums`` (``cpu_us, dev_us, per_op, per_node, unlinked, device_events_us``) over
    ``steps`` profiled steps of ``wall_us`` microseconds: shares of the device's kernel time
    when ``use_device``, else of the profiled wall time."""
    cpu_us, dev_us, per_op, per_node, unlinked, device_events_us = sums
    times_us = dev_us if use_device else cpu_us
    tracked = sum(times_us.values())
    if not use_device:
        times_us["untracked"] = max(0.0, wall_us - tracked)
    denom = wall_us if not use_device else tracked
    if denom <= 0:
        raise RuntimeError("the profiler recorded no time")
    rows = [
        CategoryTime(category=k, label=CATEGORY_LABELS[k], ms_per_step=v / 1e3 / steps,
                     share_pct=100.0 * v / denom)
        for k, v in times_us.items() if v > 0
    ]
    rows.sort(key=lambda r: -r.ms_per_step)
    conv_share = 100.0 * times_us["convolution"] / denom
    ops = sorted(per_op.items(), key=lambda kv: -(kv[1][1] if use_device else kv[1][0]))
    top = [
        OperatorTime(op=name, category=cat, ms_per_step=(d if use_device else c) / 1e3 / steps,
                     share_pct=100.0 * (d if use_device else c) / denom)
        for (name, cat), (c, d) in ops[:top_ops]
    ]
    nodes = sorted(per_node.items(), key=lambda kv: -(kv[1][1] if use_device else kv[1][0]))
    backward_nodes = [
        NodeTime(node=name, ms_per_step=(d if use_device else c) / 1e3 / steps,
                 share_pct=100.0 * (d if use_device else c) / denom)
        for name, (c, d) in nodes[:top_ops]
    ]
    gpu = None
    if use_device:
        gpu = GpuProfile(
            gpu_busy_ms_per_step=tracked / 1e3 / steps,
            gpu_idle_ms_per_step=max(0.0, wall_us - tracked) / 1e3 / steps,
            cpu_operator_ms_per_step=sum(cpu_us.values()) / 1e3 / steps,
            device_events_ms_per_step=device_events_us / 1e3 / steps,
            kernels_without_launch_record=_top_kernels(unlinked, steps, top_ops),
        )
    return dict(
        step_ms_profiled=wall_us / 1e3 / steps,
        categories=rows,
        convolution_share_pct=conv_share,
        convolution_share_of_operators_pct=100.0 * times_us["convolution"] / tracked
        if tracked > 0 else None,
        top_operators=top,
        backward_non_convolution_by_node=backward_nodes,
        gpu=gpu,
    )
