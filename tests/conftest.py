"""Shared pytest fixtures: tiny data sets in the REAL on-disk layouts, and a tiny trained model.

Data folders (written by the tests themselves, nothing is downloaded):

``cifar10_root``  (session)  ``ROOT/cifar-10-batches-py/{data_batch_1..5, test_batch,
                  batches.meta}``, the torchvision / "python version" layout: pickled dicts
                  with ``data`` (uint8, N x 3072, channel-major RGB rows), ``labels``,
                  ``filenames``, ``batch_label``; ``batches.meta`` has ``label_names``.
                  :data:`CIFAR_PER_BATCH` images per training batch (40 train images),
                  :data:`CIFAR_TEST` test images.
``cifar100_root`` (session)  ``ROOT/cifar-100-python/{train, test, meta}`` with
                  ``fine_labels``/``coarse_labels`` and ``fine_label_names`` (100 classes).
``imagefolder_root`` (session)  ``ROOT/train/<class>/*.png`` and ``ROOT/test/<class>/*.png``
                  for classes :data:`IMAGEFOLDER_CLASSES`, images of mixed sizes and modes
                  (RGB, grey "L", RGBA) so that resizing and RGB conversion are exercised.

Images are learnable: each class has its own colour/brightness pattern plus noise
(:func:`class_image`), so a tiny model can beat chance.

Factories for custom variants (fixtures returning functions):
``write_cifar10(root, per_batch=..., test=..., seed=..., bytes_keys=False) -> root``,
``write_cifar100(root, train=..., test=..., seed=...) -> root``,
``write_imagefolder(root, classes=..., train_per_class=..., test_per_class=..., seed=...) -> root``.

Models: ``tiny_model_file`` (session) is a LipConvnet-5 of width 4 trained for one epoch on
64 ``digits`` images by the real ``lip train`` driver (LLN head); returns the model file path
(its run directory is the sibling ``tiny-run``).

Every helper is deterministic in its ``seed``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import save

CIFAR10_LABEL_NAMES = [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
]
CIFAR_PER_BATCH = 8
CIFAR_TEST = 12
IMAGEFOLDER_CLASSES = ("circle", "cross", "square")


@pytest.fixture(autouse=True)
def _no_user_data_root(tmp_path_factory, monkeypatch):
    """The default data root of every test is an empty folder of its own (never the user's
    cache): a test needing CIFAR there writes it (tests never download)."""
    monkeypatch.setenv("LIPCLI_DATA", str(tmp_path_factory.mktemp("data") / "no-data-root"))


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Every test starts with the session's torch thread count: CLI tests that pass
    ``--threads 1`` and expect a usage error set it before failing, and single-threaded
    CPU convolutions with 1x1 filters take another backend (THNN instead of oneDNN), which
    changes later tests' bit-identity checks."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped where no CUDA device is available."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def save_tiny_model(path: Path, *, dataset: dict | None, num_classes: int = 10,
                    head: str = "lln", seed: int = 0) -> Path:
    """An untrained LipConvnet-5 of width 4 (power iteration converged) saved at ``path``
    with the given ``dataset`` metadata slot; returns ``path``."""
    import torch

    from lipcli import create_model, save_model

    torch.manual_seed(seed)
    model = create_model("lipconvnet-5", width=4, num_classes=num_classes, head=head)
    model.refresh_power_iteration(30)
    save_model(model, path, dataset=dataset)
    return path


def class_image(label: int, num_classes: int, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """A learnable ``(3, size, size)`` uint8 image for ``label``: class colour + stripe + noise."""
    hue = label / max(num_classes, 1)
    base = np.array([np.cos(2 * np.pi * hue), np.cos(2 * np.pi * (hue + 1 / 3)),
                     np.cos(2 * np.pi * (hue + 2 / 3))]) * 80 + 128
    img = np.broadcast_to(base[:, None, None], (3, size, size)).astype(np.float64).copy()
    stripe = (label * 5) % size
    img[:, stripe : stripe + 4, :] = 255 - img[:, stripe : stripe + 4, :]
    img += rng.normal(0, 12, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _dump(path: Path, obj: dict, bytes_keys: bool = False) -> None:
    if bytes_keys:  # what the original Python 2 files look like when read with encoding="bytes"
        obj = {k.encode(): v for k, v in obj.items()}
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def _cifar_arrays(n: int, num_classes: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    labels = [int(v) for v in rng.integers(0, num_classes, size=n)]
    data = np.stack([class_image(lab, num_classes, rng).reshape(-1) for lab in labels]) if n else (
        np.zeros((0, 3072), np.uint8))
    return data.astype(np.uint8), labels


def write_cifar10(
    root: Path, *, per_batch: int = CIFAR_PER_BATCH, test: int = CIFAR_TEST, seed: int = 0,
    bytes_keys: bool = False,
) -> Path:
    """Write a tiny CIFAR-10 in torchvision's layout under ``root``; returns ``root``."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    for i in range(1, 6):
        data, labels = _cifar_arrays(per_batch, 10, rng)
        _dump(base / f"data_batch_{i}", {
            "batch_label": f"training batch {i} of 5", "labels": labels, "data": data,
            "filenames": [f"img_{i}_{j}.png" for j in range(per_batch)],
        }, bytes_keys)
    data, labels = _cifar_arrays(test, 10, rng)
    _dump(base / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": labels,
                                "data": data, "filenames": [f"test_{j}.png" for j in range(test)]},
          bytes_keys)
    _dump(base / "batches.meta", {"num_cases_per_batch": per_batch, "label_names": CIFAR10_LABEL_NAMES,
                                  "num_vis": 3072}, bytes_keys)
    return Path(root)


