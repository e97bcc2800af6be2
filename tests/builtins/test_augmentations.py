"""The built-in augmentation policies (``lip train --augmentation``): each equals the authors'
torchvision pipeline drawn from the same seed; the default leaves a data set's own
augmentation alone; bad choices are one line; the model file records the policy."""

from __future__ import annotations


import pytest
import torch
from torch.utils.data import Dataset
from torchvision import transforms

from lipcli.builtins.datasets import load_digits_dataset
from lipcli.data.augmentation import apply_augmentation, is_default, resolve_augmentation
from lipcli.data.loaders import load_data
from lipcli.host.plugins import get_registry
from lipcli.sdk.augment import RandomCropFlip
from lipcli.sdk.errors import LipUsageError
from lipcli.testing import check_augmentation, check_component_spec, read_model_metadata, run_lip


@pytest.mark.parametrize("name", get_registry().names("augmentation"))
def test_every_policy_passes_the_kit(name):
    spec = get_registry().get("augmentation", name)
    check_component_spec(spec)
    check_augmentation(spec)


def test_the_kit_catches_a_policy_with_its_own_random_source():
    import random

    from lipcli.sdk.specs import AugmentationSpec

    def factory(base):
        return lambda x: base(x).roll(random.randint(0, 5), -1)

    with pytest.raises(AssertionError, match="same torch seed gave different images"):
        check_augmentation(AugmentationSpec(name="bad", factory=factory, description="own random source"))


