"""Built-in data sets (lipcli.builtins.datasets) and data plumbing (lipcli.data.loaders), on tiny
folders written in the real on-disk layouts by the fixtures of conftest.py."""

from __future__ import annotations

import os
import pickle
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lipcli.builtins import datasets as D
from lipcli.builtins.datasets.plugin import lip_datasets
from lipcli.data.loaders import (
    epoch_seed, eval_loader, limit_indices, load_data, resolve_dataset, split_indices, train_loader,
)
from lipcli.sdk.errors import LipUsageError, SettingError
from lipcli.host.plugins import get_registry

from conftest import CIFAR10_LABEL_NAMES, CIFAR_PER_BATCH, CIFAR_TEST, IMAGEFOLDER_CLASSES


def specs() -> dict:
    return {s.name: s for s in lip_datasets()}


def _is_crop_of(aug: torch.Tensor, original: torch.Tensor, padding: int, allow_flip: bool) -> tuple[bool, bool]:
    """Whether ``aug`` equals a ``32x32`` crop of the zero-padded ``original`` (or its mirror)."""
    padded = F.pad(original, (padding,) * 4)
    for flipped in ((False, True) if allow_flip else (False,)):
        src = padded.flip(-1) if flipped else padded
        for top in range(2 * padding + 1):
            for left in range(2 * padding + 1):
                if torch.equal(src[:, top : top + 32, left : left + 32], aug):
                    return True, flipped
    return False, False


# --------------------------------------------------------------------------------------------
def test_registry_has_the_builtin_datasets():
    reg = get_registry()
    assert {"cifar10", "cifar100", "imagefolder", "digits"} <= set(reg.names("dataset"))
    s = specs()
    assert s["cifar10"].mean == (0.4914, 0.4822, 0.4465) and s["cifar10"].std == (0.2507,) * 3
    assert s["cifar100"].mean == s["cifar10"].mean and s["cifar100"].std == s["cifar10"].std
    assert s["cifar10"].num_classes == 10 and s["cifar100"].num_classes == 100
    assert s["imagefolder"].num_classes is None
    assert s["digits"].needs_root is False and s["cifar10"].needs_root is True


def test_specs_pass_the_plugin_checker():
    from lipcli import testing
    for spec in lip_datasets():
        testing.check_component_spec(spec)


def test_cifar10_loader_reads_the_real_layout_exactly(cifar10_root):
    train = D.load_cifar("cifar10", cifar10_root, "train")
    test = D.load_cifar("cifar10", cifar10_root, "test")
    assert len(train) == 5 * CIFAR_PER_BATCH and len(test) == CIFAR_TEST
    assert train.classes == CIFAR10_LABEL_NAMES
    # compare with the pickles themselves (pixel for pixel, channel-major rows)
    with open(cifar10_root / "cifar-10-batches-py" / "data_batch_2", "rb") as fh:
        batch = pickle.load(fh)
    for j in range(CIFAR_PER_BATCH):
        x, y = train[CIFAR_PER_BATCH + j]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        expected = torch.from_numpy(batch["data"][j].reshape(3, 32, 32)).float() / 255
        assert torch.equal(x, expected)
        assert y == batch["labels"][j]
    assert train.targets[:CIFAR_PER_BATCH] == pickle.load(
        open(cifar10_root / "cifar-10-batches-py" / "data_batch_1", "rb"))["labels"]


def test_cifar10_python2_style_bytes_keys(tmp_path, cifar10_writer):
    root = cifar10_writer(tmp_path, per_batch=2, test=3, bytes_keys=True)
    ds = D.load_cifar("cifar10", root, "test")
    assert len(ds) == 3 and ds.classes == CIFAR10_LABEL_NAMES


def test_cifar100_fine_labels(cifar100_root):
    train = D.load_cifar("cifar100", cifar100_root, "train")
    assert len(train.classes) == 100 and train.classes[7] == "fine07"
    with open(cifar100_root / "cifar-100-python" / "train", "rb") as fh:
        raw = pickle.load(fh)
    assert train.targets == raw["fine_labels"]


def test_missing_cifar_names_the_expected_layout(tmp_path):
    # library errors name the setting (download, data_dir), not a command-line flag
    with pytest.raises(SettingError, match=r"cifar-10-batches-py.*data_batch_1.*downloading fetches it") as info:
        D.load_cifar("cifar10", tmp_path, "train")
    assert info.value.setting == "download" and "--" not in str(info.value)
    with pytest.raises(LipUsageError, match=r"cifar-100-python"):
        D.load_cifar("cifar100", tmp_path, "test")
    assert list(tmp_path.iterdir()) == []  # nothing downloaded or created
    with pytest.raises(SettingError, match="needs a data directory") as info:
        D.load_cifar("cifar10", None, "train")
    assert info.value.setting == "data_dir"


