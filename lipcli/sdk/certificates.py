"""The certifier protocol shared by every certificate method (SPEC §4).

A *certifier* is what a ``certificate`` spec's factory returns (``factory(**params)``).  It
certifies a classification **head** on given penultimate **features** ``y`` (``(B, D)``) and
reports, per input, a feature-space l2 radius ``r`` such that the head's predicted class is
constant on the ball ``{y' : ||y' - y||₂ < r}``.  The certification driver turns this into an
input-space radius ``r / Lip(g)`` (``g`` = input -> features map, SPEC §5; Proposition 1 of
the paper, "CRC-Lip") and counts an input as certified at ``ε`` when it is correctly
classified AND ``r / Lip(g) >= ε``.

Protocol (structural; any object with these members works, see :class:`Certifier`):

* ``name: str`` -- the certificate's CLI name (``"lln"``, ``"crc-lip"``).
* ``prepare(head, cache=None) -> dict`` -- per-model precomputation (e.g. curvature bounds).
  Returns a JSON-serialisable cache that the driver stores in the model file's metadata
  (``lipcli.cache[<name>]``).  The cache carries ``"fingerprint": head_fingerprint(head)``;
  a given cache is reused only when its fingerprint and method match.  Certifiers may grow
  the returned dict *in place* during :meth:`certify` (lazily computed bounds): the driver
  should save the dict object returned by ``prepare`` (or ``certifier.cache``) after
  certification.
* ``certify(head, features, *, top_k=None) -> CertifyResult``.

``top_k``: restrict the competing classes of each input to the ``top_k`` highest other
logits.  Unless ``top_k >= c - 1`` this is a *heuristic* (the minimum over the remaining
classes is not checked) and the result says so through ``exact_classes = False``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

#: cache layout version written by :func:`make_cache`; bump on incompatible changes
CACHE_VERSION = 1


@dataclass
class CertifyResult:
    """Per-input certification result (feature space).

    Attributes:
        predictions: ``LongTensor[B]``, the head's predicted class ``l = argmax_j h_j(y)``
            (computed in float64).
        radius: ``float64 Tensor[B]``, a feature-space l2 radius ``r >= 0`` on whose open
            ball the prediction cannot change (0 where nothing is certified). Misclassified
            inputs still get the radius of their *predicted* class.
        exact_classes: ``False`` when ``top_k`` restricted the competing classes to fewer
            than ``c - 1``: then ``radius`` is NOT a certificate (heuristic, label it so).
        notes: human-readable remarks (what was estimated, which tolerances); the same for
            every chunk of a run, so concatenated results stay short.
        stats: machine-readable numbers (JSON-serialisable): per-call counters and times
            that add up over chunks, and states named ``*_total`` (last value wins).
    """

    predictions: torch.Tensor
    radius: torch.Tensor
    exact_classes: bool = True
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.predictions.dim() != 1 or self.radius.shape != self.predictions.shape:
            raise ValueError("predictions and radius must both have shape (B,)")
        if self.radius.dtype != torch.float64:
            raise TypeError("radius must be float64")
        if bool((self.radius < 0).any()) or bool(torch.isnan(self.radius).any()):
            raise ValueError("radius must be >= 0 and not NaN")

    @staticmethod
    def concatenate(results: list["CertifyResult"]) -> "CertifyResult":
        """Join per-chunk results (notes de-duplicated in order, counters summed, ``*_total``
        states and non-numeric stats taken from the last chunk)."""
        if not results:
            raise ValueError("nothing to concatenate")
        notes: list[str] = []
        stats: dict[str, Any] = {}
        for res in results:
            for note in res.notes:
                if note not in notes:
                    notes.append(note)
            for key, value in res.stats.items():
                additive = isinstance(value, (int, float)) and not isinstance(value, bool)
                if additive and not key.endswith("_total"):
                    stats[key] = stats.get(key, 0) + value
                else:  # states (``*_total``) and non-numbers: the last chunk's value
                    stats[key] = value
        return CertifyResult(
            predictions=torch.cat([r.predictions for r in results]),
            radius=torch.cat([r.radius for r in results]),
            exact_classes=all(r.exact_classes for r in results),
            notes=notes,
            stats=stats,
        )


@runtime_checkable
class Certifier(Protocol):
    """Structural type of a certifier (see the module docstring for the contract)."""

    name: str

    def prepare(self, head: nn.Module, cache: dict | None = None) -> dict:
        """Per-model precomputation; returns a JSON-serialisable cache (fingerprinted)."""
        ...

    def certify(
        self, head: nn.Module, features: torch.Tensor, *, top_k: int | None = None
    ) -> CertifyResult:
        """Certify ``head`` at the feature vectors ``features`` (``(B, D)``)."""
        ...


def head_fingerprint(head: nn.Module) -> str:
    """SHA-256 over the head's state (names, dtypes, shapes and raw bytes, sorted by name).

    Identifies the exact weights a cache was computed for; any change of any parameter or
    buffer changes the fingerprint.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(head.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(str(tuple(t.shape)).encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def make_cache(method: str, head: nn.Module, **content: Any) -> dict:
    """A fresh cache dict ``{"method", "version", "fingerprint", **content}``."""
    return {
        "method": method,
        "version": CACHE_VERSION,
        "fingerprint": head_fingerprint(head),
        **content,
    }


def cache_matches(cache: dict | None, method: str, head: nn.Module) -> bool:
    """Whether ``cache`` was made by ``method`` for exactly this head's weights."""
    return (
        isinstance(cache, dict)
        and cache.get("method") == method
        and cache.get("version") == CACHE_VERSION
        and cache.get("fingerprint") == head_fingerprint(head)
    )


def competing_classes(
    logits: torch.Tensor, predictions: torch.Tensor, top_k: int | None
) -> tuple[torch.Tensor, bool]:
    """Boolean mask ``(B, c)`` of the classes ``j != l`` to certify against.

    All ``c - 1`` other classes by default (exact).  With ``top_k`` only the ``top_k``
    highest other logits; ``exact`` is ``False`` when that leaves out any class.
    """
    batch, num_classes = logits.shape
    mask = torch.ones(batch, num_classes, dtype=torch.bool, device=logits.device)
    mask[torch.arange(batch, device=logits.device), predictions] = False
    if top_k is None or top_k >= num_classes - 1:
        return mask, True
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    masked = logits.masked_fill(~mask, float("-inf"))
    keep = masked.topk(top_k, dim=1).indices
    restricted = torch.zeros_like(mask)
    restricted.scatter_(1, keep, True)
    return restricted & mask, False


HEURISTIC_NOTE = (
    "top_k={k} < c-1={c}: only the {k} highest other logits were checked; radii are "
    "HEURISTIC, not certificates"
)