def _images(n: int = 6, seed: int = 0) -> torch.Tensor:
    """8-bit CIFAR-like images as floats in [0, 1] (exact multiples of 1/255)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), generator=gen, dtype=torch.uint8).float() / 255


def _policy(choice: str, base: RandomCropFlip | None = None):
    return get_registry().component("augmentation", choice).build(base or RandomCropFlip())


def _same_draws(ours, theirs, images: torch.Tensor, seed: int = 7, to_uint8: bool = False) -> None:
    torch.manual_seed(seed)
    mine = [ours(x) for x in images]
    torch.manual_seed(seed)
    ref = [theirs((x * 255).round().to(torch.uint8) if to_uint8 else x) for x in images]
    ref = [r.float() / 255 if to_uint8 else r for r in ref]
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_randaugment_is_the_liresnet_and_bronet_pipeline():
    """hukkai/liresnet and ntuaislab/BRONet ``tools/dataset/cifar.py``: crop (pad 4), flip,
    ``RandomApply([RandAugment()])`` (p = 1/2), on 8-bit images."""
    theirs = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                 transforms.RandomApply([transforms.RandAugment()])])
    images = _images(12)
    _same_draws(_policy("randaugment"), theirs, images, to_uint8=True)
    # and it changes images beyond the crop: not the crop-flip draws
    torch.manual_seed(7)
    plain = [RandomCropFlip()(x) for x in images]
    torch.manual_seed(7)
    augmented = [_policy("randaugment")(x) for x in images]
    assert any(not torch.equal(a, b) for a, b in zip(plain, augmented))


def test_color_jitter_is_the_sll_pipeline():
    """araujoalexandre/Lipschitz-SLL-Networks ``core/data/readers.py``: reflect-padded crop,
    flip, ``ColorJitter(0.1, (0.5, 2), (0.3, 2), 0.02)``."""
    theirs = transforms.Compose([transforms.RandomCrop(32, padding=4, padding_mode="reflect"),
                                 transforms.RandomHorizontalFlip(),
                                 transforms.ColorJitter(brightness=0.1, contrast=(0.5, 2.0), saturation=(0.3, 2.0),
                                                        hue=0.02)])
    _same_draws(_policy("color-jitter"), theirs, _images(8))


@pytest.mark.parametrize("mode", ["zero", "reflect"])
def test_crop_flip_is_torchvision_crop_and_flip(mode):
    theirs = transforms.Compose([transforms.RandomCrop(32, padding=4, padding_mode="constant" if mode == "zero" else mode),
                                 transforms.RandomHorizontalFlip()])
    _same_draws(_policy(f"crop-flip:padding_mode={mode}"), theirs, _images(8))


def test_the_data_set_keeps_its_flip_rule():
    """digits does not flip (a mirrored digit is another symbol); the policies keep that: with
    no padding, no flip and neutral settings every draw returns the image itself."""
    base = RandomCropFlip(padding=0, flip=False)
    torch.manual_seed(3)
    for choice in ("randaugment:p=0", "color-jitter:brightness=0,contrast_min=1,contrast_max=1,"
                   "saturation_min=1,saturation_max=1,hue=0,padding_mode=zero"):
        policy = _policy(choice, base)
        for x in _images(20):
            torch.testing.assert_close(policy(x), x, rtol=0, atol=1e-6)
    flipping = _policy("randaugment:p=0", RandomCropFlip(padding=0, flip=True))
    assert any(torch.equal(flipping(x), x.flip(-1)) for x in _images(20))


def test_default_leaves_the_data_set_alone():
    reg = get_registry()
    default = reg.component("augmentation", "crop-flip")
    assert is_default(default) and not is_default(reg.component("augmentation", "crop-flip:padding_mode=reflect"))
    data = load_digits_dataset("train", augment=True)
    own = data.transform
    apply_augmentation(data, default, "digits")
    assert data.transform is own
    apply_augmentation(data, reg.component("augmentation", "randaugment"), "digits")
    assert data.transform.base is own and "RandAugment" in repr(data.transform)


class _CustomAugmented(Dataset):
    transform = staticmethod(lambda x: x)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i):
        return torch.zeros(3, 32, 32), 0


def test_a_data_set_with_its_own_transform():
    reg = get_registry()
    data = _CustomAugmented()
    apply_augmentation(data, reg.component("augmentation", "crop-flip"), "custom")  # the default: fine
    with pytest.raises(LipUsageError, match="not lipcli's RandomCropFlip"):
        apply_augmentation(data, reg.component("augmentation", "randaugment"), "custom")
    with pytest.raises(LipUsageError, match="drop --no-augment"):
        resolve_augmentation("randaugment", False, reg)
    text, default = resolve_augmentation("crop-flip:padding_mode=zero", False, reg)
    assert (text, default.name) == ("crop-flip", "crop-flip")
    assert resolve_augmentation("randaugment:p=1", True, reg)[0] == "randaugment:num_ops=2,magnitude=9,p=1.0,padding_mode=zero"


def test_load_data_applies_the_policy_to_the_training_split_only():
    reg = get_registry()
    bundle = load_data(reg.component("dataset", "digits"), None, augmentation=reg.component("augmentation", "randaugment"),
                       val_split=0.2)
    train = bundle.train.dataset if hasattr(bundle.train, "dataset") else bundle.train
    assert "RandAugment" in repr(train.transform)
    assert bundle.val.dataset.transform is None and bundle.test.transform is None


def test_cli_records_the_policy_and_refuses_bad_choices(tmp_path):
    out = tmp_path / "m.safetensors"
    args = ["train", "--dataset", "digits", "--epochs", "1", "--width", "4", "--limit-train", "32",
            "--limit-test", "16", "--batch-size", "16", "--out", str(out)]
    result = run_lip([*args, "--augmentation", "randaugment:magnitude=5"])
    assert result.exit_code == 0, result.output
    training = read_model_metadata(out)["training"]
    assert training["config"]["augmentation"] == "randaugment:num_ops=2,magnitude=5,p=0.5,padding_mode=zero"
    result = run_lip([*args, "--overwrite", "--augmentation", "crop-flip:padding_mode=zero"])
    assert result.exit_code == 0 and read_model_metadata(out)["training"]["config"]["augmentation"] == "crop-flip"
    for bad, message in ((["--augmentation", "nope"], "unknown augmentation 'nope'"),
                         (["--augmentation", "randaugment:p=2"], "p must be in [0, 1]"),
                         (["--no-augment", "--augmentation", "color-jitter"], "drop --no-augment")):
        result = run_lip([*args, "--overwrite", *bad])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


def test_a_run_with_a_policy_resumes_bit_identical(tmp_path, monkeypatch):
    """The policies draw only from torch's global generator, which lip train seeds per epoch:
    a run interrupted in epoch 2 and resumed ends with the same weights as one run straight."""
    from safetensors.torch import load_file

    from lipcli.train import INTERRUPT_ENV

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text('power_iter_steps = 2\nlipschitz_estimate = false\ndevice = "cpu"\n')
    args = ["train", "--dataset", "digits", "--width", "4", "--limit-train", "48", "--limit-test", "16",
            "--batch-size", "16", "--epochs", "2", "--config", "tiny.toml",
            "--augmentation", "randaugment:magnitude=12"]
    assert run_lip([*args, "--out", "a/model.safetensors"]).exit_code == 0
    assert run_lip([*args, "--out", "b/model.safetensors"], env={INTERRUPT_ENV: "1:1"}).exit_code == 130
    result = run_lip(["train", "--resume", "b/model-run"])
    assert result.exit_code == 0, result.output
    a, b = load_file("a/model.safetensors"), load_file("b/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # and the policy shapes the run: the default crop and flip trains other weights
    assert run_lip([*args[:-2], "--out", "c/model.safetensors"]).exit_code == 0
    c = load_file("c/model.safetensors")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_the_kit_catches_a_policy_that_writes_into_its_input():
    from lipcli.sdk.specs import AugmentationSpec

    def factory(base):
        return lambda x: base(x.mul_(0.5))

    with pytest.raises(AssertionError, match="changed its input image in place|same torch seed"):
        check_augmentation(AugmentationSpec(name="bad", factory=factory, description="in place"))
