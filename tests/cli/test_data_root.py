"""The default data root (issue 26 item 1): ``lip train --arch ... --head mlp`` works as typed.
CIFAR without ``--data-dir`` lives in ``$LIPCLI_DATA`` (else the user cache folder +
``lipcli/data``), printed on stderr, downloaded there when missing (torchvision's downloader,
MD5-checked) unless ``--no-download``; offline it is one line naming the folder to fill and
``--dataset digits``.  Nothing here touches the network: a pre-seeded cache, and a file
server on 127.0.0.1 serving a tiny archive."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import torchvision
from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.data import loaders as host_data
from lipcli.host.modelfile import read_metadata

from conftest import save_tiny_model, write_cifar10

runner = CliRunner()
TINY = ["--arch", "lipconvnet-5", "--width", "4", "--epochs", "1", "--limit-train", "8",
        "--limit-test", "4", "--batch-size", "8", "--device", "cpu", "--no-lipschitz-estimate"]


@pytest.mark.parametrize("platform, env, expected", [
    ("linux", {"XDG_CACHE_HOME": "/x/cache"}, "/x/cache"),
    ("linux", {"XDG_CACHE_HOME": "relative"}, "HOME/.cache"),
    ("linux", {}, "HOME/.cache"),
    ("darwin", {"XDG_CACHE_HOME": "/x/cache"}, "HOME/Library/Caches"),
    ("win32", {"LOCALAPPDATA": "/w/local"}, "/w/local"),
    ("win32", {}, "HOME/AppData/Local"),
])
def test_user_cache_dir_per_platform(monkeypatch, tmp_path, platform, env, expected):
    monkeypatch.setattr(sys, "platform", platform)
    for name in ("XDG_CACHE_HOME", "LOCALAPPDATA", "LIPCLI_DATA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    want = Path(expected.replace("HOME", str(tmp_path)))
    assert host_data.user_cache_dir() == want
    assert host_data.default_data_root() == want / "lipcli" / "data"
    monkeypatch.setenv("LIPCLI_DATA", str(tmp_path / "mine"))
    assert host_data.default_data_root() == tmp_path / "mine"


def test_the_command_as_typed_uses_the_seeded_cache(tmp_path):
    """A real ``lip train --head mlp`` (no --data-dir) reads the CIFAR-10 in the user cache
    folder, says which folder, and ``lip certify`` of its model finds it again."""
    cache = tmp_path / "cache"
    root = write_cifar10(cache / "lipcli" / "data")
    env = {k: v for k, v in os.environ.items() if k != "LIPCLI_DATA"}
    env.update(XDG_CACHE_HOME=str(cache), HOME=str(tmp_path), OMP_NUM_THREADS="1")
    out = tmp_path / "m.safetensors"
    r = subprocess.run([sys.executable, "-m", "lipcli", "train", "--head", "mlp", *TINY, "--out", str(out)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (f"data: {root} (the default data root; set LIPCLI_DATA or pass --data-dir to use "
            "another)") in r.stderr.splitlines()
    meta = read_metadata(out)
    assert meta["dataset"]["root"] == str(root) and meta["config"]["head"]["name"] == "mlp"
    assert meta["training"]["config"]["download"] is True  # downloads there when missing


def _archive(tmp_path: Path) -> tuple[Path, str]:
    """A tiny ``cifar-10-python.tar.gz`` as published (one top folder) and its MD5."""
    src = write_cifar10(tmp_path / "src", per_batch=4, test=6)
    serve = tmp_path / "serve"
    serve.mkdir(exist_ok=True)
    tgz = serve / torchvision.datasets.CIFAR10.filename
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return tgz, hashlib.md5(tgz.read_bytes()).hexdigest()


@pytest.fixture
def file_server(tmp_path):
    """A local HTTP server for ``tmp_path/serve``; yields its base URL."""
    (tmp_path / "serve").mkdir(exist_ok=True)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path / "serve")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _point_cifar10_at(monkeypatch, url: str, md5: str) -> None:
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", url)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", md5)


def test_first_use_downloads_into_the_default_root(tmp_path, monkeypatch, file_server):
    tgz, md5 = _archive(tmp_path)
    _point_cifar10_at(monkeypatch, f"{file_server}/{tgz.name}", md5)
    root = tmp_path / "data"
    monkeypatch.setenv("LIPCLI_DATA", str(root))
    r = runner.invoke(app, ["train", *TINY, "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 0, r.output
    assert f"data: {root} (the default data root" in r.stderr
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()
    assert not (root / tgz.name).exists()  # the archive is removed after unpacking
    # the same model certified without --data-dir on a machine where its recorded folder is
    # gone: the default root again
    root.rename(tmp_path / "moved")
    other = tmp_path / "other"
    monkeypatch.setenv("LIPCLI_DATA", str(other))
    r = runner.invoke(app, ["certify", str(tmp_path / "m.safetensors"), "--limit", "4", "--radii", "36",
                            "--no-write", "--json", "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["dataset"]["root"] == str(other)
    assert (other / "cifar-10-batches-py" / "batches.meta").is_file()


def test_a_bad_checksum_is_refused(tmp_path, monkeypatch, file_server):
    tgz, _ = _archive(tmp_path)
    _point_cifar10_at(monkeypatch, f"{file_server}/{tgz.name}", "0" * 32)
    monkeypatch.setenv("LIPCLI_DATA", str(tmp_path / "data"))
    r = runner.invoke(app, ["train", *TINY, "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 1, r.output
    assert "does not match the published MD5 checksum" in r.stderr
    assert not (tmp_path / "data" / "cifar-10-batches-py").exists()


def test_offline_is_one_line_naming_the_folder_and_digits(tmp_path, monkeypatch):
    _point_cifar10_at(monkeypatch, "http://127.0.0.1:9/cifar-10-python.tar.gz", "0" * 32)  # discard port: refused
    root = tmp_path / "data"
    monkeypatch.setenv("LIPCLI_DATA", str(root))
    r = runner.invoke(app, ["train", "--head", "mlp", "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 1, r.output
    line = r.stderr.splitlines()[-1]
    assert line.startswith(f"error: could not download cifar10 into {root} (")
    assert "put the folder cifar-10-batches-py" in line and f"in {root}, or" in line
    assert line.endswith("or use the embedded data set: --dataset digits")
    assert r.stderr.count("error:") == 1 and "Traceback" not in r.output


def test_no_download_and_an_explicit_data_dir_never_download(tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("no download expected")

    monkeypatch.setattr(torchvision.datasets.utils, "download_and_extract_archive", forbidden)
    monkeypatch.setenv("LIPCLI_DATA", str(tmp_path / "data"))
    r = runner.invoke(app, ["train", *TINY, "--no-download", "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2, r.output
    assert f"data directory {tmp_path / 'data'} does not exist (dataset 'cifar10')" in r.stderr
    (tmp_path / "mine").mkdir()
    r = runner.invoke(app, ["train", *TINY, "--data-dir", str(tmp_path / "mine"),
                            "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2, r.output
    assert "data: " not in r.stderr and "CIFAR-10 not found in" in r.stderr


def test_digits_and_imagefolder_get_no_default_root(tmp_path, monkeypatch):
    monkeypatch.setenv("LIPCLI_DATA", str(tmp_path / "data"))
    r = runner.invoke(app, ["train", "--dataset", "imagefolder", *TINY, "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2 and "needs a data directory" in r.stderr and "data: " not in r.stderr
    model = save_tiny_model(tmp_path / "d.safetensors", dataset={"name": "digits", "params": {}, "num_classes": 10})
    r = runner.invoke(app, ["certify", str(model), "--limit", "4", "--radii", "36", "--no-write", "-q"])
    assert r.exit_code == 0 and "data: " not in r.stderr


# --------------------------------------------------------------------------------------------
# issue 34: the offline command is one line; errors name where the data root comes from
# --------------------------------------------------------------------------------------------
def _offline(monkeypatch) -> list:
    """No download can succeed (and none reaches the network): torchvision's downloader fails
    as it does without a connection; returns the list of attempted calls."""
    import urllib.error

    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(torchvision.datasets.utils, "download_and_extract_archive", offline)
    return calls


def _one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_the_users_offline_command_is_one_line(tmp_path, monkeypatch):
    """``lip train --arch lipconvnet-20 --head mlp`` with no network: the error alone (no
    ``data:`` note before it), naming the folder, that LIPCLI_DATA chose it, and digits."""
    calls = _offline(monkeypatch)
    root = tmp_path / "empty"
    root.mkdir()
    monkeypatch.setenv("LIPCLI_DATA", str(root))
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["train", "--arch", "lipconvnet-20", "--head", "mlp"])
    assert r.exit_code == 1 and len(calls) == 1, r.output
    line = _one_error_line(r.stderr)
    assert line.startswith(f"error: could not download cifar10 into {root} (LIPCLI_DATA; ")
    assert "Temporary failure in name resolution" in line and line.endswith("--dataset digits")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and list(root.iterdir()) == []


def test_the_users_offline_command_is_one_line_in_a_real_process(tmp_path):
    """The same as a real ``lip`` process; every download goes to a proxy on 127.0.0.1's
    discard port, which refuses it (nothing leaves the machine)."""
    root = tmp_path / "empty"
    root.mkdir()
    proxy = "http://127.0.0.1:9"
    env = {**os.environ, "LIPCLI_DATA": str(root), "OMP_NUM_THREADS": "1", "http_proxy": proxy,
           "https_proxy": proxy, "HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "no_proxy": "", "NO_PROXY": ""}
    r = subprocess.run([sys.executable, "-m", "lipcli", "train", "--arch", "lipconvnet-20", "--head", "mlp"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 1, r.stderr
    line = _one_error_line(r.stderr)
    assert line.startswith(f"error: could not download cifar10 into {root} (LIPCLI_DATA; ")
    assert "Traceback" not in r.stderr and list(root.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no run directory either


def test_data_root_errors_name_what_was_set_and_what_is_wrong(tmp_path, monkeypatch):
    _offline(monkeypatch)
    monkeypatch.chdir(tmp_path)
    out = ["--out", str(tmp_path / "m.safetensors")]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    missing = tmp_path / "missing"
    monkeypatch.setenv("LIPCLI_DATA", str(missing))
    r = runner.invoke(app, ["train", *TINY, "--no-download", *out])
    assert r.exit_code == 2
    assert _one_error_line(r.stderr) == (f"error: LIPCLI_DATA: data directory {missing} does not exist "
                                         "(dataset 'cifar10')")
    monkeypatch.setenv("LIPCLI_DATA", str(a_file))
    r = runner.invoke(app, ["train", *TINY, *out])
    assert r.exit_code == 2
    assert _one_error_line(r.stderr) == (f"error: LIPCLI_DATA: data directory {a_file} is a file, not a "
                                         "directory (dataset 'cifar10')")
    r = runner.invoke(app, ["train", *TINY, "--data-dir", str(a_file), *out])
    assert r.exit_code == 2
    assert _one_error_line(r.stderr) == (f"error: --data-dir: data directory {a_file} is a file, not a "
                                         "directory (dataset 'cifar10')")
    # the default root (no LIPCLI_DATA) inside a file: it cannot be created for the download
    monkeypatch.delenv("LIPCLI_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(a_file))
    monkeypatch.setattr(sys, "platform", "linux")
    r = runner.invoke(app, ["train", *TINY, *out])
    assert r.exit_code == 2
    assert _one_error_line(r.stderr) == (
        "error: the default data root (set LIPCLI_DATA or pass --data-dir to use another): data directory "
        f"{a_file}/lipcli/data does not exist and cannot be created for the download: {a_file} is a file "
        "(dataset 'cifar10')")
    # lip certify, whose model's recorded folder is gone: the default root, named the same way
    monkeypatch.setenv("LIPCLI_DATA", str(missing))
    model = save_tiny_model(tmp_path / "c.safetensors", dataset={"name": "cifar10", "params": {},
                                                                 "root": str(tmp_path / "gone")})
    r = runner.invoke(app, ["certify", str(model), "--no-download", "--limit", "4", "--no-write"])
    assert r.exit_code == 2
    assert _one_error_line(r.stderr).startswith(f"error: LIPCLI_DATA: data directory {missing} does not exist")


def test_a_data_root_that_cannot_take_the_download_is_named(tmp_path, monkeypatch):
    from lipcli.builtins.datasets import cifar

    calls = _offline(monkeypatch)
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setattr(cifar, "cannot_create_in", lambda d: f"directory {d} is not writable (read-only?)")
    monkeypatch.setenv("LIPCLI_DATA", str(root))
    r = runner.invoke(app, ["train", *TINY, "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2 and calls == []
    assert _one_error_line(r.stderr) == (f"error: LIPCLI_DATA: data directory {root} has no CIFAR-10 and "
                                         f"cannot take the download: directory {root} is not writable (read-only?)")
    write_cifar10(root)  # a read-only root that holds the data set is fine
    r = runner.invoke(app, ["train", *TINY, "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines().count(f"data: {root} (the default data root; set LIPCLI_DATA or pass "
                                       "--data-dir to use another)") == 1


def test_a_damaged_archive_in_the_data_root_is_named(tmp_path, monkeypatch):
    _offline(monkeypatch)
    root = tmp_path / "data"
    root.mkdir()
    (root / torchvision.datasets.CIFAR10.filename).write_bytes(b"garbage, not a tar.gz")
    monkeypatch.setenv("LIPCLI_DATA", str(root))
    r = runner.invoke(app, ["train", *TINY, "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 1
    line = _one_error_line(r.stderr)
    assert line.startswith(f"error: could not download cifar10 into {root} (LIPCLI_DATA; ")
    assert ("; the cifar-10-python.tar.gz found there is damaged (not the published MD5 checksum): "
            "delete it); offline, put the folder cifar-10-batches-py") in line
    r = runner.invoke(app, ["train", *TINY, "--no-download", "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2
    line = _one_error_line(r.stderr)
    assert line.startswith(f"error: LIPCLI_DATA: CIFAR-10 not found in {root} (missing ")
    assert line.endswith("; the cifar-10-python.tar.gz there is damaged (not the published MD5 checksum); "
                         "downloading fetches it")


def test_an_image_folder_with_an_empty_class_folder_is_one_line(tmp_path, imagefolder_writer):
    root = imagefolder_writer(tmp_path / "tree")
    (root / "train" / "nothing").mkdir()
    r = runner.invoke(app, ["train", "--dataset", "imagefolder", "--data-dir", str(root), *TINY,
                            "--out", str(tmp_path / "m.safetensors")])
    assert r.exit_code == 2
    assert _one_error_line(r.stderr).startswith(f"error: class folder {root / 'train' / 'nothing'} has no images; ")
    assert not (tmp_path / "m.safetensors").exists()
