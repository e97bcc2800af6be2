"""The lipcli plugin module (entry point ``bro`` in the ``lipcli`` group).

Provides one convolution component, ``bro``: ``lip train --conv bro`` (parameters inline,
e.g. ``--conv bro:rank_ratio=0.25``).
"""

from __future__ import annotations

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.specs import ORTHOGONAL, ConvSpec, Param

from .border import BORDERS, RANK_RULES
from .bro import FACTORS, INITS, BROConv

#: the largest rank a ``bro`` layer is given (each layer also refuses one above its channels)
MAX_RANK = 4096


def bro_factory(in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                **params: object) -> BROConv:
    """:class:`BROConv`, refusing a ``rank`` above the layer's ``c = max(in·s², out)`` (a
    ``ValueError``: the host reports it as the choice's usage error)."""
    channels = max(in_channels * stride * stride, out_channels)
    rank = params.get("rank", 0)
    if isinstance(rank, int) and rank > channels:
        raise ValueError(f"rank must be at most the layer's channels c = max(in*stride^2, out) = "
                         f"{channels}, got {rank}")
    return BROConv(in_channels, out_channels, kernel_size, stride, **params)  # type: ignore[arg-type]


def bro_spec() -> ConvSpec:
    """The ``bro`` conv spec: orthogonal (semi-orthogonal for ``in ≠ out``) in exact
    arithmetic with ``border="circular"``, 1-Lipschitz with ``border="zero"`` (a crop of an
    orthogonal map of the zero-padded input: the promise is then ``"1-lipschitz"``, not
    ``"orthogonal"``); ``lipschitz_upper_bound()`` is a verified bound for the float matrices
    used, in both forms."""
    return ConvSpec(
        name="bro",
        factory=bro_factory,
        description="BRO: block reflector orthogonal convolution in the Fourier domain (Lai et al., ICML 2025)",
        params=(
            Param(name="rank", type=int, default=0, min=1, max=MAX_RANK, auto=0,
                  help="rank r of the low-rank filter V (0: rank_ratio times the channels)"),
            Param(name="rank_ratio", type=float, default=0.5, min=0.0, min_open=True, max=1.0,
                  help="r = floor(rank_ratio * c), c = max(in*stride^2, out), when rank is 0"),
            Param(name="init", type=str, default="identity", choices=INITS,
                  help="identity: centre tap of V is [I; 0] (the authors' default); random"),
            Param(name="factor", type=str, default="auto", choices=FACTORS,
                  help="basis of range V: qr (Householder), cholesky (Cholesky QR, unchecked), auto "
                       "(training: Cholesky QR, on CPU checked with a fallback to qr; eval: qr)"),
            Param(name="rank_rule", type=str, default="ratio", choices=RANK_RULES,
                  help="ratio: r = floor(rank_ratio * c); lipconvnet: the BRONet authors' LipConvNet "
                       "rule, r = min(in*stride^2, out) where they differ (use with rank_ratio=0.125)"),
            Param(name="border", type=str, default="circular", choices=BORDERS,
                  help="circular: orthogonal on the torus; zero: the authors' zero pad and crop "
                       "(1-Lipschitz, not orthogonal)"),
        ),
        promises=(ORTHOGONAL,),
    )


@hookimpl
def lip_convolutions() -> list[ConvSpec]:
    return [bro_spec()]
