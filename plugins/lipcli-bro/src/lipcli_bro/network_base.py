"""What the BRONet authors' networks in this plugin share (:mod:`lipcli_bro.lipconvnet`,
:mod:`lipcli_bro.bronet`): the architecture protocol's ``features`` and ``forward`` around a
``body`` of children, refreshing layers that keep power-iteration state, and argument checks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn


def per_channel(values: Sequence[float], channels: int) -> tuple[float, ...]:
    """``values`` as a tuple, one entry repeated for every channel."""
    values = tuple(values)
    return values * channels if len(values) == 1 else values


def check_arguments(checks: Iterable[tuple[bool, str]]) -> None:
    """Raise ``ValueError(message)`` for the first ``(ok, message)`` that is not ok."""
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


class AuthorsNetwork(nn.Module):
    """Base of the networks: subclasses set ``body``, ``head``, ``in_channels``,
    ``image_size`` and the name used in errors, ``network_name``."""

    network_name = "the network"
    body: nn.Sequential
    head: nn.Module
    in_channels: int
    image_size: tuple[int, int]

    @torch.no_grad()
    def refresh_power_iteration(self, steps: int = 50) -> None:
        """Refresh layers that keep power-iteration state (``refresh(steps)``)."""
        for refresh in (getattr(m, "refresh", None) for m in self.modules() if m is not self):
            if callable(refresh):
                refresh(steps)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features ``(N, D)`` (normalisation included) of ``(N, in, S, S)`` inputs."""
        expected = (self.in_channels, *self.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"{self.network_name} expects inputs (N, {', '.join(map(str, expected))}); "
                             f"got {tuple(x.shape)}")
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