def test_cifar_refuses_pickles_that_run_code(tmp_path, cifar10_writer):
    root = cifar10_writer(tmp_path, per_batch=2, test=2)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(root / "cifar-10-batches-py" / "test_batch", "wb") as fh:
        pickle.dump({"data": Evil(), "labels": [0]}, fh, protocol=2)
    with pytest.raises(LipUsageError, match="refusing to load global"):
        D.load_cifar("cifar10", root, "test")
    assert not marker.exists()


def test_cifar_rejects_malformed_batches(tmp_path, cifar10_writer):
    root = cifar10_writer(tmp_path, per_batch=2, test=2)
    with open(root / "cifar-10-batches-py" / "test_batch", "wb") as fh:
        pickle.dump({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, fh, protocol=2)
    with pytest.raises(LipUsageError, match=r"shape \(N, 3072\)"):
        D.load_cifar("cifar10", root, "test")
    with open(root / "cifar-10-batches-py" / "test_batch", "wb") as fh:
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}, fh, protocol=2)
    with pytest.raises(LipUsageError, match="labels outside"):
        D.load_cifar("cifar10", root, "test")


def test_unknown_split_is_a_usage_error(cifar10_root):
    with pytest.raises(LipUsageError, match="unknown split"):
        D.load_cifar("cifar10", cifar10_root, "validation")


def test_cifar_augmentation_is_pad4_crop_and_flip(cifar10_root):
    plain = D.load_cifar("cifar10", cifar10_root, "train")
    aug = D.load_cifar("cifar10", cifar10_root, "train", augment=True)
    torch.manual_seed(0)
    flips = shifted = 0
    for i in range(12):
        a, ya = aug[i]
        p, yp = plain[i]
        assert ya == yp and a.shape == (3, 32, 32)
        ok, flipped = _is_crop_of(a, p, 4, allow_flip=True)
        assert ok, "augmented image is not a padded crop (or its mirror) of the original"
        flips += flipped
        shifted += not torch.equal(a, p)
    assert 0 < flips < 12 and shifted > 6  # both flips and shifts actually happen


def test_digits_fixed_split_and_constants():
    train = D.load_digits_dataset("train")
    test = D.load_digits_dataset("test")
    assert len(train) == 1437 and len(test) == 360 and train.classes == [str(i) for i in range(10)]
    tr, te = D.digits_split_indices()
    assert not set(tr) & set(te) and len(set(tr) | set(te)) == 1797
    assert (tr, te) == D.digits_split_indices()  # deterministic
    counts = np.bincount(test.targets, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # stratified 20 %
    x, _ = train[0]
    assert x.shape == (3, 32, 32) and torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])
    assert 0 <= float(x.min()) and float(x.max()) <= 1
    mean, std = D.pixel_statistics(train.images)
    assert mean == pytest.approx(D.DIGITS_MEAN, abs=2e-4) and std == pytest.approx(D.DIGITS_STD, abs=2e-4)


def test_digits_augmentation_never_mirrors():
    plain = D.load_digits_dataset("train")
    aug = D.load_digits_dataset("train", augment=True)
    torch.manual_seed(1)
    for i in range(10):
        ok, flipped = _is_crop_of(aug[i][0], plain[i][0], 4, allow_flip=False)
        assert ok and not flipped


def test_imagefolder_tree(imagefolder_root):
    train = D.load_imagefolder(imagefolder_root, "train")
    test = D.load_imagefolder(imagefolder_root, "test")
    assert train.classes == sorted(IMAGEFOLDER_CLASSES) and len(train) == 18 and len(test) == 9
    for ds in (train, test):
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and 0 <= y < 3
            assert 0 <= float(x.min()) and float(x.max()) <= 1
    # the 32x32 RGB PNG of each class is decoded exactly
    from PIL import Image

    first = imagefolder_root / "train" / "circle" / "0.png"
    arr = np.asarray(Image.open(first).convert("RGB")).transpose(2, 0, 1)
    idx = [p for p, _ in train.samples].index(str(first))
    assert torch.equal(train[idx][0], torch.from_numpy(arr.copy()).float() / 255)
    # cached and uncached give the same tensors
    lazy = D.load_imagefolder(imagefolder_root, "train", cache=False)
    assert all(torch.equal(lazy[i][0], train[i][0]) for i in range(len(train)))


def test_imagefolder_test_labels_follow_train_numbering(tmp_path, imagefolder_writer):
    root = imagefolder_writer(tmp_path, test_classes=("square",))
    test = D.load_imagefolder(root, "test")
    assert set(test.targets) == {2} and test.classes == ["circle", "cross", "square"]


def test_imagefolder_errors(tmp_path, imagefolder_writer):
    with pytest.raises(LipUsageError, match=r"train/<class>/<image>"):
        D.load_imagefolder(tmp_path, "train")
    root = imagefolder_writer(tmp_path / "a", test_classes=("circle", "zebra"))
    with pytest.raises(LipUsageError, match="zebra"):
        D.load_imagefolder(root, "test")
    with pytest.raises(LipUsageError, match="cannot be downloaded"):
        D.load_imagefolder(root, "train", download=True)


