"""Importer ``sll``: checkpoints saved by the SLL authors' code
(github.com/araujoalexandre/Lipschitz-SLL-Networks, ``core/trainer.py``: ``torch.save`` of
``{"epoch", "global_step", "model_state_dict", "optimizer_state_dict"}``, the model wrapped
as ``DataParallel(NormalizedModel(LipschitzNetwork))``) onto the ``sll-*`` architectures
(:mod:`lipcli_sll.network`) with the ``sll`` convolution and the ``lln`` head.

Source layout (prefix ``P`` = ``[model_state_dict.][module.]model.model.``; ``n`` convolutions,
``d`` dense layers, width ``w``; index 0 is ``PaddingChannels``, ``n+1`` the sum pool,
``n+2`` the flatten)::

    P{i}.kernel (h, w, 3, 3), .bias (1, h, 1, 1), .q (h,)   i = 1..n   -> body.conv{i}
    P{n+2+j}.weight (H, D), .bias (1, H), .q (H,)           j = 1..d   -> body.dense{j}
    P{n+d+3}.weight (K, D), .bias (K,)                      LinearNormalized -> head (lln)

The authors' convolution computes ``T_i = Σ_{j,δ} e^{-q_i} |G[i, j, δ]| e^{q_i}``: its ``q``
cancels (both factors are indexed by the output unit), so the layer is lipcli's with
``log_q = 0`` and ``q`` is read only to refuse values whose ``exp`` leaves float32 (there the
authors' own output is not finite).  The dense layer's ``T_i = Σ_j |WWᵀ|_ij q_j / q_i`` is
lipcli's with ``log_q = q``.  The input normalisation is not in the checkpoint: the
authors' readers fix it by data set (mean per ``core/data/readers.py`` with ``shift_data``,
std 1), told apart by the class count (10, 100: CIFAR, 32×32; 200: Tiny ImageNet, 64×64).  The optimizer
state is training state lipcli does not use.

Also read: the ``LipschitzNetwork``'s own ``state_dict()`` saved alone (prefix ``model.``, no
``NormalizedModel`` around it; its inputs are then the reader's, hence the same mean in
front) and networks without convolutions (``--n_conv 0``: ``PaddingChannels`` alone before
the pool; ``D`` from the head).  The options of ``main.py`` (:data:`OPTIONS`): the sizes are
the shapes; ``shift_data`` (whether the reader subtracts the mean) changes no tensor, so it
is taken from ``lip import --config`` (their arguments as JSON) or ``--option shift_data=...``,
never assumed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.importers import ImportPlan, ImportRefused, SourceCertificates
from lipcli.sdk.source_options import SourceOption, SourceOptions

from .network import SIZES, InputScale

SOURCE = "github.com/araujoalexandre/Lipschitz-SLL-Networks"
DESCRIPTION = "SLL network (convolutions, dense layers, LLN head) saved by the SLL authors' core/trainer.py"
#: classes -> (lipcli data set or None, image side, the authors' reader's mean)
_READERS = {
    10: ("cifar10", 32, (0.4913, 0.4821, 0.4465)),
    100: ("cifar100", 32, (0.5071, 0.4865, 0.4409)),
    200: (None, 64, (0.485, 0.456, 0.406)),  # tiny-imagenet: no built-in lipcli data set
}
#: |q| beyond which exp(±q) under- or overflows float32 (the authors' T is then not ``Σ|G|``)
_MAX_ABS_Q = 80.0
_PREFIX = re.compile(r"^((?:model_state_dict\.)?(?:module\.)?(?:model\.)?model\.)\d+\.(?:kernel|weight)$")
#: every option of main.py that changes the network, and how it is handled
OPTIONS = (
    SourceOption("shift_data", "the input mean the reader subtracts (or none)",
                 "stated (--config/--option): True -> the reader's mean, False -> 0"),
    SourceOption("dataset", "the input size and the mean", "the class count (10, 100, 200); a stated value must agree"),
    SourceOption("n_conv, n_dense, w, conv_inner_dim, dense_inner_dim", "the sizes",
                 "the shapes (n_conv 0: PaddingChannels alone); stated values must agree"),
)
_CLASSES = {"cifar10": 10, "cifar100": 100, "tiny-imagenet": 200}


def _prefix(names: set[str]) -> str:
    found = {m.group(1) for n in names if (m := _PREFIX.match(n))}
    if len(found) != 1:
        raise ImportRefused("no single '[model_state_dict.][module.][model.]model.<i>.kernel' or '.weight': not a "
                            "checkpoint of the SLL authors' LipschitzNetwork")
    return found.pop()


def _shape(tensors: Mapping[str, Any], key: str, dims: int) -> tuple[int, ...]:
    t = tensors.get(key)
    if t is None or t.dim() != dims:
        raise ImportRefused(f"no {key} of {dims} dimensions: cannot read the SLL network's sizes")
    return tuple(int(s) for s in t.shape)


def _sizes(tensors: Mapping[str, Any], p: str) -> dict[str, int]:
    """``n, d, w, h, H, K``, the head's index and the data set's reader from the shapes (the
    layer indices, the first filter, the head's bias and the first dense layer)."""
    names = set(tensors)
    n = 0
    while f"{p}{n + 1}.kernel" in names:
        n += 1
    indices = sorted(int(m.group(1)) for k in names if (m := re.fullmatch(re.escape(p) + r"(\d{1,6})\.weight", k)))
    if not n:  # n_conv 0: the width from the head's D = w * (S/4)^2
        if not indices:
            raise ImportRefused(f"no {p}<i>.weight: cannot find the LinearNormalized head")
        K0, D0 = _shape(tensors, f"{p}{indices[-1]}.weight", 2)
        side0 = _READERS.get(K0, (None, 32))[1]
        cells = (side0 // 4) ** 2
        if D0 % cells:
            raise ImportRefused(f"{p}{indices[-1]}.weight has {D0} features, not w*{cells}: not the authors' "
                                "LipschitzNetwork")
        h, w, kh, kw = 0, D0 // cells, 3, 3
    else:
        h, w, kh, kw = _shape(tensors, f"{p}1.kernel", 4)
    if (kh, kw) != (3, 3):
        raise ImportRefused(f"cannot import a {kh}x{kw} SLL filter: the authors' layer pads by 1, "
                            "so only 3x3 filters are the function they compute")
    if w < 3:
        raise ImportRefused(f"cannot import width {w}: the authors' PaddingChannels needs at least 3 channels")
    if not indices or indices[-1] < n + 3:
        raise ImportRefused(f"no {p}<i>.weight after the convolutions: cannot find the LinearNormalized head")
    last = indices[-1]
    d = last - n - 3
    if indices[0] != n + 3 or len(indices) != last - n - 2 or len(set(indices)) != len(indices):  # sorted: consecutive iff this (no range of a key's index)
        raise ImportRefused(f"dense layers {p}{n + 3}.. are not consecutive: not the authors' LipschitzNetwork")
    (K,) = _shape(tensors, f"{p}{last}.bias", 1)
    if K not in _READERS:
        raise ImportRefused(f"cannot import {K} classes: the authors' readers are CIFAR-10, CIFAR-100 "
                            "(32x32) and Tiny ImageNet (200 classes, 64x64)")
    side = _READERS[K][1]
    D = w * (side // 4) ** 2
    H = _shape(tensors, f"{p}{n + 3}.weight", 2)[0] if d else D
    return {"n": n, "d": d, "w": w, "h": h, "H": H, "D": D, "K": K, "last": last, "side": side}


def _check_arch(arch: str | None, s: dict[str, int]) -> None:
    if arch is None:
        return
    name = arch.strip()
    if name not in {f"sll-{size}" for size in SIZES}:
        raise LipUsageError(f"--arch {arch!r}: the sll importer takes one of "
                            f"{', '.join(f'sll-{size}' for size in SIZES)} (or none: read from the shapes)")
    depth, dense, width, _hidden = SIZES[name[4:]]
    if (depth, dense, width) != (s["n"], s["d"], s["w"]):
        raise ImportRefused(f"--arch {name} has {depth} convolutions, {dense} dense layers, width {width}; "
                            f"the checkpoint has {s['n']}, {s['d']}, {s['w']}")


class SLLImporter:
    """The ``sll`` importer (see the module)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None,
             options: SourceOptions | None = None) -> ImportPlan:
        options = options if options is not None else SourceOptions()
        p = _prefix(set(tensors))
        s = _sizes(tensors, p)
        _check_arch(arch, s)
        n, d, w, h, H, D, K, side = (s[k] for k in ("n", "d", "w", "h", "H", "D", "K", "side"))
        dataset, _side, mean = _READERS[K]
        stated_set = options.require("dataset", told=None, default=None) if options.lookup("dataset")[0] else None
        if stated_set is not None and _CLASSES.get(str(stated_set)) != K:
            raise ImportRefused(f"option dataset={stated_set!r} is stated, but the checkpoint's head has {K} classes")
        for name, value in (("n_conv", n), ("n_dense", d), ("w", w)):
            options.require(name, told=value)
        shift = options.choose("shift_data", {True: True, False: False}, hint=" (their main.py arguments)",
                               default=True)
        if not shift:
            mean = (0.0, 0.0, 0.0)
        expected: dict[str, tuple[int, ...]] = {}
        for i in range(1, n + 1):
            expected.update({f"{p}{i}.kernel": (h, w, 3, 3), f"{p}{i}.bias": (1, h, 1, 1), f"{p}{i}.q": (h,)})
        for j in range(n + 3, n + 3 + d):
            expected.update({f"{p}{j}.weight": (H, D), f"{p}{j}.bias": (1, H), f"{p}{j}.q": (H,)})
        expected.update({f"{p}{s['last']}.weight": (K, D), f"{p}{s['last']}.bias": (K,)})
        for i in range(1, n + 1):
            q = tensors.get(f"{p}{i}.q")
            if q is not None and tuple(q.shape) == (h,) and bool(q.isfinite().all()) and float(q.abs().max()) > _MAX_ABS_Q:
                raise ImportRefused(f"cannot import {p}{i}.q: |q| > {_MAX_ABS_Q:g} overflows exp in float32, "
                                    "where the authors' layer does not compute its own T")
        ignored = tuple(k for k in tensors if k.startswith("optimizer_state_dict."))
        model: dict[str, Any] = {
            "arch": f"sll-small:depth={n},dense={d},width={w},dense_hidden={H}",
            "conv": f"sll:hidden={h or 1}",  # n_conv 0: no convolution built
            "activation": "maxmin", "pool": "max",  # unused: SLL layers have their own ReLU and sum pool
            "head": "lln", "num_classes": K, "in_channels": 3, "image_size": (side, side),
            "mean": mean, "std": (1.0, 1.0, 1.0),
        }
        return ImportPlan(model=model, expected=expected, ignored=ignored, dataset=dataset,
                          description=f"SLL network ({n} convolutions of width {w}, {h} hidden; "
                                      f"{d} dense layer{'' if d == 1 else 's'} of {H}), LLN head, {K} classes",
                          source_state={"prefix": p, "convs": n, "dense": d, "head": s["last"]},
                          options={"shift_data": shift, "n_conv": n, "n_dense": d, "w": w})

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]:
        p, n, d = plan.source_state["prefix"], plan.source_state["convs"], plan.source_state["dense"]
        scale = InputScale(plan.model["mean"], plan.model["std"])  # the network's own buffers
        out: dict[str, Any] = {f"body.normalize.{k}": v for k, v in scale.state_dict().items()}
        for i in range(1, n + 1):
            kernel = tensors[f"{p}{i}.kernel"]
            out.update({f"body.conv{i}.weight": kernel, f"body.conv{i}.bias": tensors[f"{p}{i}.bias"].flatten(),
                        f"body.conv{i}.log_q": torch.zeros(kernel.shape[0], dtype=kernel.dtype)})
        for j in range(1, d + 1):
            src = f"{p}{n + 2 + j}"
            out.update({f"body.dense{j}.weight": tensors[f"{src}.weight"][:, :, None, None],
                        f"body.dense{j}.bias": tensors[f"{src}.bias"].flatten(),
                        f"body.dense{j}.log_q": tensors[f"{src}.q"]})
        out["head.weight"] = tensors[f"{p}{plan.source_state['head']}.weight"]
        out["head.bias"] = tensors[f"{p}{plan.source_state['head']}.bias"]
        return {k: v.contiguous() for k, v in out.items()}

    def source_certificates(self, model: Any, images: torch.Tensor) -> SourceCertificates:
        """The source's rule (``core/evaluate.py``, ``eval_certified``): ``lip_cst = 1`` (every
        layer taken as exactly 1-Lipschitz) and the smallest ``(f_y − f_j)/‖ŵ_y − ŵ_j‖`` over
        all other classes ``j``; certified when ``> eps``."""
        with torch.no_grad():
            logits = model(images)
            preds = logits.argmax(1)
            wn = model.head.normalized_weight()
            gaps = logits.gather(1, preds[:, None]) - logits
            dist = torch.linalg.vector_norm(wn[preds][:, None, :] - wn[None, :, :], dim=2)
            ratio = gaps / dist.where(dist > 0, torch.ones_like(dist))
            ratio[torch.arange(len(preds)), preds] = torch.inf
            radii = ratio.min(1).values.clamp_min(0)
        return SourceCertificates(predictions=preds, radii=radii, lipschitz=1.0,
                                  label="the source's lip_cst = 1: every layer taken as exactly 1-Lipschitz")
