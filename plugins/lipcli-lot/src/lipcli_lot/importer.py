"""Importer ``lot``: checkpoints saved by the LOT authors' code
(github.com/AI-secure/Layerwise-Orthogonal-Training, ``train_robust.py --conv-layer lot``:
``torch.save(model.state_dict(), ...)`` of ``lip_convnets.LipConvNet`` or, with ``--residual``,
``LipResNet``) onto ``lot-lipconvnet-<n>`` / ``lot-lipresnet-<n>`` (:mod:`lipcli_lot.network`)
with the ``lot`` convolution in the authors' form (``border=zero``: zero-padded by ``k//2`` and
cropped; their ``ε = 10⁻⁴`` and 10 Newton–Schulz iterations are the defaults; their
``out × out`` Gram matrix gives the same matrix, :mod:`lipcli_lot.lot`).

Source layout (``b`` blocks per layer ``i = 1..5``, width ``w``)::

    LipConvNet: layer{i}.{j}.conv.weight (out, in·s², k, k), .bias (out,)  -> body.layer{i}_conv{j+1}
    LipResNet:  layer{i}.block.conv.*   (b = 1)                             -> body.layer{i}_conv1
                layer{i}.in_block.conv.*, layer{i}.out_block.conv.*         -> body.layer{i}_conv{1, b}
                layer{i}.hidden_block.{m}.conv.*                            -> body.layer{i}_res{m+2}
                layer{i}.res_lamda_logit (1,)    the residual weight sigmoid(.) (the arch's ``mix``)
    <block>.activation.theta (1, C/2, 1, 1)      --activation hh1            -> <act>.theta (householder)
    <block>.activation.theta{0,1,2} (C/2,)       --activation hh2            -> householder:order=2
    last_layer.weight (K, D), .bias (K,)         --lln: NormalizedLinear     -> head (lln)
    last_layer.weight (K, D, 1, 1), .bias (K,)   without: a 1x1 LOT layer    -> head (lot)

The activation is MaxMin (their default, no tensors) or their HouseHolder activations, which
are lipcli-householder's ``householder`` (order 1: the same reflection ``z − 2max(0, vᵀz)v``;
order 2: the same four sectors, with ``θ0`` clamped to ``[0, 2π]`` by their forward and not by
lipcli's, so a ``θ0`` outside is refused).  Not in the checkpoint, so fixed as the authors'
code fixes it: the input normalisation (``utils.py``: the CIFAR-10 mean, std 0.2507, for both
data sets) and the 32×32 image (``D = 32w``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.importers import ImportPlan, ImportRefused, SourceCertificates, strip_prefix

from lipcli.sdk.source_options import SourceOption

from .head import LOTHead
from .network import DEPTHS, LOT_MEAN, LOT_STD, lot_blocks

SOURCE = "github.com/AI-secure/Layerwise-Orthogonal-Training"
DESCRIPTION = "the LOT authors' LipConvNet / LipResNet (--residual) with LOT layers, LLN or LOT head"
#: the lot convolution in the authors' form (their iterations 10 and eps 1e-4 are its defaults)
AUTHORS_CONV = "lot:border=zero"
_DATASETS = {10: "cifar10", 100: "cifar100"}
_ACT_NAMES = {"maxmin": "MaxMin", "householder": "HouseHolder (hh1)", "householder:order=2": "HouseHolder (hh2)"}
_LEAF = re.compile(r"layer[1-5]\.(?:\d+\.|block\.|in_block\.|out_block\.|hidden_block\.\d+\.)(\w+)\.(\w+)$")
_ARCH = re.compile(r"lot-(lipconvnet|lipresnet)-(\d+)")


def source_prefix(layer: int, block: int, blocks: int, residual: bool) -> str:
    """The authors' module of lipcli's ``layer{layer}_conv{block}`` (1-based ``block``)."""
    if not residual:
        return f"layer{layer}.{block - 1}.conv"
    if blocks == 1:
        return f"layer{layer}.block.conv"
    part = "in_block" if block == 1 else "out_block" if block == blocks else f"hidden_block.{block - 2}"
    return f"layer{layer}.{part}.conv"


def lipcli_prefix(layer: int, block: int, blocks: int, residual: bool) -> str:
    """lipcli's module of the same convolution (inside ``layer{i}_res{j}`` for a residual)."""
    conv = f"layer{layer}_conv{block}"
    return f"body.layer{layer}_res{block}.inner.{conv}" if residual and 1 < block < blocks else f"body.{conv}"