def test_imagefolder_refuses_an_empty_class_folder(tmp_path, imagefolder_writer):
    """A class folder without images (here: only a text file) would be a class that no image
    teaches; it is refused in the split that holds it, naming the folder (torchvision's
    ImageFolder refuses it too)."""
    root = imagefolder_writer(tmp_path)

    def empty_out(folder):
        folder.mkdir(exist_ok=True)
        for path in folder.iterdir():
            path.unlink()
        (folder / "notes.txt").write_text("not an image")
        return folder

    empty = empty_out(root / "train" / "empty")
    with pytest.raises(LipUsageError, match=rf"^class folder {re.escape(str(empty))} has no images; ") as err:
        D.load_imagefolder(root, "train")
    assert "\n" not in str(err.value)
    assert D.load_imagefolder(root, "test").classes == ["circle", "cross", "empty", "square"]  # numbering kept
    test_circle = empty_out(root / "test" / "circle")
    with pytest.raises(LipUsageError, match=rf"^class folder {re.escape(str(test_circle))} has no images"):
        D.load_imagefolder(root, "test")
    also = empty_out(root / "train" / "a-empty")
    with pytest.raises(LipUsageError, match=r"a-empty has no images \(and 1 more class folder"):
        D.load_imagefolder(root, "train")
    for folder in (empty, also):
        (folder / "notes.txt").unlink()
        folder.rmdir()
    assert D.load_imagefolder(root, "train").classes == ["circle", "cross", "square"]


def test_imagefolder_data_statistics(imagefolder_root):
    ds = D.load_imagefolder(imagefolder_root, "test", stats="data")
    ref = D.load_imagefolder(imagefolder_root, "train").decode_all().double() / 255
    mean = ref.mean(dim=(0, 2, 3))
    pooled = ref.var(dim=(0, 2, 3), unbiased=False).mean().sqrt()
    assert ds.mean == pytest.approx(tuple(mean.tolist()), abs=1e-4)
    assert ds.std == pytest.approx((float(pooled),) * 3, abs=1e-4)
    comp = get_registry().component("dataset", "imagefolder:stats=data")
    bundle = load_data(comp, str(imagefolder_root), augment=False)
    assert bundle.mean == ds.mean and bundle.std == ds.std


# --------------------------------------------------------------------------------------------
def test_subsets_and_validation_split_are_seeded_and_disjoint():
    a = limit_indices(100, 10, seed=3, salt="x")
    assert a == limit_indices(100, 10, seed=3, salt="x") and a != limit_indices(100, 10, seed=4, salt="x")
    assert len(set(a)) == 10 and limit_indices(5, 10, 0, "x") == list(range(5))
    train, val = split_indices(list(range(50)), 0.2, seed=0)
    assert len(val) == 10 and len(train) == 40 and not set(train) & set(val)
    with pytest.raises(LipUsageError):
        split_indices([1], 0.5, seed=0)
    assert epoch_seed(0, 1, 0) != epoch_seed(0, 2, 0) != epoch_seed(0, 1, 1)


def test_load_data_bundle(cifar10_root):
    comp = resolve_dataset("cifar10")
    b = load_data(comp, str(cifar10_root), val_split=0.25, limit_test=5, seed=0)
    assert b.num_classes == 10 and b.sizes == {"train": 30, "val": 10, "test": 5}
    assert b.mean == (0.4914, 0.4822, 0.4465) and b.image_shape == (3, 32, 32)
    val_idx = set(b.val.indices)
    assert not val_idx & set(b.train.indices)
    # the validation set is not augmented
    x1, _ = b.val[0]
    assert torch.equal(x1, b.val[0][0])
    info = b.info()
    assert info["name"] == "cifar10" and info["classes"] == CIFAR10_LABEL_NAMES


def test_unknown_dataset_name_lists_the_valid_ones():
    from lipcli.sdk.errors import UnknownComponentError

    with pytest.raises(UnknownComponentError, match="digits"):
        resolve_dataset("mnist")


def test_loaders_shard_and_reshuffle():
    ds = torch.utils.data.TensorDataset(torch.arange(10).float()[:, None], torch.arange(10))
    seen = []
    for rank in range(2):
        loader, sampler = train_loader(ds, batch_size=2, seed=0, rank=rank, world_size=2)
        sampler.set_epoch(0)
        seen.append([int(v) for _, y in loader for v in y])
    assert sorted(seen[0] + seen[1]) == list(range(10)) and len(seen[0]) == len(seen[1]) == 5
    loader, sampler = train_loader(ds, batch_size=10, seed=0)
    orders = []
    for epoch in (0, 1, 0):
        sampler.set_epoch(epoch)
        orders.append([int(v) for _, y in loader for v in y])
    assert orders[0] == orders[2] != orders[1]
    shards = [[int(v) for _, y in eval_loader(ds, batch_size=4, rank=r, world_size=3) for v in y] for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(10))  # no padding, no repeats
