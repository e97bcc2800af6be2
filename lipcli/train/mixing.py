"""Mixed training batches: a fixed fraction of every batch from ``--extra-data``.

Each batch of ``B`` images (per process) holds ``B_e = round(ratio · B)`` extra images and
``B − B_e`` images of the training set.  An epoch is one pass over the training set (its
order from the usual :class:`~torch.utils.data.DistributedSampler`, reshuffled per epoch), so
it has ``ceil(n / (B − B_e))`` steps; the extra images come from a permutation of all of them,
drawn per epoch from ``(seed, epoch, rank)`` and continued (a new permutation) when one is used
up, so a resumed run draws the same images.  The extra images get the training set's own
augmentation (its ``transform`` attribute: crop, and flip where the data set flips).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler, Subset

from lipcli.data.loaders import epoch_seed
from lipcli.sdk.errors import LipUsageError
from lipcli.train.extradata import ExtraData


class ExtraImageDataset(Dataset):
    """``(image in [0, 1] as (C, H, W) float, label)`` from memory-mapped ``(N, H, W, C)`` uint8."""

    def __init__(self, extra: ExtraData, transform: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.images = extra.images
        self.labels = extra.labels
        self.transform = transform

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels = torch.from_numpy(np.array(self.images[index]))  # copies one image out of the map
        image = pixels.permute(2, 0, 1).float().div_(255.0)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


def training_transform(dataset: Dataset) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The augmentation of a training set (through ``Subset`` wrappers), or None."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return getattr(dataset, "transform", None)


class MixedBatchSampler:
    """Index batches over ``ConcatDataset([train, extra])`` (module docstring)."""

    def __init__(self, real: DistributedSampler, n_real: int, n_extra: int, *, batch_size: int,
                 ratio: float, seed: int, rank: int) -> None:
        self.real, self.n_real, self.n_extra = real, n_real, n_extra
        self.extra_per_batch = int(round(ratio * batch_size))
        self.real_per_batch = batch_size - self.extra_per_batch
        if self.extra_per_batch < 1 or self.real_per_batch < 1:
            raise LipUsageError(
                f"an extra-data ratio of {ratio} leaves {self.real_per_batch} training and "
                f"{self.extra_per_batch} extra images in a batch of {batch_size}; both need at least 1"
            )
        self.seed, self.rank, self.epoch = seed, rank, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.real.set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(len(self.real) / self.real_per_batch)

    def _extra_indices(self, count: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch, self.rank) ^ 0x5EED)
        parts, have = [], 0
        while have < count:
            parts.append(torch.randperm(self.n_extra, generator=gen))
            have += self.n_extra
        return torch.cat(parts)[:count] + self.n_real

    def __iter__(self) -> Iterator[list[int]]:
        real = list(self.real)
        extra = self._extra_indices(len(self) * self.extra_per_batch).tolist()
        for step in range(len(self)):
            chunk = real[step * self.real_per_batch:(step + 1) * self.real_per_batch]
            yield chunk + extra[step * self.extra_per_batch:(step + 1) * self.extra_per_batch]


def mixed_train_loader(train: Dataset, extra: ExtraData, *, ratio: float, batch_size: int, seed: int,
                       rank: int = 0, world_size: int = 1, workers: int = 0,
                       pin_memory: bool = False) -> tuple[DataLoader, MixedBatchSampler]:
    """The training loader with extra images mixed into every batch; ``sampler.set_epoch(e)``
    every epoch, as for :func:`lipcli.data.loaders.train_loader`."""
    extra_set = ExtraImageDataset(extra, training_transform(train))
    real = DistributedSampler(train, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                              drop_last=False)
    sampler = MixedBatchSampler(real, len(train), len(extra_set), batch_size=batch_size, ratio=ratio,
                                seed=seed, rank=rank)  # type: ignore[arg-type]
    loader = DataLoader(ConcatDataset([train, extra_set]), batch_sampler=sampler, num_workers=workers,
                        pin_memory=pin_memory, generator=torch.Generator(), persistent_workers=False)
    return loader, sampler


def extra_loader_or_none(cfg: Any, extra: ExtraData | None, data: Any, *, batch_size: int, rank: int,
                         world_size: int, workers: int, pin_memory: bool) -> tuple[Any, Any] | None:
    """The mixed loader when the run has extra data, else None (the plain loader is used)."""
    if extra is None:
        return None
    return mixed_train_loader(data.train, extra, ratio=cfg.extra_ratio, batch_size=batch_size,
                              seed=cfg.seed, rank=rank, world_size=world_size, workers=workers,
                              pin_memory=pin_memory)
