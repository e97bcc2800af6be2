"""Hostile checkpoints (``lipcli.sdk.checkpoints``), each made here: every one is refused with
one line, runs no code, and allocates no more than the file holds."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from lipcli.sdk.checkpoints import CheckpointError, UnsafeCheckpointError, read_checkpoint


class _Touch:
    """Unpickling this calls ``os.system`` (creates the file named in it)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class _Marker:
    """Built by an unpickler that allows it (``add_safe_globals``): creates a file."""

    target = ""

    def __setstate__(self, state):
        open(state["target"], "w").close()


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "weights_only=False" not in text and "weights_only" not in text
    return text


def _rewrite_zip(src, dst, edit, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compress) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info.filename, edit(info.filename, data))


def _legacy_pickles(raw: bytes) -> list[int]:
    """The end offsets of the five pickles of a legacy ``torch.save`` file."""
    import pickletools

    stream, ends = io.BytesIO(raw), []
    for _ in range(5):
        for _op in pickletools.genops(stream):
            pass
        ends.append(stream.tell())
    return ends


def test_payloads_are_refused_in_every_pickle_and_protocol(tmp_path):
    target = tmp_path / "pwned"
    for protocol in (2, 4):  # 4: STACK_GLOBAL names taken from MEMOIZE'd strings
        path = tmp_path / f"p{protocol}.pt"
        torch.save({"w": torch.ones(2), "x": _Touch(str(target))}, path, pickle_protocol=protocol)
        with pytest.raises(UnsafeCheckpointError) as exc:
            read_checkpoint(path)
        assert ("posix.system" if protocol == 2 else "opcode FRAME") in _one_line(exc)
    # the legacy format's fifth pickle (the storage keys) carries the payload
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    raw = legacy.read_bytes()
    ends = _legacy_pickles(raw)
    evil = raw[:ends[3]] + pickle.dumps(_Touch(str(target)), protocol=2) + raw[ends[4]:]
    (tmp_path / "fifth.pt").write_bytes(evil)
    with pytest.raises(UnsafeCheckpointError) as exc:
        read_checkpoint(tmp_path / "fifth.pt")
    _one_line(exc)
    assert not target.exists()


def test_a_legacy_stream_with_a_zip_appended_is_read_as_torch_reads_it(tmp_path):
    """torch reads a file that does not start with ``PK\\x03\\x04`` as the legacy stream, so
    the stream is what is checked (and a benign zip appended changes nothing)."""
    target = tmp_path / "pwned"
    benign = tmp_path / "benign.pt"
    torch.save({"w": torch.ones(2)}, benign)
    path = tmp_path / "mixed.pt"
    path.write_bytes(pickle.dumps(_Touch(str(target)), protocol=2) + benign.read_bytes())
    with pytest.raises(UnsafeCheckpointError):
        read_checkpoint(path)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    (tmp_path / "tail.pt").write_bytes(legacy.read_bytes() + benign.read_bytes())
    with pytest.raises(CheckpointError, match="bytes after the last legacy storage"):
        read_checkpoint(tmp_path / "tail.pt")
    assert not target.exists()


def test_globals_another_library_allowed_are_not_honoured(tmp_path):
    target = tmp_path / "built"
    marker = _Marker()
    marker.__dict__["target"] = str(target)
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2), "m": marker}, path)
    torch.serialization.add_safe_globals([_Marker])
    try:
        with pytest.raises(UnsafeCheckpointError):
            read_checkpoint(path)
        assert _Marker in torch.serialization.get_safe_globals()  # restored after the load
    finally:
        torch.serialization.clear_safe_globals()
    assert not target.exists()


def test_expanded_and_overlapping_views_are_refused_unexpanded(tmp_path):
    torch.save({"e": torch.ones(1).expand(1 << 30)}, tmp_path / "e.pt")
    with pytest.raises(CheckpointError, match="stride-0") as exc:
        read_checkpoint(tmp_path / "e.pt")
    _one_line(exc)
    base = torch.arange(8.0)
    torch.save({"o": base.as_strided((4, 4), (1, 1))}, tmp_path / "o.pt")
    with pytest.raises(CheckpointError, match="overlapping view"):
        read_checkpoint(tmp_path / "o.pt")
    big = torch.arange(4096.0)
    torch.save({f"v{i}": big for i in range(64)}, tmp_path / "many.pt")  # one storage, 64 names
    with pytest.raises(CheckpointError, match="more than 4x the file"):
        read_checkpoint(tmp_path / "many.pt")


def _patch_size(data: bytes, old: int, new: int) -> bytes:
    """Replace every ``BININT1 old`` by ``BININT new`` (element counts and shapes)."""
    return data.replace(b"K" + bytes([old]), b"J" + struct.pack("<i", new))


