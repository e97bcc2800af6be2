"""--extra-data: memory-mapped arrays, their checks, mixed batches, the model file record."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError
from lipcli.train.extradata import check_compatible, open_extra_data
from lipcli.host.modelfile import read_metadata
from lipcli.train.mixing import ExtraImageDataset, MixedBatchSampler

runner = CliRunner()


def arrays(n=6, h=32, w=32, c=3, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, h, w, c), dtype=np.uint8), (np.arange(n) % classes).astype(np.int64)


def test_npz_members_are_memory_mapped_views_of_the_file(tmp_path):
    img, lab = arrays()
    np.savez(tmp_path / "x.npz", image=img, label=lab)
    extra = open_extra_data(tmp_path / "x.npz")
    assert isinstance(extra.images, np.memmap) and isinstance(extra.labels, np.memmap)
    assert np.array_equal(extra.images, img) and np.array_equal(extra.labels, lab)
    assert extra.image_shape == (3, 32, 32) and len(extra) == 6
    assert extra.sha256 == hashlib.sha256((tmp_path / "x.npz").read_bytes()).hexdigest()
    # the directory form: image.npy + label.npy
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "image.npy", img)
    np.save(tmp_path / "d" / "label.npy", lab.astype(np.uint8))
    other = open_extra_data(tmp_path / "d")
    assert isinstance(other.images, np.memmap) and np.array_equal(other.images, img)
    # one image through the data set: (C, H, W) in [0, 1], the transform applied
    ds = ExtraImageDataset(extra, transform=lambda x: x.flip(-1))
    x, y = ds[2]
    assert torch.equal(x, torch.from_numpy(img[2]).permute(2, 0, 1).float().div(255).flip(-1)) and y == 2


@pytest.mark.parametrize("make, message", [
    (lambda p, i, l: np.savez_compressed(p, image=i, label=l), "compressed and cannot be memory-mapped"),
    (lambda p, i, l: np.savez(p, images=i, label=l), "needs arrays 'image' and 'label'; found images, label"),
    (lambda p, i, l: np.savez(p, image=i.astype(np.float32), label=l), "'image' must be uint8"),
    (lambda p, i, l: np.savez(p, image=i[..., 0], label=l), "must have shape (N, H, W, C)"),
    (lambda p, i, l: np.savez(p, image=i, label=l.astype(np.float32)), "'label' must be integers"),
    (lambda p, i, l: np.savez(p, image=i, label=l[:5]), "6 images but 5 labels"),
    (lambda p, i, l: p.write_bytes(b"not a zip"), "not an .npz archive"),
    (lambda p, i, l: p.write_bytes(Path(p).with_name("ok.npz").read_bytes()[:2000]), "not an .npz archive"),
])
def test_bad_files_are_one_line_usage_errors(tmp_path, make, message):
    img, lab = arrays()
    np.savez(tmp_path / "ok.npz", image=img, label=lab)
    make(tmp_path / "bad.npz", img, lab)
    with pytest.raises(LipUsageError, match=None) as info:
        open_extra_data(tmp_path / "bad.npz")
    text = str(info.value)
    assert message in text and "\n" not in text and str(tmp_path / "bad.npz") in text


def test_compatibility_with_the_training_set(tmp_path):
    img, lab = arrays()
    np.savez(tmp_path / "x.npz", image=img, label=lab)
    extra = open_extra_data(tmp_path / "x.npz")
    check_compatible(extra, image_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(LipUsageError, match=r"images are \(32, 32, 3\) \(H, W, C\) but the training set's are \(64, 64, 3\)"):
        check_compatible(extra, image_shape=(3, 64, 64), num_classes=10)
    with pytest.raises(LipUsageError, match=r"labels must be in 0..4 .* found 0..5"):
        check_compatible(extra, image_shape=(3, 32, 32), num_classes=5)


def test_mixed_batches_hold_the_ratio_and_repeat_per_epoch():
    from torch.utils.data import DistributedSampler

    real = DistributedSampler(list(range(10)), num_replicas=1, rank=0, shuffle=True, seed=0)
    s = MixedBatchSampler(real, 10, 7, batch_size=4, ratio=0.5, seed=0, rank=0)
    s.set_epoch(0)
    batches = list(s)
    assert len(batches) == len(s) == 5
    assert all(sum(i >= 10 for i in b) == 2 for b in batches)
    assert sorted(i for b in batches for i in b if i < 10) == list(range(10))  # one pass over train
    extra = [i - 10 for b in batches for i in b if i >= 10]
    assert sorted(extra[:7]) == list(range(7))  # a permutation, then the next one
    assert list(s) == batches  # same epoch, same batches (resume)
    s.set_epoch(1)
    assert list(s) != batches
    with pytest.raises(LipUsageError, match="both need at least 1"):
        MixedBatchSampler(real, 10, 7, batch_size=4, ratio=0.9, seed=0, rank=0)


TINY = ["--dataset", "digits", "--width", "4", "--limit-train", "48", "--limit-test", "16",
        "--batch-size", "16", "--epochs", "1"]


def _config(tmp_path: Path) -> str:
    path = tmp_path / "tiny.toml"
    path.write_text('power_iter_steps = 2\nlipschitz_estimate = false\ndevice = "cpu"\n')
    return str(path)


def test_training_with_extra_data_records_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    img, lab = arrays(n=20)
    np.savez(tmp_path / "x.npz", image=img, label=lab)
    r = runner.invoke(app, ["train", *TINY, "--config", _config(tmp_path), "--extra-data", "x.npz",
                            "--extra-ratio", "0.25", "--out", "m.safetensors"])
    assert r.exit_code == 0, r.output
    training = read_metadata("m.safetensors")["training"]
    record = training["extra_data"]
    assert record["sha256"] == hashlib.sha256((tmp_path / "x.npz").read_bytes()).hexdigest()
    assert record["images"] == 20 and record["ratio"] == 0.25 and record["image_shape"] == [3, 32, 32]
    assert record["bytes"] == (tmp_path / "x.npz").stat().st_size
    assert training["steps"] == 4  # 48 training images, 12 per batch of 16
    assert training["config"]["extra_data"] == str(tmp_path / "x.npz")


@pytest.mark.parametrize("make, message", [
    (lambda p: np.savez(p, image=arrays(h=16, w=16)[0], label=arrays()[1]), "but the training set's are (32, 32, 3)"),
    (lambda p: np.savez(p, image=arrays()[0], label=np.arange(6) + 7), "labels must be in 0..9"),
    (lambda p: np.savez(p, image=arrays()[0].astype(np.int16), label=arrays()[1]), "'image' must be uint8"),
    (lambda p: p.write_bytes(b"PK\x03\x04 corrupt"), "not an .npz archive"),
])
def test_corrupt_or_mismatched_extra_data_fails_before_training_and_writes_nothing(tmp_path, monkeypatch, make, message):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "bad.npz")
    config = _config(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    r = runner.invoke(app, ["train", *TINY, "--config", config, "--extra-data", "bad.npz",
                            "--out", "out/m.safetensors"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: extra data ") and message in lines[0], r.stderr
    assert sorted(tmp_path.rglob("*")) == before


def _npy(arr: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """``arr`` as ``.npy`` bytes; ``shape`` replaces the header's shape (the data stays)."""
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    if shape is None:
        return data
    header_len = int.from_bytes(data[8:10], "little")
    header = data[10:10 + header_len].replace(repr(arr.shape).encode(), repr(shape).encode()).rstrip()
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return data[:8] + len(header).to_bytes(2, "little") + header + data[10 + header_len:]


