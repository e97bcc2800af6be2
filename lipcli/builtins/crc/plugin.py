"""The CRC-Lip built-in plugin (registered as ``lipcli.crc``): the ``mlp`` head
(:mod:`.head`), the ``crc-lip`` curvature certificate (:mod:`.certifier`) and the ``crc-lip``
training loss (:mod:`.loss`; its recipe in :mod:`.recipe`) (paper §5, SPEC §4, §6)."""

from __future__ import annotations

import math

from lipcli.builtins.crc.certifier import CRCCertifier
from lipcli.builtins.crc.head import MAX_HIDDEN, MLPHead
from lipcli.builtins.crc.loss import CRCLipLoss
from lipcli.builtins.crc.recipe import CRC_GRAD_CLIP, PAPER_CRC_SETTINGS, paper_recipe, recipe_text
from lipcli.builtins.crc.settings import CRCSettings
from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk.losses import LossContext
from lipcli.sdk.specs import SOUND, CertificateSpec, HeadSpec, LossSpec, Param

__all__ = ["lip_certificates", "lip_heads", "lip_losses"]

#: the loss parameters' defaults: the paper's CIFAR-10 settings
_RHO, _GAMMA = PAPER_CRC_SETTINGS["cifar10"]
#: the loss parameters' ranges: an input-space l2 radius (images lie in [0, 1]^(C*H*W): 64
#: covers a 32x32x3 image's diameter), the curvature weight, attack and power steps per
#: batch, and classes per example (the model files' class limit)
MAX_RADIUS, MAX_WEIGHT, MAX_STEPS, MAX_CLASSES = 64.0, 1e4, 1000, 100_000


def _mlp_factory(in_features: int, num_classes: int, hidden: int = 4096) -> MLPHead:
    return MLPHead(in_features, num_classes, hidden=hidden)


def _crc_factory(context: LossContext, *, radius: float = _RHO, gamma: float = _GAMMA,
                 attack_steps: int = 5, power_steps: int = 2, classes: int = 0) -> CRCLipLoss:
    if not all(math.isfinite(v) and v >= 0 for v in (radius, gamma)):
        raise ValueError("radius and gamma must be finite numbers >= 0")
    if attack_steps < 1 or power_steps < 0 or classes < 0:
        raise ValueError("attack_steps must be >= 1, power_steps and classes >= 0")
    return CRCLipLoss(context, radius=radius, gamma=gamma, attack_steps=attack_steps,
                      power_steps=power_steps, classes=classes)


@hookimpl
def lip_heads() -> list[HeadSpec]:
    return [
        HeadSpec(
            name="mlp",
            factory=_mlp_factory,
            description="1-hidden-layer softplus MLP certified by CRC-Lip",
            certificate=CRCCertifier.name,
            features="activation",
            loss="crc-lip",
            params=(Param(name="hidden", type=int, default=4096, min=1, max=MAX_HIDDEN, help="hidden width H"),),
        ),
    ]


@hookimpl
def lip_certificates() -> list[CertificateSpec]:
    return [
        CertificateSpec(
            name=CRCCertifier.name,
            factory=CRCCertifier,
            description="curvature certificate of a softplus MLP head: closed form + dual (CRC), "
            "guaranteed curvature bounds, all classes",
            promises=(SOUND,),
            params=CRCSettings.params(),
        )
    ]


@hookimpl
def lip_losses() -> list[LossSpec]:
    return [
        LossSpec(
            name="crc-lip",
            factory=_crc_factory,
            description="CRC-Lip: CE under a feature-space l2 attack + curvature regulariser (eq. 5)",
            params=(
                # the shortcuts: settings (and `lip train` options) of their own, kept for users'
                # commands and settings files from before --loss took inline parameters
                Param(name="radius", type=float, default=_RHO, shortcut="attack_radius", min=0.0, max=MAX_RADIUS,
                      help="input-space l2 radius rho of the feature attack (0 = no attack; "
                      f"recipe default {recipe_text(0)})"),
                Param(name="gamma", type=float, default=_GAMMA, shortcut="curvature_weight", min=0.0, max=MAX_WEIGHT,
                      help=f"curvature weight (0 = no curvature term; recipe default {recipe_text(1)})"),
                Param(name="attack_steps", type=int, default=5, shortcut="attack_steps", min=1, max=MAX_STEPS,
                      help="feature attack steps"),
                Param(name="power_steps", type=int, default=2, shortcut="curvature_power_steps", min=0, max=MAX_STEPS,
                      help="power steps per class pair for the curvature estimate"),
                Param(name="classes", type=int, default=0, shortcut="curvature_classes", min=0, max=MAX_CLASSES,
                      help="other classes per example in the curvature term (0 = all)"),
            ),
            recipe=paper_recipe,
            grad_clip=CRC_GRAD_CLIP,
        )
    ]