def write_cifar100(root: Path, *, train: int = 30, test: int = 10, seed: int = 0) -> Path:
    """Write a tiny CIFAR-100 (``cifar-100-python/{train,test,meta}``); returns ``root``."""
    rng = np.random.default_rng(seed)
    base = Path(root) / "cifar-100-python"
    base.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", train), ("test", test)):
        data, labels = _cifar_arrays(n, 100, rng)
        _dump(base / name, {"filenames": [f"{name}_{j}.png" for j in range(n)],
                            "batch_label": f"{name} batch", "fine_labels": labels,
                            "coarse_labels": [lab // 5 for lab in labels], "data": data})
    _dump(base / "meta", {"fine_label_names": [f"fine{i:02d}" for i in range(100)],
                          "coarse_label_names": [f"coarse{i:02d}" for i in range(20)]})
    return Path(root)


def write_imagefolder(
    root: Path, *, classes: tuple[str, ...] = IMAGEFOLDER_CLASSES, train_per_class: int = 6,
    test_per_class: int = 3, seed: int = 0, test_classes: tuple[str, ...] | None = None,
) -> Path:
    """Write ``root/{train,test}/<class>/<i>.png`` (mixed sizes and modes); returns ``root``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    modes = ("RGB", "L", "RGBA")
    sizes = (32, 20, 40)
    for split, per, names in (("train", train_per_class, classes),
                              ("test", test_per_class, test_classes or classes)):
        for name in names:
            label = classes.index(name) if name in classes else len(classes)
            d = Path(root) / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per):
                size = sizes[i % len(sizes)]
                arr = class_image(label, len(classes), rng, size=size).transpose(1, 2, 0)
                img = Image.fromarray(np.ascontiguousarray(arr), "RGB").convert(modes[i % len(modes)])
                img.save(d / f"{i}.png")
    return Path(root)


@pytest.fixture(scope="session")
def cifar10_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar10(tmp_path_factory.mktemp("cifar10"))


@pytest.fixture(scope="session")
def cifar100_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar100(tmp_path_factory.mktemp("cifar100"))


@pytest.fixture(scope="session")
def imagefolder_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_imagefolder(tmp_path_factory.mktemp("imagefolder"))


@pytest.fixture
def cifar10_writer() -> Callable[..., Path]:
    """:func:`write_cifar10` (for custom tiny CIFAR-10 folders)."""
    return write_cifar10


@pytest.fixture
def cifar100_writer() -> Callable[..., Path]:
    """:func:`write_cifar100`."""
    return write_cifar100


@pytest.fixture
def imagefolder_writer() -> Callable[..., Path]:
    """:func:`write_imagefolder`."""
    return write_imagefolder


@pytest.fixture(scope="session")
def tiny_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LipConvnet-5 (width 4, LLN) trained 1 epoch on 64 digits by ``lipcli.train.train``."""
    from lipcli.train import TrainConfig, train

    out = tmp_path_factory.mktemp("tiny_model") / "tiny.safetensors"
    cfg = TrainConfig(dataset="digits", width=4, epochs=1, batch_size=32, limit_train=64,
                      limit_test=32, device="cpu", lipschitz_estimate=False)
    train(cfg, out=str(out), quiet=True)
    return out


def forge(src: Path, dst: Path, edit=None, **raw: str) -> Path:
    """Copy ``src`` to ``dst`` with the config edited by ``edit(cfg)`` and raw metadata values."""
    with safe_open(str(src), "pt") as fh:
        meta = dict(fh.metadata())
        tensors = {k: fh.get_tensor(k).clone() for k in fh.keys()}
    if edit is not None:
        cfg = json.loads(meta["lipcli.config"])
        edit(cfg)
        meta["lipcli.config"] = json.dumps(cfg)
    meta.update({f"lipcli.{k}": v for k, v in raw.items()})
    dst.write_bytes(save(tensors, metadata=meta))
    return dst


#: session cache of :func:`memo_soc_build` (key -> (matrix, error)), with its byte total
_SOC_BUILDS: dict[tuple, tuple] = {}
_SOC_BUILDS_MAX_BYTES = 256 * 2**20


@pytest.fixture
def memo_soc_build(monkeypatch):
    """Reuse SOC's dense eval-operator builds (``operator_matrix_with_error``: float64, the
    bulk of every SOC lowering) within the session.  A build is reused only for the same
    call: a layer of the same class and configuration (``repr``), the same state (weights,
    bias, power vectors) and eval filter ``S`` (their bytes) on the same device, the same
    input shape, bound argument, chunk size and thread count; every other call builds.  The
    build itself is tested without it (tests/builtins/soc/test_soc_matrix_build.py); tests
    of what is done WITH the lowering (export, lowered networks), which lower the same tiny
    models again and again, opt in: ``pytest.mark.usefixtures("memo_soc_build")``."""
    import hashlib

    import torch

    from lipcli.builtins.soc import export as soc_export

    real = soc_export.operator_matrix_with_error

    def build(layer, input_shape, norm_bound=None):
        digest = hashlib.sha256()
        state = {**layer.state_dict(), " skew_filter": layer.skew_filter()}  # + the S it uses
        for name, tensor in sorted(state.items()):
            t = tensor.detach().cpu().contiguous()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        key = (type(layer).__module__, type(layer).__qualname__, repr(layer), digest.hexdigest(),
               str(next(layer.parameters()).device), tuple(int(d) for d in input_shape),
               None if norm_bound is None else float(norm_bound),
               soc_export.BUILD_CHUNK_BYTES, torch.get_num_threads())
        if key not in _SOC_BUILDS:
            matrix, err = real(layer, input_shape, norm_bound)
            total = sum(m.numel() * m.element_size() for m, _ in _SOC_BUILDS.values())
            if total + matrix.numel() * matrix.element_size() > _SOC_BUILDS_MAX_BYTES:
                _SOC_BUILDS.clear()
            _SOC_BUILDS[key] = (matrix.clone(), err)
            return matrix, err
        matrix, err = _SOC_BUILDS[key]
        return matrix.clone(), err

    monkeypatch.setattr(soc_export, "operator_matrix_with_error", build)
    return build
