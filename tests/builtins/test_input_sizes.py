"""Inputs of 32·2^k pixels: LipConvnet-n at 64 and 128, ``imagefolder:size=``, model files
that record the input shape and certification that checks it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from jacobian_helpers import dense_jacobian

from lipcli.builtins.datasets import load_imagefolder
from lipcli.builtins.lipconvnet import extra_blocks
from lipcli.cli import app
from lipcli.sdk.errors import LipUsageError
from lipcli.host.modelfile import read_metadata
from lipcli.host.models import create_model, load_model

runner = CliRunner()


@pytest.mark.parametrize("size, k", [(32, 0), (64, 1), (128, 2), (256, 3)])
def test_extra_blocks(size, k):
    assert extra_blocks((size, size)) == k


@pytest.mark.parametrize("size", [(48, 48), (16, 16), (64, 32), (96, 96)])
def test_other_sizes_are_rejected(size):
    with pytest.raises(ValueError, match="32·2\\^k"):
        extra_blocks(size)


def test_a_model_for_another_size_is_one_usage_error():
    with pytest.raises(LipUsageError, match=r"^arch 'lipconvnet-5': LipConvnet needs square inputs .* got 48x48$"):
        create_model("lipconvnet-5", width=8, image_size=(48, 48))


def test_layout_follows_the_input_size():
    small = create_model("lipconvnet-10", width=2)
    names32 = [n for n, _ in small.body.named_children()]
    # 32 x 32: the paper's layout and layer names (model files stay loadable)
    assert names32[-3:] == ["block5_conv1", "block5_pool", "flatten"] and "block5_down" in names32
    assert "block6_down" not in names32 and small.feature_dim == 32 * 2
    big = create_model("lipconvnet-10", width=2, image_size=(64, 64))
    rows = big.describe()
    assert rows[0][1] == (3, 64, 64)
    downs = [r for r in rows if r[0].endswith("_down")]
    assert [r[0] for r in downs] == [f"block{i}_down" for i in range(1, 7)]
    assert [r[2][1] for r in downs] == [32, 16, 8, 4, 2, 1]  # every stride-2 block halves
    assert big.feature_dim == 64 * 2 and rows[-1] == ("head", (128,), (10,))
    # every block has depth/5 convolutions: 6 * 2 + 1 for LipConvnet-10 at 64 x 64
    assert sum(1 for n, _ in big.body.named_children() if "conv" in n or n.endswith("_down")) == 13
    assert big(torch.rand(2, 3, 64, 64)).shape == (2, 10)
    with pytest.raises(ValueError, match=r"expects inputs \(N, 3, 64, 64\)"):
        big(torch.rand(1, 3, 32, 32))
    huge = create_model("lipconvnet-5", width=2, image_size=(128, 128), head="mlp:hidden=4")
    assert huge.feature_dim == 2 ** (6 + 2) * 2 and huge(torch.rand(1, 3, 128, 128)).shape == (1, 10)


def test_64px_guaranteed_bound_dominates_the_dense_jacobian_norm():
    """At 64 x 64 too: the guaranteed bound >= ||d features / d x||₂ (dense, float64)."""
    torch.manual_seed(5)
    model = create_model("lipconvnet-5", width=2, image_size=(64, 64)).double().eval()
    model.refresh_power_iteration(50)
    bound = model.lipschitz_upper_bound()
    assert 0.999999 / 0.2507 <= bound < 1.2 / 0.2507
    for p in model.parameters():
        p.requires_grad_(False)
    d = model.feature_dim  # 128 rows, 12,288 columns
    gen = torch.Generator().manual_seed(6)
    for _ in range(2):
        x = torch.rand(1, 3, 64, 64, dtype=torch.float64, generator=gen)
        jac = dense_jacobian(model.features, x)  # d rows, 12,288 columns
        sigma = float(torch.linalg.matrix_norm(jac, ord=2))
        assert 0.5 / 0.2507 < sigma <= bound


def _tree(root: Path, sizes=(64, 48, 80)) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, per in (("train", 6), ("test", 3)):
        for c, name in enumerate(("a", "b")):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(per):
                s = sizes[i % len(sizes)]
                arr = rng.integers(0, 256, (s, s, 3), dtype=np.uint8)
                arr[..., c] = 255  # a class cue
                Image.fromarray(arr, "RGB").save(d / f"{i}.png")
    return root


def test_imagefolder_size_keeps_native_images_and_resizes_others(tmp_path):
    from PIL import Image

    root = _tree(tmp_path / "t")
    ds = load_imagefolder(root, "train", size=64)
    x, _ = ds[0]  # a native 64 x 64 image: exactly its pixels
    native = torch.from_numpy(np.asarray(Image.open(root / "train" / "a" / "0.png"))).permute(2, 0, 1)
    assert x.shape == (3, 64, 64) and torch.equal(x, native.float() / 255)
    assert ds[1][0].shape == (3, 64, 64)  # 48 x 48 resized up
    aug = load_imagefolder(root, "train", size=64, augment=True)
    assert aug.transform.size == 64 and aug.transform.padding == 8
    assert load_imagefolder(root, "train").decode_all().shape[1:] == (3, 32, 32)  # default 32
    with pytest.raises(LipUsageError, match="size must be one of 32, 64"):
        load_imagefolder(root, "train", size=48)


def test_train_and_certify_at_64px(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = _tree(tmp_path / "t")
    (tmp_path / "tiny.toml").write_text('power_iter_steps = 2\nlipschitz_estimate = false\ndevice = "cpu"\n')
    r = runner.invoke(app, ["train", "--dataset", "imagefolder:size=64", "--data-dir", str(root),
                            "--width", "2", "--epochs", "1", "--batch-size", "6",
                            "--config", "tiny.toml", "--out", "m.safetensors"])
    assert r.exit_code == 0, r.output
    meta = read_metadata("m.safetensors")
    assert meta["config"]["image_size"] == [64, 64] and meta["dataset"]["image_shape"] == [3, 64, 64]
    model, _ = load_model("m.safetensors")
    assert model.image_size == (64, 64)
    r = runner.invoke(app, ["certify", "m.safetensors", "--radii", "36", "--json"])
    assert r.exit_code == 0, r.output
    # the same tree at the default 32 x 32 does not fit the model: one line, exit 2
    r = runner.invoke(app, ["certify", "m.safetensors", "--dataset", "imagefolder", "--data-dir", str(root)])
    assert r.exit_code == 2 and "expects (3, 64, 64)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