def _activation(names: set[str]) -> tuple[str, tuple[str, ...]]:
    """The lipcli activation and the source's per-block tensor names (``activation.<leaf>``)."""
    leaves = {leaf for n in names if (m := _LEAF.search(n)) for part, leaf in [m.group(1, 2)] if part == "activation"}
    for choice, wanted in (("maxmin", set()), ("householder", {"theta"}),
                           ("householder:order=2", {"theta0", "theta1", "theta2"})):
        if leaves == wanted:
            return choice, tuple(sorted(wanted))
    raise ImportRefused(f"cannot import activation tensors {', '.join(sorted(leaves))}: not the authors' MaxMin, "
                        "hh1 or hh2")


def _check_hh2_offsets(tensors: Mapping[str, Any], keys: list[str]) -> None:
    """Their hh2 clamps ``θ0`` to ``[0, 2π]``, lipcli's does not: refuse a ``θ0`` outside."""
    for key in keys:
        t = tensors.get(key)
        if t is not None and t.dim() == 1 and bool(((t < 0) | (t > 2 * math.pi)).any()):
            raise ImportRefused(f"cannot import {key} outside [0, 2*pi]: the authors' hh2 clamps it, lipcli's "
                                "householder:order=2 does not")


#: every option of the LOT authors' train_robust.py that changes the network, and how it is handled
#: (each leaves its mark in the keys or shapes: no configuration is needed)
OPTIONS = (
    SourceOption("conv_layer", "the convolution", "the keys: lot -> lot:border=zero; soc, bcop, cayley refused by name"),
    SourceOption("activation", "the activation", "the keys: maxmin -> maxmin, hh1/hh2 (theta) -> householder"),
    SourceOption("lln", "the head", "the keys/shapes: lln -> lln, else their 1x1 LOT last layer -> lot"),
    SourceOption("residual", "LipConvNet or LipResNet (mixing lambda)", "the keys (res_lamda_logit)"),
    SourceOption("block_size, init_channels, dataset", "the sizes", "the shapes (classes)"),
)


def _refuse_unsupported(names: set[str]) -> None:
    parts = {m.group(1, 2) for n in names if (m := _LEAF.search(n))}
    others = sorted({leaf for part, leaf in parts if part == "conv" and leaf not in ("weight", "bias")})
    if others:
        raise ImportRefused(f"cannot import a non-LOT LipConvNet (conv.{others[0]}): the lot importer maps "
                            "--conv-layer lot only")


