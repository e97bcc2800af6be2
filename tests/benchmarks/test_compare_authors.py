"""benchmarks/compare_authors.py's own logic (mapping, agreement, interleaved timing, table) run
against stand-ins for the authors' layers built on lipcli's layers (no external code): each
stand-in has the authors' constructor, attribute names and parameter conventions (BRO's filter
flipped, SOC's power vectors shaped as the authors' buffers, the zero-pad → circular → crop map of
BRO and LOT), so the script's mapping must undo them to agree."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import authors_methods as am  # noqa: E402
import compare_authors as ca  # noqa: E402
from lipcli.builtins.soc.layer import SOC  # noqa: E402
from lipcli_bro.bro import BROConv  # noqa: E402
from lipcli_lot.lot import LOTConv  # noqa: E402
from lipcli_sll.conv import SLLConv  # noqa: E402


class StandInSOC(nn.Module):
    def __init__(self, cin, cout, kernel_size, stride, train_terms, eval_terms, update_iters, fast_train):
        super().__init__()
        self.inner = SOC(cin, cout, kernel_size, stride, train_terms=train_terms,
                         eval_terms=eval_terms, power_iters=update_iters)
        self.train_terms, self.eval_terms, self.update_iters = train_terms, eval_terms, update_iters
        C, k = self.inner.channels, kernel_size
        # the authors' buffer shapes: (left vector, right vector) of each reshape
        self._shapes = {"_v1": ("power_u0", (C, 1, k, 1)), "_u1": ("power_v0", (1, C, 1, k)),
                        "_v2": ("power_u1", (C, 1, 1, k)), "_u2": ("power_v1", (1, C, k, 1)),
                        "_v3": ("power_u2", (C, 1, 1, 1)), "_u3": ("power_v2", (1, C, k, k)),
                        "_u4": ("power_u3", (C, 1, k, k)), "_v4": ("power_v3", (1, C, 1, 1))}

    def __getattr__(self, name):
        if name in ("weight", "bias"):
            return getattr(self.inner, name)
        shapes = self.__dict__.get("_shapes", {})
        if name in shapes:
            ours, shape = shapes[name]
            return getattr(self.inner, ours).view(shape)
        return super().__getattr__(name)

    def update_sigma(self):
        self.inner.refresh(50)

    def forward(self, x):
        return self.inner(x)


class StandInBRO(nn.Module):
    flip = True  # the authors' spectrum is the conjugate of lipcli's: their filter is flipped

    def __init__(self, cin, cout, kernel_size, input_size, stride, mask_level, id_init):
        super().__init__()
        c = max(cin * stride**2, cout)
        rank = c // 2 if cin * stride**2 == cout else min(cin * stride**2, cout)
        self.inner = BROConv(cin * stride**2, cout, kernel_size, 1, rank=rank, init="random")
        self.raw_out_channels, self.kernel_size = cout, (kernel_size, kernel_size)
        self.shape = am.Shape(cin, cout, input_size, stride, kernel_size)

    @property
    def weight(self):
        return self.inner.weight.flip(2, 3) if self.flip else self.inner.weight

    @property
    def bias(self):
        return self.inner.bias

    def forward(self, x):
        return am.padded_reference(self.inner, self.shape)(x)


class UnflippedBRO(StandInBRO):
    flip = False  # a layer whose convention the mapping does not undo


class StandInLOT(nn.Module):
    iter_T = 10

    def __init__(self, cin, cout, kernel_size, stride, padding, bias):
        super().__init__()
        self.inner = LOTConv(cin * stride**2, cout, kernel_size, 1, init="random")
        self.stride, self.kernel = stride, kernel_size

    def __getattr__(self, name):
        if name in ("weight", "bias"):
            return getattr(self.inner, name)
        return super().__getattr__(name)

    def forward(self, x):
        H = x.shape[-1]
        shape = am.Shape(x.shape[1], self.inner.out_channels, H, self.stride, self.kernel)
        return am.padded_reference(self.inner, shape)(x)


class StandInSLL(nn.Module):
    def __init__(self, cin, inner_dim, kernel_size):
        super().__init__()
        self.inner = SLLConv(cin, cin, kernel_size, 1, inner_factor=inner_dim // cin)

    @property
    def kernel(self):
        return self.inner.weight

    @property
    def bias(self):
        return self.inner.bias

    def forward(self, x):
        return self.inner(x)


STAND_INS = {"soc": StandInSOC, "bro": StandInBRO, "lot": StandInLOT, "sll": StandInSLL}
TINY = {"soc": [am.Shape(4, 4, 6), am.Shape(4, 8, 6, 2)], "bro": [am.Shape(4, 4, 6), am.Shape(4, 8, 6, 2)],
        "lot": [am.Shape(4, 4, 6), am.Shape(4, 8, 6, 2)], "sll": [am.Shape(4, 4, 6)]}


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    return ca.compare(STAND_INS.__getitem__, list(STAND_INS), threads=[1], rounds=2, reps=1,
                      batch=2, width=2, shapes=TINY)


def test_mapping_agrees_with_stand_ins(result):
    rows = result["rows"]
    assert not result["skipped"]
    expected = {(m, s.label) for m, shapes in TINY.items() for s in shapes}
    expected |= {(m, "LipConvnet-5 w2 b2") for m in ("soc", "bro", "lot")}
    assert {(r["method"], r["what"]) for r in rows} == expected
    for r in rows:
        assert r["dtype"] == "float64"
        assert r["agree"] < 1e-12, r  # measured about 1e-16
        for kind in ("train", "eval"):
            t = r[kind]
            assert t["rounds"] == 2 and 0 < t["min"] <= t["median"] <= t["max"] < math.inf


def test_a_wrong_convention_disagrees():
    """The BRO filter without its flip: the mapping's flip then makes lipcli's map differ."""
    for shape in TINY["bro"]:
        agree, _ = ca.agreement(am.METHODS["bro"], UnflippedBRO, [shape], 2, seed=0)
        assert agree > 1e-2


def test_table_and_json(result):
    result = dict(result, commits={"soc": "unknown"})
    text = ca.table(result)
    assert text.count("\n| ") == len(result["rows"])  # one line per row after the header
    assert "soc: github.com/singlasahil14/improved_l2_robustness at unknown" in text
    assert json.loads(json.dumps(result))["rows"][0]["threads"] == 1


def test_interleaved_ratio_sees_the_slower_side():
    calls = []
    fast = lambda: calls.append("a")  # noqa: E731
    slow = lambda: (calls.append("b"), sum(range(200_000)))  # noqa: E731
    ratios = ca.interleaved_ratios(fast, slow, rounds=4, reps=2, warmup=0)
    assert len(ratios) == 4 and max(ratios) < 1
    assert calls[:4] == ["a", "a", "b", "b"] and calls[4:8] == ["b", "b", "a", "a"]  # alternating


def test_import_authors_from_a_folder_and_skips(tmp_path):
    """A checkout's module is imported by path and taken out of sys.modules again; a missing
    checkout, a missing file, SOC without CUDA or --shim-soc, and a failing import are skips."""
    for name, body in (("a", "VALUE = 1"), ("b", "VALUE = 2")):
        (tmp_path / name / "core" / "models").mkdir(parents=True)
        (tmp_path / name / "core" / "models" / "layers.py").write_text(
            f"import torch\nclass SDPBasedLipschitzConvLayer:\n    {body}\n")
    got = [am.import_authors({"sll": tmp_path / n})("sll").VALUE for n in "ab"]
    assert got == [1, 2] and "layers" not in sys.modules
    with pytest.raises(am.Skip, match="no checkout"):
        am.import_authors({})("bro")
    with pytest.raises(am.Skip, match="soc-network: no checkout"):  # the network comes from --soc
        am.import_authors({"bro": tmp_path})("soc-network")
    with pytest.raises(am.Skip, match="not found"):
        am.import_authors({"lot": tmp_path})("lot")
    if not torch.cuda.is_available():
        (tmp_path / "skew_ortho_conv.py").write_text("raise SystemExit('must not be imported')\n")
        with pytest.raises(am.Skip, match="cuDNN"):
            am.import_authors({"soc": tmp_path})("soc")
    (tmp_path / "lot_ortho_conv.py").write_text("import a_module_that_is_not_there\n")
    with pytest.raises(am.Skip, match="a_module_that_is_not_there"):
        am.import_authors({"lot": tmp_path})("lot")
    assert am.checkout_commit(tmp_path) == "unknown"


def test_cli_bad_input(tmp_path, capsys):
    assert ca.main(["--bro", str(tmp_path / "absent")]) == 2
    assert "not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        ca.main([])
    assert exc.value.code == 2


def test_interleaved_ratio_waits_for_the_device_around_each_timing():
    events = []
    ratios = ca.interleaved_ratios(lambda: events.append("ours"), lambda: events.append("theirs"),
                                   rounds=2, reps=1, warmup=0, sync=lambda: events.append("sync"))
    assert len(ratios) == 2
    # each timed call is bracketed by a wait before the clock starts and after the calls
    assert events == ["sync", "ours", "sync", "sync", "theirs", "sync",
                      "sync", "theirs", "sync", "sync", "ours", "sync"]


def test_checkout_commit_is_never_the_enclosing_repository(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert am.checkout_commit(tmp_path) == head
    inner = tmp_path / "authors" / "soc"
    inner.mkdir(parents=True)
    assert am.checkout_commit(inner) == "unknown"  # inside another repository: not its commit
    (inner / "COMMIT").write_text("65dd5f244be8a7212b05268541d0abdce909bd81\n")
    assert am.checkout_commit(inner) == "65dd5f244be8a7212b05268541d0abdce909bd81"
    (inner / "COMMIT").write_text("not a commit\n")
    assert am.checkout_commit(inner) == "unknown"


def test_move_takes_plain_tensor_attributes_along():
    class Pinned(nn.Module):  # like the authors' BRO: a tensor attribute that .to() leaves behind
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.eye = torch.eye(2, dtype=torch.float64)

    m = nn.Sequential(Pinned())
    m.to(torch.float32)
    assert m[0].eye.dtype == torch.float64  # .to() did not touch it
    ca.move(m, "meta")
    assert m[0].eye.device.type == "meta" and m[0].lin.weight.device.type == "meta"


class StandInLipConvNet(nn.Module):
    """The authors' ``LipConvNet`` constructor and state-dict names (``init_layer.ortho.*``,
    ``block{n}.{j}.ortho.*``, the power vectors ``_u1 .. _v4`` in their shapes, ``shift``/``scale``,
    ``logits_layer.*``) over lipcli's own network, so the benchmark's mapping must undo them."""

    def __init__(self, conv_name, activation_name, pooling_name, last_name, init_channels, block_size,
                 num_classes, fast_train):
        super().__init__()
        from lipcli.host.models import create_model

        assert (conv_name, activation_name, pooling_name, last_name, fast_train) == ("soc", "maxmin", "max", "lln", True)
        self.inner = create_model(f"lipconvnet-{5 * block_size}", conv="soc-fast", activation="maxmin",
                                  pool="max", head="lln", num_classes=num_classes, width=init_channels)
        self.blocks, self.width = block_size, init_channels

    @property
    def update_iters(self):
        return self.inner.body.stem_conv.power_iters

    @update_iters.setter
    def update_iters(self, n):
        for m in self.inner.modules():
            if isinstance(m, SOC):
                m.power_iters = n

    def update_sigma(self):
        self.inner.refresh_power_iteration(50)

    def state_dict(self, *args, **kwargs):
        from lipcli.builtins.lipconvnet.importer import _POWER_VECTORS, _layers, _soc_shapes

        ours = self.inner.state_dict()
        out = {"shift": ours["body.normalize.mean"].view(3, 1, 1),
               "scale": ours["body.normalize.std"].view(3, 1, 1),
               "logits_layer.weight": ours["head.weight"], "logits_layer.bias": ours["head.bias"]}
        for src, dst, c_in, c_out, k, s in _layers(self.blocks, self.width):
            shapes = _soc_shapes(c_in, c_out, k, s)
            out[f"{src}.weight"], out[f"{src}.bias"] = ours[f"{dst}.weight"], ours[f"{dst}.bias"]
            for r, (rows, cols) in enumerate(_POWER_VECTORS):
                out[f"{src}.{rows}"] = ours[f"{dst}.power_u{r}"].view(shapes[rows])
                out[f"{src}.{cols}"] = ours[f"{dst}.power_v{r}"].view(shapes[cols])
        return out

    def forward(self, x):
        return self.inner(x)


def test_network_rows_against_a_stand_in():
    """The network rows map the stand-in's parameters into lipcli's network (agreement to
    float64 rounding), and time the default and the dense option in the same rounds."""
    torch.manual_seed(0)
    out = ca.network_rows({"soc-network": StandInLipConvNet}.__getitem__, [5], [1], rounds=2, reps=1,
                          batch=2, width=2, dense=True)
    assert not out["skipped"]
    assert [r["lipcli"] for r in out["rows"]] == ["lipconvnet-5 soc-fast",
                                                  "lipconvnet-5 soc-fast CPU_DENSE_SMALL_IMAGES"]
    for r in out["rows"]:
        assert r["agree"] < 1e-12, r
        assert r["train"]["rounds"] == 2 and 0 < r["train"]["min"] <= r["train"]["max"] < math.inf
        assert set(r["seconds"]) == {"theirs", "ours", "dense"}
        assert "—" in ca.format_row(r)
    assert "(dense option)" in ca.format_row(out["rows"][1])


def test_network_rows_skip_without_the_network():
    def provider(name):
        raise am.Skip(f"{name}: no checkout given")

    assert ca.network_rows(provider, [5], [1], 1, 1, 2, 2) == {"rows": [], "skipped": ["soc-network: no checkout given"]}


def test_cli_networks_need_the_soc_checkout(tmp_path, capsys):
    assert ca.main(["--bro", str(tmp_path), "--soc-networks", "5"]) == 2
    assert "--soc-networks needs the SOC checkout" in capsys.readouterr().err
    assert ca.main(["--soc", str(tmp_path), "--soc-networks", "five"]) == 2
