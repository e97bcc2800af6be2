"""Write the digits data in the forms the recipe results use (docs/results.md).

``imagefolder OUT --size 64``
    The fixed digits split (1,437 train / 360 test, ``lipcli.builtins.datasets``) as an image
    folder ``OUT/{train,test}/<digit>/<index>.png``: each 8x8 grey image (16 levels, /16) is
    upscaled ONCE to ``size`` x ``size`` by bilinear interpolation (``align_corners=False``, as
    the built-in data set does for 32), rounded to 8-bit grey and saved as an RGB PNG, so
    ``imagefolder:size=64`` reads it at its native size.
``extra OUT.npz --copies 4 --seed 0``
    A synthetic extra-data file made from augmented TRAINING images only (never the test
    split): every one of the 1,437 training digits (32x32, as ``--dataset digits`` yields)
    ``copies`` times, each copy shifted by a random translation of up to 4 pixels in each
    direction (zero fill), scaled in brightness by a factor in [0.8, 1.2] and given Gaussian
    pixel noise of std 0.03, clipped to [0, 1] and stored as uint8 ``N x 32 x 32 x 3`` with
    the original labels (``numpy.savez``, uncompressed, so it can be memory-mapped).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def write_imagefolder(out: Path, size: int) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    from lipcli.builtins.datasets import digits_split_indices

    bunch = load_digits()
    x = torch.as_tensor(bunch.images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp_(0, 1)
    grey = (x[:, 0] * 255.0).round().to(torch.uint8).numpy()
    train, test = digits_split_indices()
    for split, indices in (("train", train), ("test", test)):
        for i in indices:
            d = out / split / str(int(bunch.target[i]))
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.repeat(grey[i][..., None], 3, axis=2), "RGB").save(d / f"{i:04d}.png")


def write_extra(out: Path, copies: int, seed: int) -> None:
    from lipcli.builtins.datasets import load_digits_dataset

    train = load_digits_dataset("train")
    images, labels = train.images, train.labels  # (N, 3, 32, 32) in [0, 1]
    gen = torch.Generator().manual_seed(seed)
    out_images, out_labels = [], []
    for _ in range(copies):
        n = images.shape[0]
        shifts = torch.randint(-4, 5, (n, 2), generator=gen)
        padded = F.pad(images, (4, 4, 4, 4))
        moved = torch.stack([padded[i, :, 4 - dy:4 - dy + 32, 4 - dx:4 - dx + 32]
                             for i, (dy, dx) in enumerate(shifts.tolist())])
        gain = 0.8 + 0.4 * torch.rand(n, 1, 1, 1, generator=gen)
        noisy = moved * gain + 0.03 * torch.randn(moved.shape, generator=gen)
        out_images.append((noisy.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1))
        out_labels.append(labels)
    np.savez(out, image=torch.cat(out_images).numpy(), label=torch.cat(out_labels).numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("imagefolder")
    a.add_argument("out", type=Path)
    a.add_argument("--size", type=int, default=64)
    b = sub.add_parser("extra")
    b.add_argument("out", type=Path)
    b.add_argument("--copies", type=int, default=4)
    b.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.what == "imagefolder":
        write_imagefolder(args.out, args.size)
    else:
        write_extra(args.out, args.copies, args.seed)


if __name__ == "__main__":
    main()