def _structure(names: set[str], arch: str | None) -> tuple[bool, int]:
    """``(residual, blocks per layer)`` from the keys, checked against ``--arch``."""
    residual = any(re.match(r"layer1\.(block|in_block|res_lamda_logit)\b", n) for n in names)
    if residual:
        hidden = {int(m.group(1)) for n in names if (m := re.match(r"layer1\.hidden_block\.(\d{1,6})\.", n))}
        b = 1 if "layer1.block.conv.weight" in names else 2 + (max(hidden) + 1 if hidden else 0)
    else:
        found = {int(m.group(1)) for n in names if (m := re.match(r"layer1\.(\d{1,6})\.conv\.", n))}
        b = max(found) + 1 if found else 0
    if b > DEPTHS[-1] // 5:  # a key's block index, before anything is sized by it
        raise ImportRefused(f"the checkpoint names {b} blocks per layer, beyond the {DEPTHS[-1] // 5} of "
                            f"lipcli's deepest LOT network (depth {DEPTHS[-1]})")
    if arch is not None:
        m = _ARCH.fullmatch(arch.strip())
        if m is None or len(m.group(2)) > 6 or int(m.group(2)) not in DEPTHS:
            raise LipUsageError(f"--arch {arch!r}: lot takes lot-lipconvnet-N or lot-lipresnet-N, "
                                f"N in {DEPTHS[0]}..{DEPTHS[-1]} a multiple of 5")
        if b and (int(m.group(2)) // 5 != b or (m.group(1) == "lipresnet") != residual):
            raise ImportRefused(f"--arch {arch} does not match the checkpoint: it holds a "
                                f"lot-{'lipresnet' if residual else 'lipconvnet'}-{5 * b}")
        b = int(m.group(2)) // 5
    if not b:
        raise ImportRefused("no layer1.0.conv.weight or layer1.block/in_block: not a checkpoint of the LOT "
                            "authors' LipConvNet or LipResNet")
    return residual, b


def _shape(tensors: Mapping[str, Any], key: str) -> tuple[int, ...]:
    t = tensors.get(key)
    if t is None:
        raise ImportRefused(f"no {key}: cannot read the network's sizes")
    return tuple(int(s) for s in t.shape)


def _mix(tensors: Mapping[str, Any]) -> float:
    """The residual weight ``sigmoid(res_lamda_logit)`` (float32, as the authors' forward),
    one for every layer."""
    values = set()
    for i in range(1, 6):
        t = tensors.get(f"layer{i}.res_lamda_logit")
        if t is None or tuple(t.shape) != (1,) or not bool(torch.isfinite(t).all()):
            return 0.5  # the host refuses the key (missing, shape, NaN) before anything is built
        values.add(float(torch.sigmoid(t.detach().float())[0]))
    if len(values) != 1:
        raise ImportRefused("cannot import layers with different res_lamda_logit values: lot-lipresnet "
                            "has one residual weight (mix) for every layer")
    return values.pop()


class LOTImporter:
    """The ``lot`` importer (see the module)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None) -> ImportPlan:
        pre = strip_prefix(tensors)
        tensors = {k[len(pre):]: v for k, v in tensors.items()}
        names = set(tensors)
        _refuse_unsupported(names)
        residual, b = _structure(names, arch)
        activation, act_leaves = _activation(names)
        first = _shape(tensors, source_prefix(1, 1, b, residual) + ".bias")
        w = first[0] if b > 1 else first[0] // 2
        last = _shape(tensors, "last_layer.weight")
        K, D = last[0], (last[1] if len(last) > 1 else 0)
        if w < 1 or D != 32 * w:
            raise ImportRefused(f"last_layer.weight has {D} features, not 32*{w}: not the authors' network "
                                "on 32x32 images")
        lot_head = len(last) == 4
        expected: dict[str, tuple[int, ...]] = {}
        sizes: dict[str, tuple[int, int]] = {}
        side = 32
        for layer, block, c_in, c_out, k, s in lot_blocks(b, w):
            src = source_prefix(layer, block, b, residual)
            expected.update({f"{src}.weight": (c_out, c_in * s * s, k, k), f"{src}.bias": (c_out,)})
            module = src[: -len(".conv")]
            expected.update({f"{module}.activation.{leaf}": (1, c_out // 2, 1, 1) if leaf == "theta" else (c_out // 2,)
                             for leaf in act_leaves})
            side //= s
            sizes[lipcli_prefix(layer, block, b, residual)] = (side + 2 * (k // 2),) * 2
        if residual:
            expected.update({f"layer{i}.res_lamda_logit": (1,) for i in range(1, 6)})
        expected.update({"last_layer.weight": (K, D, 1, 1) if lot_head else (K, D), "last_layer.bias": (K,)})
        mix = _mix(tensors) if residual else None
        _check_hh2_offsets(tensors, [k for k in expected if k.endswith(".activation.theta0")])
        name = f"lot-lipresnet-{5 * b}" if residual else f"lot-lipconvnet-{5 * b}"
        model: dict[str, Any] = {
            "arch": f"{name}:width={w}" + (f",mix={mix!r}" if residual else ""), "conv": AUTHORS_CONV,
            "activation": activation, "pool": "max", "head": "lot" if lot_head else "lln",
            "num_classes": K, "in_channels": 3, "image_size": (32, 32), "mean": LOT_MEAN, "std": LOT_STD,
        }
        what = "LOT head" if lot_head else "LLN head"
        return ImportPlan(model=model, expected={pre + k: v for k, v in expected.items()}, ignored=(),
                          dataset=_DATASETS.get(K),
                          description=f"LOT {'LipResNet' if residual else 'LipConvNet'}-{5 * b} (width {w}), "
                                      f"{_ACT_NAMES[activation]}, {what}, {K} classes",
                          source_state={"prefix": pre, "blocks": b, "width": w, "residual": residual,
                                        "sizes": sizes, "lot_head": lot_head, "activation": act_leaves})

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]:
        state = plan.source_state
        pre, b, residual = state["prefix"], state["blocks"], state["residual"]
        out: dict[str, Any] = {"body.normalize.mean": torch.tensor(LOT_MEAN), "body.normalize.std": torch.tensor(LOT_STD)}
        for layer, block, *_ in lot_blocks(b, state["width"]):
            src, dst = pre + source_prefix(layer, block, b, residual), lipcli_prefix(layer, block, b, residual)
            out[f"{dst}.weight"] = tensors[f"{src}.weight"]
            out[f"{dst}.bias"] = tensors[f"{src}.bias"]
            out[f"{dst}.spatial_size"] = torch.tensor(state["sizes"][dst], dtype=torch.int64)
            for leaf in state["activation"]:
                act = dst.replace("_conv", "_act")
                out[f"{act}.{leaf}"] = tensors[f"{src[: -len('.conv')]}.activation.{leaf}"].flatten()
        weight = tensors[f"{pre}last_layer.weight"]
        out["head.weight"] = weight.flatten(1) if state["lot_head"] else weight
        out["head.bias"] = tensors[f"{pre}last_layer.bias"]
        return {k: v.contiguous() for k, v in out.items()}

    def source_certificates(self, model: Any, images: torch.Tensor) -> SourceCertificates:
        """The source's rule (``utils.evaluate_certificates``): ``L = 1/max(std)``, every LOT
        layer taken as exactly 1-Lipschitz; with ``--lln`` the smallest
        ``(f_y − f_j)/(‖ŵ_y − ŵ_j‖·L)`` over every other class ``j`` (``lln_certificates``),
        else ``(f_y − max_{j≠y} f_j)/(√2·L)`` (``ortho_certificates``); certified when ``> eps``."""
        lipschitz = 1.0 / max(LOT_STD)
        with torch.no_grad():
            logits = model(images)
            preds = logits.argmax(1)
            own = torch.nn.functional.one_hot(preds, logits.shape[1]).to(logits.dtype)
            top = logits.gather(1, preds[:, None])
            if isinstance(model.head, LOTHead):  # their LOT last layer: ortho_certificates
                spread = torch.full_like(logits, 2.0 ** 0.5)
            else:
                rows = model.head.normalized_weight()
                spread = (rows[preds].unsqueeze(1) - rows.unsqueeze(0)).norm(dim=2) + own  # 1 on the own class
            radii = ((top - (logits - own * 1e6)) / (spread * lipschitz)).min(dim=1).values
        return SourceCertificates(predictions=preds, radii=radii, lipschitz=lipschitz,
                                  label="the source's L = 1/max(std): every LOT layer taken as exactly 1-Lipschitz")