def test_storages_declared_larger_than_the_file_are_refused(tmp_path):
    zipped = tmp_path / "z.pt"
    torch.save({"w": torch.arange(4.0)}, zipped)
    _rewrite_zip(zipped, tmp_path / "big.pt",
                 lambda name, d: _patch_size(d, 4, 1 << 30) if name.endswith("data.pkl") else d)
    with pytest.raises(CheckpointError, match="storage") as exc:
        read_checkpoint(tmp_path / "big.pt")
    _one_line(exc)
    legacy = tmp_path / "l.pt"
    torch.save({"w": torch.arange(4.0)}, legacy, _use_new_zipfile_serialization=False)
    raw = legacy.read_bytes()
    ends = _legacy_pickles(raw)
    for n, obj in enumerate((_patch_size(raw[ends[2]:ends[3]], 4, 1 << 30),)):
        (tmp_path / f"lb{n}.pt").write_bytes(raw[:ends[2]] + obj + raw[ends[3]:])
        with pytest.raises(CheckpointError, match="legacy storage"):
            read_checkpoint(tmp_path / f"lb{n}.pt")
    (tmp_path / "short.pt").write_bytes(raw[:-4])  # the last storage cut short
    with pytest.raises(CheckpointError, match="does not hold"):
        read_checkpoint(tmp_path / "short.pt")


def test_compressed_members_are_bounded_before_inflating(tmp_path):
    torch.save({"w": torch.zeros(1 << 20)}, tmp_path / "w.pt")
    _rewrite_zip(tmp_path / "w.pt", tmp_path / "deflated.pt", lambda _n, d: d, zipfile.ZIP_DEFLATED)
    with pytest.raises(CheckpointError, match="is compressed"):
        read_checkpoint(tmp_path / "deflated.pt")
    np.savez_compressed(tmp_path / "bomb.npz", a=np.zeros(1 << 24, dtype=np.float32))  # 64 MB -> ~65 KB
    assert (tmp_path / "bomb.npz").stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match="compression bomb") as exc:
        read_checkpoint(tmp_path / "bomb.npz")
    _one_line(exc)
    np.savez_compressed(tmp_path / "ok.npz", a=np.zeros(1000, dtype=np.float32), b=np.arange(6.0).reshape(2, 3))
    ok = read_checkpoint(tmp_path / "ok.npz")
    assert ok.shapes == {"a": (1000,), "b": (2, 3)} and ok.tensors["b"][1, 2] == 5


def test_an_npy_header_declaring_more_than_its_member_is_refused(tmp_path):
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000,), }"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 8
    with zipfile.ZipFile(tmp_path / "liar.npz", "w") as archive:
        archive.writestr("a.npy", npy)
    with pytest.raises(CheckpointError, match="declares 8000000000 bytes"):
        read_checkpoint(tmp_path / "liar.npz")
    np.savez(tmp_path / "c.npz", a=np.ones(2, dtype=np.complex64))
    with pytest.raises(CheckpointError, match="not a real number"):
        read_checkpoint(tmp_path / "c.npz")


def test_complex_and_sparse_tensors_are_refused(tmp_path):
    torch.save({"c": torch.ones(2, dtype=torch.complex64)}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="complex64; lipcli imports real-valued weights only"):
        read_checkpoint(tmp_path / "c.pt")
    torch.save({"s": torch.eye(3).to_sparse()}, tmp_path / "s.pt")
    with pytest.raises(CheckpointError, match="sparse|not a dense tensor|refused"):
        read_checkpoint(tmp_path / "s.pt")


def test_the_format_is_the_first_bytes_not_the_name(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.arange(3.0)}, tmp_path / "named.pt")  # safetensors under a .pt name
    assert read_checkpoint(tmp_path / "named.pt").format == "safetensors"
    torch.save({"a": torch.arange(3.0)}, tmp_path / "named.npz")  # a torch zip named .npz
    assert read_checkpoint(tmp_path / "named.npz").format == "torch-pickle"
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        read_checkpoint(tmp_path / "empty.pt")


def test_peak_memory_stays_near_the_file_size(tmp_path):
    """In a fresh process: the attacks above that declare gigabytes raise the peak resident
    memory by far less than they declare."""
    torch.save({"e": torch.ones(1).expand(1 << 30)}, tmp_path / "e.pt")
    np.savez_compressed(tmp_path / "bomb.npz", a=np.zeros(1 << 26, dtype=np.uint8))
    script = (
        "import resource, sys\n"
        "from lipcli.sdk.checkpoints import read_checkpoint, CheckpointError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "for p in sys.argv[1:]:\n"
        "    try: read_checkpoint(p)\n"
        "    except CheckpointError: pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "e.pt"), str(tmp_path / "bomb.npz")],
                         capture_output=True, text=True, check=True)
    grown_kib = int(out.stdout.split()[-1])
    assert grown_kib < 32 * 1024, json.dumps({"grown_kib": grown_kib})
