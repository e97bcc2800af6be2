"""``lip bench``: JSON structure, sanity of the measured numbers, identical starting weights
for the fast/exact comparison, profile classification and bad inputs.

No timing assertions: speed is measured by ``lip bench`` itself, never by tests.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from lipcli import bench
from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError

TINY = ["--width", "4", "--batch-size", "4", "--device", "cpu", "--quiet", "--json"]
ARCHS = [f"lipconvnet-{n}" for n in bench.DEFAULT_DEPTHS]


@pytest.fixture
def one_thread():
    """Benchmarks may set the thread count; run them with 1 thread and restore afterwards."""
    before = torch.get_num_threads()
    yield ["--threads", "1"]
    torch.set_num_threads(before)


def _run(args: list[str]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _check_env(env: dict) -> None:
    assert env["device"] == "cpu"
    assert env["torch"] == torch.__version__
    assert isinstance(env["torch_threads"], int) and env["torch_threads"] >= 1
    assert env["device_name"]


# ------------------------------------------------------------------------ lip bench train
def test_train_json_structure_and_identical_start(one_thread):
    report = _run(["bench", "train", "--archs", "5", "--steps", "2", "--warmup", "1",
                   *TINY, *one_thread])
    assert report["benchmark"] == "train"
    _check_env(report["environment"])
    assert report["environment"]["torch_threads"] == 1
    s = report["settings"]
    assert s["batch_size"] == 4 and s["steps"] == 2 and s["width"] == 4
    assert s["steps_per_epoch"] == math.ceil(50_000 / 4)
    (r,) = report["results"]
    assert r["arch"] == "lipconvnet-5" and r["soc_layers"] == 6
    assert r["initial_state_identical"] is True
    # identical weights and (SPEC §1.6) a bit-identical forward: the first losses agree
    lf, le = r["first_step_loss"]["fast"], r["first_step_loss"]["exact"]
    assert math.isfinite(lf) and abs(lf - le) <= 1e-6 * max(1.0, abs(lf))
    for key, conv in (("fast", "soc-fast"), ("exact", "soc")):
        m = r[key]
        assert m["conv"] == conv
        assert len(m["step_times_s"]) == 2 and all(_positive(t) for t in m["step_times_s"])
        for field in ("median_step_s", "images_per_s", "epoch_s"):
            assert _positive(m[field]), (key, field)
        assert m["epoch_s"] == pytest.approx(m["median_step_s"] * s["steps_per_epoch"])
        assert m["images_per_s"] == pytest.approx(4 / m["median_step_s"])
        mem = m["memory"]
        assert _positive(mem["saved_activations_mib"]) and mem["saved_tensors"] > 0
        assert mem["method"]
    assert math.isfinite(r["reduction_pct"]) and math.isfinite(r["reduction_pct_paired"])
    expected = 100 * (1 - r["fast"]["median_step_s"] / r["exact"]["median_step_s"])
    assert r["reduction_pct"] == pytest.approx(expected)
    # the fast gradient keeps only u¹ and S per SOC layer: fewer saved activations
    assert r["fast"]["memory"]["saved_activations_mib"] < r["exact"]["memory"]["saved_activations_mib"]


def test_train_table_output(one_thread):
    result = CliRunner().invoke(
        app, ["bench", "train", "--archs", "lipconvnet-5", "--steps", "1", "--warmup", "0",
              "--no-memory", *TINY[:-1], *one_thread])
    assert result.exit_code == 0, result.output
    assert "Table 1" in result.stdout and "lipconvnet-5" in result.stdout
    assert "torch" in result.stdout  # environment recorded in the caption


def test_build_twins_identical_and_detects_difference():
    fast, exact, identical = bench.build_twins("lipconvnet-5", width=4)
    assert identical and bench.state_dicts_identical(fast, exact)
    assert type(fast.body[1]).__name__ == type(exact.body[1]).__name__  # same SOC class
    assert fast.lipcli_config["conv"]["name"] == "soc-fast"
    assert exact.lipcli_config["conv"]["name"] == "soc"
    # the check can fail: one changed element is detected
    with torch.no_grad():
        next(exact.parameters()).view(-1)[0] += 1e-3
    assert not bench.state_dicts_identical(fast, exact)
    # ... and so is a different seed (i.e. a copy that silently did nothing)
    other = bench.build_model("lipconvnet-5", conv="soc", width=4, seed=5)
    assert not bench.state_dicts_identical(fast, other)


def test_recipe_optimizer_weight_decay_groups():
    model = bench.build_model("lipconvnet-5", conv="soc-fast", width=4)
    opt = bench.recipe_optimizer(model)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    none = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert "head.weight" in decay and "head.bias" in none
    assert all(model.get_parameter(n).dim() >= 2 for n in decay)
    assert any(n.startswith("body.stem_conv") for n in decay)
    assert decay | none == set(names.values()) and not decay & none
    assert opt.defaults["lr"] == 0.1 and opt.defaults["momentum"] == 0.9


# ------------------------------------------------------------------------ lip bench profile
def test_profile_json(one_thread):
    report = _run(["bench", "profile", "--arch", "5", "--steps", "1", "--warmup", "1",
                   *TINY, *one_thread])
    assert report["benchmark"] == "profile"
    _check_env(report["environment"])
    cats = {row["category"]: row for row in report["categories"]}
    assert _positive(cats["convolution"]["ms_per_step"])
    assert "backward" in cats and "optimizer" in cats
    total = sum(row["share_pct"] for row in report["categories"])
    assert total == pytest.approx(100.0, abs=0.5)  # CPU: shares of wall time incl. untracked
    assert 0 < report["convolution_share_pct"] <= 100
    assert report["convolution_share_pct"] == pytest.approx(cats["convolution"]["share_pct"])
    assert report["target_pct"] == 90.0
    assert report["target_met"] == (report["convolution_share_pct"] >= 90.0)
    assert _positive(report["step_ms_profiled"]) and _positive(report["step_ms_unprofiled_median"])
    assert report["top_operators"] and all(op["ms_per_step"] >= 0 for op in report["top_operators"])


def _evt(name: str, parent=None):
    return SimpleNamespace(name=name, cpu_parent=parent)


def test_classify_event_rules():
    step = _evt("bench::forward")
    conv_mod = _evt("bench::fwd::conv", step)
    conv = _evt("aten::conv2d", conv_mod)
    assert bench.classify_event(_evt("aten::mkldnn_convolution", _evt("aten::convolution", conv))) \
        == "convolution"
    # anything called from a convolution op (e.g. a reorder copy) is convolution time
    assert bench.classify_event(_evt("aten::copy_", conv)) == "convolution"
    assert bench.classify_event(_evt("aten::mv", conv_mod)) == "conv_power"
    assert bench.classify_event(_evt("aten::add", conv_mod)) == "conv_other"
    assert bench.classify_event(_evt("aten::maximum", _evt("bench::fwd::activation", step))) \
        == "activation"
    engine = _evt("autograd::engine::evaluate_function: MaxBackward0")
    assert bench.classify_event(_evt("aten::where", engine)) == "backward"
    wgrad = _evt("aten::convolution_backward", _evt("bench::backward"))
    assert bench.classify_event(_evt("aten::sum", wgrad)) == "convolution"
    assert bench.classify_event(_evt("aten::_foreach_add_", _evt("bench::optimizer"))) == "optimizer"
    # the fused oneDNN convolution-plus-add, and whatever a SOC layer runs inside its
    # convolution label (a 1x1 convolution as addmm); the label's own self time does not
    assert bench.classify_event(_evt("mkldnn::_convolution_pointwise", conv_mod)) == "convolution"
    label = _evt("lipcli::soc_convolution", conv_mod)
    assert bench.classify_event(_evt("aten::addmm", label)) == "convolution"
    assert bench.classify_event(label) == "conv_other"
    assert bench.classify_event(_evt("lipcli::soc_convolution", engine)) == "backward"
    # names containing "conv" that are not aten convolutions do not count
    assert bench.classify_event(_evt("aten::_convert_indices_from_coo_to_csr")) == "unlabelled"
    assert bench.classify_event(_evt("MyConvThing", _evt("bench::loss"))) == "loss"


# ------------------------------------------------------------------------ lip bench certify
def test_certify_json_lln(one_thread):
    report = _run(["bench", "certify", "--arch", "5", "--n", "6", "--lipschitz-iters", "2",
                   "--refresh-steps", "2", *TINY, *one_thread])
    assert report["benchmark"] == "certify"
    _check_env(report["environment"])
    assert "random" in report["settings"]["weights"]
    assert report["settings"]["head"] == "lln"
    assert _positive(report["features"]["inputs_per_s"]) and report["features"]["feature_dim"] == 128
    lip = report["lipschitz"]
    assert _positive(lip["upper_bound"]) and _positive(lip["estimate"])
    assert lip["upper_bound"] >= lip["estimate"]  # guaranteed bound vs lower estimate
    assert lip["upper_bound_s"] >= 0 and lip["estimate_s"] > 0
    (cert,) = report["certificates"]
    assert cert["method"] == "lln" and cert["exact_classes"] is True and cert["top_k"] is None
    assert _positive(cert["inputs_per_s"])
    assert cert["input_radius"]["median"] == pytest.approx(
        cert["feature_radius"]["median"] / lip["upper_bound"])
    # series against the eval lowering, interleaved, with FLOP per input
    series, lowered = report["feature_paths"]
    assert (series["path"], lowered["path"]) == ("series", "lowered")
    assert len(series["seconds"]) == len(lowered["seconds"]) == 3
    assert series["dense_layers"] == [] and lowered["dense_layers"]
    assert 0 < lowered["flop_per_input"] < series["flop_per_input"]
    assert series["lipschitz_upper_bound"] == pytest.approx(lip["upper_bound"], rel=1e-12)
    assert series["lipschitz_upper_bound"] < lowered["lipschitz_upper_bound"] < series["lipschitz_upper_bound"] * (1 + 1e-5)


def test_certify_json_mlp_top_k(one_thread):
    # --path-rounds 0: the feature paths (an eval lowering build) are test_certify_json_lln's
    report = _run(["bench", "certify", "--arch", "5", "--head", "mlp", "--n", "4",
                   "--top-k", "2", "--lipschitz-iters", "1", "--refresh-steps", "1",
                   "--path-rounds", "0", *TINY, *one_thread])
    assert report["feature_paths"] == []
    certs = report["certificates"]
    assert [c["method"] for c in certs] == ["crc-lip", "crc-lip"]
    assert certs[0]["top_k"] is None and certs[0]["exact_classes"] is True
    assert certs[1]["top_k"] == 2 and certs[1]["exact_classes"] is False
    for c in certs:
        assert _positive(c["inputs_per_s"]) and c["prepare_s"] >= 0
        assert 0.0 <= c["nonzero_fraction"] <= 1.0
    assert report["features"]["feature_dim"] == 256  # MaxMin features, 64 w


# ------------------------------------------------------------------------ measurement helpers
def test_saved_tensor_meter_counts_distinct_activations():
    w = torch.nn.Parameter(torch.randn(5, 5))
    x = torch.randn(7, 5)
    meter = bench.SavedTensorMeter(exclude=[w])
    with meter.hooks():
        h = x @ w          # saves x (w excluded)
        out = h.exp()      # saves the result exp(h)
        out.sum().backward()
    assert meter.count == 2
    assert meter.bytes == x.numel() * 4 + out.numel() * 4


def test_parse_archs():
    assert bench.parse_archs("5,10", ARCHS) == ["lipconvnet-5", "lipconvnet-10"]
    assert bench.parse_archs("lipconvnet-20, 5,20", ARCHS) == ["lipconvnet-20", "lipconvnet-5"]
    with pytest.raises(LipUsageError, match="unknown architecture '7'"):
        bench.parse_archs("5,7", ARCHS)
    with pytest.raises(LipUsageError):
        bench.parse_archs(" , ", ARCHS)


def test_parse_archs_inline_parameters():
    archs = [*ARCHS, "liresnet"]
    assert bench.parse_archs("5,liresnet:depth=4,width=16,20", archs) == [
        "lipconvnet-5", "liresnet:depth=4,width=16", "lipconvnet-20"]
    assert bench.parse_archs("liresnet:depth=4,liresnet", archs) == ["liresnet:depth=4", "liresnet"]
    with pytest.raises(LipUsageError, match="unknown architecture 'depth=4'"):
        bench.parse_archs("5,depth=4", archs)  # a key=value with no parameterised name before it
    with pytest.raises(LipUsageError, match="unknown architecture 'nope:depth=4'"):
        bench.parse_archs("nope:depth=4", archs)


# ------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    "args",
    [
        ["bench", "train", "--archs", "5,13"],
        ["bench", "train", "--archs", "resnet-18"],
        ["bench", "train", "--archs", "5", "--steps", "0"],
        ["bench", "train", "--archs", "5", "--head", "nope"],
        ["bench", "profile", "--arch", "lipconvnet-3"],
        ["bench", "profile", "--arch", "5,10"],
        ["bench", "certify", "--arch", "99"],
        ["bench", "train", "--archs", "5", "--device", "tpu"],
    ],
)
def test_bad_inputs_exit_2_with_one_line(args):
    result = CliRunner().invoke(app, [*args, "--width", "4", "--batch-size", "2"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == ""


def _tiny_model():
    return bench.build_model("lipconvnet-5", conv="soc-fast", width=4)


@pytest.mark.parametrize(("args", "setting", "message"), [
    (["train", "--archs", "5", "--steps", "0"], "steps", "--steps must be in 1..100000, got 0"),
    (["train", "--archs", "5", "--warmup", "-1"], "warmup", "--warmup must be in 0..100000, got -1"),
    (["profile", "--arch", "5", "--batch-size", "0"], "batch_size", "--batch-size must be in 1..65536, got 0"),
    (["certify", "--arch", "5", "--top-k", "0"], "top_k", "--top-k must be at least 1, got 0"),
    (["certify", "--arch", "5", "--refresh-steps", "-1"], "refresh_steps", "--refresh-steps must be in 0..1000"),
])
def test_bad_settings_name_the_argument_in_the_library_and_the_option_in_lip(args, setting, message):
    """The drivers raise SettingError naming their argument; lip bench names its option."""
    from lipcli.sdk.errors import SettingError

    result = CliRunner().invoke(app, ["bench", *args, "--width", "4", "--device", "cpu"])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {message}"), result.stderr
    with pytest.raises(SettingError) as info:  # the library's own words
        {"train": lambda: bench.bench_train(["lipconvnet-5"], **{setting: int(args[-1])}),
         "profile": lambda: bench.bench_profile("lipconvnet-5", batch_size=0),
         "certify": lambda: bench.bench_certify(_tiny_model(), **{setting: int(args[-1])})}[args[0]]()
    assert info.value.setting == setting and "--" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_requested_without_cuda_exits_2():
    result = CliRunner().invoke(app, ["bench", "train", "--archs", "5", "--device", "cuda"])
    assert result.exit_code == 2 and "CUDA is not available" in result.stderr


def test_fit_head_stops_at_target_loss(one_thread):
    from lipcli.builtins.lln.head import LLNHead

    torch.set_num_threads(1)
    torch.manual_seed(0)
    head = LLNHead(16, 3)
    feats = torch.randn(64, 16) * 3
    fit = bench.fit_head(head, feats, 3, steps=2000, target_loss=0.5, lr=1e-2)
    assert 0 < fit.steps_taken < 2000 and fit.final_loss <= 0.5 + 1e-6
    assert fit.teacher_agreement > 0.7
    assert not head.training
    # zero steps leaves the head untouched
    before = {k: v.clone() for k, v in head.state_dict().items()}
    bench.fit_head(head, feats, 3, steps=0)
    assert all(torch.equal(before[k], v) for k, v in head.state_dict().items())


def test_attribute_kernels_through_launch_events_and_names():
    """CUDA profiles: each kernel counted once, via the operator that launched it, or by its
    name when the profiler did not link it (cuDNN often launches through the driver API);
    profiler ranges mirrored on the GPU timeline are not kernels."""
    ns = SimpleNamespace
    conv_op = _evt("aten::cudnn_convolution", _evt("bench::fwd::conv", _evt("bench::forward")))
    conv_op.kernels = [ns(name="sm90_xmma_fprop_implicit_gemm", duration=30.0)]
    add_op = _evt("aten::add", _evt("autograd::engine::evaluate_function: AddBackward0"))
    add_op.kernels = [ns(name="vectorized_elementwise_kernel", duration=5.0)]
    device = [
        ns(name="sm90_xmma_fprop_implicit_gemm", time_range=ns(start=10, end=40)),
        ns(name="vectorized_elementwise_kernel", time_range=ns(start=50, end=55)),
        ns(name="sm90_xmma_wgrad_implicit_gemm", time_range=ns(start=60, end=80)),
        ns(name="some_reduce_kernel", time_range=ns(start=90, end=92)),
        ns(name="lipcli::soc_convolution", time_range=ns(start=0, end=100)),
        ns(name="bench::forward", time_range=ns(start=0, end=100)),
    ]
    got = bench.attribute_kernels([conv_op, add_op, _evt("aten::empty")], device)
    assert got == [
        ("convolution", "aten::cudnn_convolution", None, 30.0),
        ("backward", "aten::add", "AddBackward0", 5.0),
        ("convolution", "[kernel] sm90_xmma_wgrad_implicit_gemm", None, 20.0),
        ("unattributed_kernels", "[kernel] some_reduce_kernel", None, 2.0),
    ]
