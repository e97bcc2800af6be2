"""Reading a foreign checkpoint runs no code (``lipcli.sdk.checkpoints``): a pickle naming
anything beyond tensors and plain containers is refused by torch's weights-only unpickler;
state dicts saved by ``torch.save`` (zip and legacy), safetensors files and ``.npz`` arrays
are read by flattened name.  The hostile files: ``test_checkpoint_attacks.py``."""

from __future__ import annotations

import collections
import os
import pickle

import numpy as np
import pytest
import torch

from lipcli.sdk.checkpoints import (
    CheckpointError,
    UnsafeCheckpointError,
    read_checkpoint,
)


class _WritesAFile:
    """Unpickling this calls ``os.system`` (writes the file named in it)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_pickle_that_would_write_a_file_is_refused_unread(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"weight": torch.ones(2), "payload": _WritesAFile(str(target))}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"refused by torch's weights-only unpickler: .*posix\.system"):
        read_checkpoint(path)
    assert not target.exists()


def test_a_legacy_pickle_with_a_reduce_is_refused(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_WritesAFile(str(target)), protocol=4))  # STACK_GLOBAL
    with pytest.raises(UnsafeCheckpointError):
        read_checkpoint(path)
    assert not target.exists()


def test_a_state_dict_is_read_by_flattened_name(tmp_path):
    path = tmp_path / "sd.pth"
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    torch.save({"model": net.state_dict(), "epoch": 3}, path)
    ckpt = read_checkpoint(path)
    assert ckpt.format == "torch-pickle" and len(ckpt.sha256) == 64
    assert ckpt.shapes["model.0.weight"] == (2, 3)
    assert torch.equal(ckpt.tensors["model.1.running_var"], net[1].running_var)
    assert ckpt.values == {"epoch": 3}


def test_a_legacy_state_dict_is_read(tmp_path):
    path = tmp_path / "old.pth"
    net = torch.nn.Linear(3, 2)
    torch.save(net.state_dict(), path, _use_new_zipfile_serialization=False)
    ckpt = read_checkpoint(path)
    assert torch.equal(ckpt.tensors["weight"], net.weight.detach())
    assert torch.equal(ckpt.tensors["bias"], net.bias.detach())


def test_tied_and_transposed_tensors_are_read(tmp_path):
    w = torch.randn(4, 3)
    torch.save({"a": w, "tied": w, "t": w.t(), "row": w[1]}, tmp_path / "v.pt")
    ckpt = read_checkpoint(tmp_path / "v.pt")
    assert torch.equal(ckpt.tensors["t"], w.t()) and torch.equal(ckpt.tensors["row"], w[1])


def test_safetensors_and_npz_sources(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.arange(4.0)}, tmp_path / "w.safetensors")
    np.savez(tmp_path / "w.npz", a=np.arange(3.0), b=np.ones((2, 2), dtype=np.float32))
    assert read_checkpoint(tmp_path / "w.safetensors").tensors["a"].tolist() == [0, 1, 2, 3]
    npz = read_checkpoint(tmp_path / "w.npz")
    assert npz.format == "npz" and npz.shapes == {"a": (3,), "b": (2, 2)}


def test_an_npz_with_a_pickled_array_is_refused(tmp_path):
    np.savez(tmp_path / "o.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="not a plain .npz"):
        read_checkpoint(tmp_path / "o.npz")


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "none.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x00\x01 not a pickle")
    with pytest.raises(CheckpointError):
        read_checkpoint(tmp_path / "junk.pt")