def _zip(path: Path, image: bytes, label: bytes) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("image.npy", image)
        z.writestr("label.npy", label)


def _lying_directory(path: Path) -> None:
    """The header claims 600 images, the zip directory (central and local) claims room for them."""
    import struct

    img, lab = arrays()
    _zip(path, _npy(img, (600, 32, 32, 3)), _npy(lab))
    data = bytearray(path.read_bytes())
    stored = len(_npy(img))
    for sig, at in ((b"PK\x01\x02", 20), (b"PK\x03\x04", 18)):
        pos = data.find(sig)
        struct.pack_into("<II", data, pos + at, stored + 2_000_000, stored + 2_000_000)
    path.write_bytes(bytes(data))


def _directory(path: Path, image: bytes) -> None:
    path.mkdir()
    (path / "image.npy").write_bytes(image)
    (path / "label.npy").write_bytes(_npy(arrays()[1]))


def _npz_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, image=arrays()[0], label=arrays()[1])
    return buf.getvalue()


@pytest.mark.parametrize("make, message", [
    # a shape whose product wraps to 0 in 64 bits (2**64 * 96 bytes)
    (lambda p: _zip(p, _npy(arrays()[0], (2**32, 2**32, 32, 3)), _npy(arrays()[1])), "image.npy is truncated"),
    (lambda p: _directory(p, _npy(arrays()[0], (2**32, 2**32, 32, 3))), "image.npy is truncated"),
    (lambda p: _lying_directory(p), "damaged zip archive (image.npy runs past the end of the file)"),
    (lambda p: _zip(p, _npy(arrays()[0], (-6, 32, 32, 3)), _npy(arrays()[1])), "negative dimension (-6, 32, 32, 3)"),
    (lambda p: _directory(p, _npy(arrays()[0], (6, -32, 32, 3))), "negative dimension (6, -32, 32, 3)"),
    (lambda p: _directory(p, _npz_bytes()), "image.npy is a zip archive (.npz), not a .npy array"),
], ids=["overflow-npz", "overflow-dir", "lying-zip-directory", "negative-npz", "negative-dir", "npz-in-npy"])
def test_malformed_headers_are_one_line_usage_errors_before_anything_is_written(tmp_path, monkeypatch, make, message):
    """Issue 26 item 6: these raised ValueError/OverflowError/AttributeError ("internal error", exit 1)."""
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "bad")
    config = _config(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    r = runner.invoke(app, ["train", *TINY, "--config", config, "--extra-data", "bad",
                            "--out", "out/m.safetensors"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: extra data ") and message in lines[0], r.stderr
    assert sorted(tmp_path.rglob("*")) == before
