"""``lip import`` on hostile or broken checkpoints, made here from the paper's small test
checkpoint: each is one line, exit 1 or 2, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lipcli.testing import check_import_refused, run_lip

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
CASE = DATA / "improved_l2_lln_d10_w2.pt"


def _variant(tmp_path: Path, change) -> Path:
    state = torch.load(CASE, weights_only=True)
    change(state)
    path = tmp_path / "variant.pt"
    torch.save(state, path)
    return path


def _zero_power(state):
    state["init_layer.ortho._u1"] = torch.zeros_like(state["init_layer.ortho._u1"])


@pytest.mark.parametrize("change, message", [
    (lambda s: s.__setitem__("block1.400000.ortho.weight", torch.ones(1)),
     "400001 layers per block, beyond the 8 of lipcli's deepest LipConvNet"),
    (lambda s: s.__setitem__("block1.40000000.ortho.weight", torch.ones(1)),
     "unexpected keys for importer 'improved-l2': block1.40000000.ortho.weight"),
    (lambda s: s.__setitem__("logits_layer.weight", s["logits_layer.weight"].double() * 1e300),
     "variant.pt: importer 'improved-l2': tensor 'head.weight' is not finite in float32"),
    (lambda s: s.__setitem__("scale", torch.zeros(3, 1, 1)), "every entry must be positive"),
    (_zero_power, "an all-zero power vector"),
    (lambda s: s.update({"logits_layer.weight": torch.randn(200_000, 64), "logits_layer.bias": torch.zeros(200_000)}),
     "the model file it makes would be refused: num_classes must be an integer from 2 to 100000"),
    (lambda s: s.__setitem__("block1.0.ortho.weight", s["block1.0.ortho.weight"].to(torch.complex64)),
     "lipcli imports real-valued weights only"),
], ids=["deep-key", "deeper-key", "float32-overflow", "zero-std", "zero-power", "classes", "complex"])
def test_refused_with_one_line_and_nothing_written(tmp_path, change, message):
    check_import_refused(_variant(tmp_path, change), "improved-l2", message)


def test_a_huge_arch_depth_is_a_usage_error(tmp_path):
    out = tmp_path / "m.safetensors"
    for arch in ("lipconvnet-50000000", "lipconvnet-" + "5" * 5000):
        result = run_lip(["import", str(CASE), "--from", "improved-l2", "--arch", arch, "--out", str(out)])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and "from 5 to 40" in lines[0], result.output
    assert not out.exists()


def test_import_honours_the_lock_of_a_run_writing_the_same_file(tmp_path):
    from lipcli.host.locks import FileLock, output_lock_path

    out = tmp_path / "m.safetensors"
    lock = FileLock(output_lock_path(out), f"model file {out}").acquire()
    try:
        result = run_lip(["import", str(CASE), "--from", "improved-l2", "--out", str(out)])
    finally:
        lock.release()
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "is in use by another lipcli process" in lines[0]
    assert not out.exists()


def test_compare_checks_its_data_before_writing(tmp_path):
    out = tmp_path / "m.safetensors"
    result = run_lip(["import", str(CASE), "--from", "improved-l2", "--out", str(out), "--compare",
                      "--data-dir", str(tmp_path / "no-such-folder")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code in (1, 2) and len(lines) == 1, result.output
    assert not out.exists()
