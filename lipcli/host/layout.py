"""The layout every lipcli model has (what :func:`lipcli.host.models.build_model` builds and
the drivers read): ``model.body``, the feature map ``g``, an :class:`torch.nn.Sequential`
(input normalisation first, a flatten to ``(N, D)`` last); ``model.head`` on its features;
``model.lipcli_config`` with the input's ``in_channels`` and ``image_size``."""

from __future__ import annotations

from torch import nn

from lipcli.sdk.errors import LipError


def body_of(model: nn.Module) -> nn.Sequential:
    """The model's feature map ``g`` (``model.body``), checked to be a Sequential."""
    body = getattr(model, "body", None)
    if not isinstance(body, nn.Sequential):
        raise LipError(
            f"{type(model).__name__} has no 'body' nn.Sequential; lipcli can only bound the "
            "Lipschitz constant of sequential feature maps"
        )
    return body


def model_input_shape(model: nn.Module) -> tuple[int, int, int]:
    """``(C, H, W)`` from the model's ``lipcli_config`` (default ``(in_channels, 32, 32)``)."""
    config = getattr(model, "lipcli_config", None) or {}
    channels = int(config.get("in_channels", getattr(model, "in_channels", 3)))
    size = config.get("image_size") or (32, 32)
    return (channels, int(size[0]), int(size[1]))
