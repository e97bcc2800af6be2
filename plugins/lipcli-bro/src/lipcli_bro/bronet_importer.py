"""Importer ``bronet``: checkpoints of the BRONet authors' backbone network (github.com/ntuaislab/BRONet,
``bronet/train.py``: ``torch.save(dict(backbone=model.module.state_dict(), optimizer=..., ...))``
of ``bronet/models/model.py::BRONet``; a bare ``state_dict()`` too) onto the architecture
``bronet`` (:mod:`lipcli_bro.bronet`) with ``--conv bro:rank=R,border=zero,ridge=1e-7`` and
the ``lln`` head.

Source layout (backbone ``d`` blocks of width ``w`` and rank ``r``, ``n`` dense layers of width ``D``)::

    stem.0.weight (w, 3, k, k), stem.0.bias (w,)              -> body.stem_conv
    conv.weights (d, w, r, 3, 3), conv.gamma (d, w, 1, 1, 1),  -> body.block{i}_conv.weight:
    conv.identity (w, r, 3, 3)                                    V = identity + weights·gamma·d^-1/2, flipped
    conv.bias (d, w), conv.running_mean (d, w)                 -> body.block{i}_conv.bias = bias − running_mean
    neck.kernel (w, w·p²), neck.weight (D, w·(S/2p)²),         -> body.neck_conv, body.neck_dense
    neck.bias (D,)
    linear.weights (n, D, D), linear.gamma (n, D, 1),          -> body.dense{j}: X = identity + weights·gamma·n^-1/2,
    linear.identity (D, D), linear.bias (n, D)                    bias
    head.weight (K, D), head.bias (K,)                          -> head (lln)

That is the evaluation-mode function of the authors' code: their BRO layer uses
``bias − running_mean`` and the reflector of ``V`` with ``1e-7·mean(diag)`` added to ``VᴴV``
(``LiResConvOrtho.BRO``: ``ridge``), their Cholesky layers recompute ``L⁻¹X`` when put in
evaluation (so ``linear.eval_weight`` is not read).  ``rfft2`` of their filter is a
convolution, lipcli's ``kernel_spectrum`` a correlation: the filter is imported flipped.
Ignored (estimator state and constants): ``stem.0.init_x`` (the stem's power vector),
``conv.I_low``, ``conv.I_full``, ``linear.eval_weight`` and the optimizer's state.  Fixed as
the authors' code fixes them: the input shift ``x − 0.5``.

The options of the authors' configuration (``configs/*.yaml``, ``model:``; :data:`OPTIONS`)
that change no tensor shape — ``act_name``, ``use_lln``, ``backbone_type`` (``bro``, ``lot``,
``cholesky`` and ``cayley`` blocks have one layout), ``backbone_quasi_residual`` and
``backbone_zero_padding`` — are taken from the configuration ``train.py`` saves in every
checkpoint (``configs``) or from ``lip import --config``/``--option``, never assumed (a
configuration without the key gets ``BRONet``'s default, as their code does).
``backbone_quasi_residual: False`` makes the block filter ``V = γ·W`` (no identity);
``backbone_zero_padding: False`` makes the blocks' reflector act on the ``S/2 × S/2`` torus
(lipcli's ``border=circular``) instead of the zero-padded, cropped image.  Refused, naming the piece: the ImageNet patch stem, the hybrid
LiResNet + BRO backbone, non-BRO backbones, the ``l2`` and BRO necks and BRO dense layers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.importers import ImportPlan, ImportRefused, SourceCertificates

from lipcli.sdk.source_options import SourceOption, SourceOptions

from .bronet import AUTHORS_MEAN, AUTHORS_STD

SOURCE = "github.com/ntuaislab/BRONet"
DESCRIPTION = "the BRONet authors' BRO backbone network (bronet/): stem, BRO blocks, Cholesky neck and dense, LLN"
#: the authors' backbone solve regularisation (``LiResConvOrtho.BRO``: ``mean(diag)·1e-7``)
AUTHORS_BACKBONE_RIDGE = 1e-7
#: power-iteration steps of the authors' ``test.py`` (``model.set_num_lc_iter(500)``)
AUTHORS_TEST_LC_ITER = 500
_DATASETS = {(32, 10): "cifar10", (32, 100): "cifar100"}
#: every option of the authors' ``model:`` configuration that changes the network, and how it is handled
OPTIONS = (
    SourceOption("act_name", "every activation", "stated: 'MinMax' -> maxmin; others refused by name"),
    SourceOption("use_lln", "the head", "stated: True -> lln; False refused (no plain linear head in lipcli)"),
    SourceOption("backbone_type", "the block layer (one tensor layout for bro, lot, cholesky, cayley)",
                 "stated: 'bro' -> bro; 'lot', 'cholesky', 'cayley' refused by name (no lipcli layer computes "
                 "their frequency-domain LOT_ortho, CholeskyOrthConv or cayley_func on the shared block filter); "
                 "soc, sll, nonortho, hybrid and v2 refused by their keys"),
    SourceOption("backbone_quasi_residual", "the block filter: V = I + γ·W·depth^-1/2 or V = γ·W",
                 "stated: both mapped (the filter V is computed here)"),
    SourceOption("backbone_zero_padding", "the blocks' border: zero-pad and crop, or circular",
                 "stated: True -> bro border=zero, False -> border=circular"),
    SourceOption("backbone_centering", "running-mean subtraction", "the shapes (conv.running_mean)"),
    SourceOption("backbone_weight_rank_ratio, stem_kernel_size, depth, width, dense_width, linear_num, "
                 "neck_conv_patch_size, num_classes, input_size", "the sizes", "the shapes"),
    SourceOption("neck_conv_type, neck_linear_type, neck_conv_patch_size_2, dense_type, dense_quasi_residual",
                 "the neck and dense layers", "the keys: the Cholesky neck and dense layers mapped, the l2 and BRO "
                 "necks, a second neck convolution and BRO dense layers refused by name"),
    SourceOption("backbone_id_random_init, num_lc_iter", "initialisation / the estimate only", "not needed"),
)
#: ``backbone_type`` values with this layout that lipcli has no layer for
_UNMAPPED_BLOCKS = {"lot": "BRONet's LOT_ortho", "cholesky": "BRONet's CholeskyOrthConv",
                    "cayley": "BRONet's cayley_func"}
_IGNORED = ("stem.0.init_x", "conv.I_low", "conv.I_full", "linear.eval_weight")


def _prefix(names: set[str]) -> str:
    return "backbone." if any(n.startswith("backbone.") for n in names) else ""


def _dims(tensors: Mapping[str, Any], key: str, dims: int, what: str) -> tuple[int, ...]:
    t = tensors.get(key)
    if t is None or t.dim() != dims:
        raise ImportRefused(f"no {key} of {dims} dimensions: {what}")
    return tuple(int(s) for s in t.shape)


#: (keys that must be absent, keys that must be present, the refusal) in the order checked
_REFUSALS = (
    ((), ("stem.0.weight",), "no stem.0.weight: not a checkpoint of BRONet's bronet/ network"),
    (("conv_1.",), (), "cannot import the hybrid backbone (conv_1: LiResNet residual blocks before the BRO blocks, "
                       "the ImageNet configuration): the bronet arch has BRO blocks only"),
    (("conv.blocks.",), (), "cannot import a SOC or SLL backbone (conv.blocks): the bronet importer maps the BRO "
                            "backbone (backbone_type bro) only"),
    ((), ("conv.weights", "conv.I_low"), "no conv.weights with conv.I_low: the backbone is not BRONet's "
                                         "LiResConvOrtho (backbone_type bro; the v2 and non-orthogonal backbones are "
                                         "not mapped)"),
    (("neck.conv_layer",), ("neck.kernel",), "cannot import the l2 neck (LPPool2d, neck_conv_type l2): missing "
                                             "piece: an l2-pooling neck in the bronet arch"),
    (("neck.kernel_2",), (), "cannot import a second neck convolution (neck_conv_patch_size_2 > 0): the bronet arch "
                             "has one"),
    (("linear.residual_identity",), (), "cannot import BRO dense layers (dense_type bro, LiBroMLP): missing piece: "
                                        "a BRO dense layer in the bronet arch (it has the Cholesky ones)"),
)


def _refuse_unsupported(names: set[str], p: str) -> None:
    def has(part: str) -> bool:
        return any(n.startswith(p + part) for n in names)

    for absent, present, message in _REFUSALS:
        if any(has(part) for part in absent) or not all(has(part) for part in present):
            raise ImportRefused(message)


class BRONetImporter:
    """The ``bronet`` importer (see the module)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None,
             options: SourceOptions | None = None) -> ImportPlan:
        options = options if options is not None else SourceOptions()
        names = set(tensors)
        p = _prefix(names)
        _refuse_unsupported(names, p)
        hint = " (their configs/*.yaml, model:)"
        block = str(options.require("backbone_type", hint=hint, default="default")).lower()
        if block in _UNMAPPED_BLOCKS:
            raise ImportRefused(f"cannot import option backbone_type={block!r}: no lipcli layer computes "
                                f"{_UNMAPPED_BLOCKS[block]} (the bronet importer maps backbone_type 'bro')")
        if block != "bro":
            raise ImportRefused(f"cannot import option backbone_type={block!r}: the bronet importer maps "
                                "backbone_type 'bro' only")
        activation = options.choose("act_name", {"minmax": "maxmin"}, key=lambda v: str(v).lower(), hint=hint,
                                    default="MinMax")
        head = options.choose("use_lln", {True: "lln"}, hint=hint, default=True)
        quasi = bool(options.choose("backbone_quasi_residual", {True: True, False: False}, hint=hint, default=True))
        border = options.choose("backbone_zero_padding", {True: "zero", False: "circular"}, hint=hint, default=True)
        stated = {"backbone_type": "bro", "act_name": options.require("act_name", default="MinMax"),
                  "use_lln": True, "backbone_quasi_residual": quasi, "backbone_zero_padding": border == "zero"}
        if arch is not None and arch.strip().split(":")[0] != "bronet":
            raise LipUsageError(f"--arch {arch!r}: the bronet importer builds the arch 'bronet' (its shapes are "
                                "read from the checkpoint)")
        w, cin, k, k2 = _dims(tensors, p + "stem.0.weight", 4, "cannot read the stem")
        if k != k2 or k % 2 == 0 or cin != 3:
            raise ImportRefused(f"cannot import the stem stem.0.weight {(w, cin, k, k2)}: the bronet arch has the "
                                "stride-2 stem with an odd square kernel on RGB images (not the ImageNet patch stem)")
        d, w_conv, r, *taps = _dims(tensors, p + "conv.weights", 5, "cannot read the backbone")
        if w_conv != w or taps != [3, 3] or not 1 <= r < w:
            raise ImportRefused(f"conv.weights has shape {(d, w_conv, r, *taps)}: not a BRO backbone of width {w} "
                                "(rank below the width: backbone_type lot, cholesky and cayley are not mapped)")
        rows, cols = _dims(tensors, p + "neck.kernel", 2, "cannot read the neck")
        patch = math.isqrt(cols // w) if rows == w else 0
        if rows != w or patch * patch * w != cols:
            raise ImportRefused(f"neck.kernel has shape {(rows, cols)}, not ({w}, {w}*p^2): the BRO neck "
                                "(neck_conv_type bro) is not mapped: missing piece: a BRO patch convolution")
        D, mid = _dims(tensors, p + "neck.weight", 2, "cannot read the neck")
        cells = mid // w
        side = 2 * patch * math.isqrt(cells)
        if cells * w != mid or (side // (2 * patch)) ** 2 != cells:
            raise ImportRefused(f"neck.weight has {mid} inputs, not {w}*(S/{2 * patch})^2 for a square image: "
                                "not the Cholesky neck (neck_linear_type cholesky)")
        n = _dims(tensors, p + "linear.weights", 3, "")[0] if p + "linear.weights" in names else 0
        K = _dims(tensors, p + "head.weight", 2, "cannot read the head")[0]
        expected: dict[str, tuple[int, ...]] = {
            p + "stem.0.weight": (w, 3, k, k), p + "stem.0.bias": (w,),
            p + "conv.weights": (d, w, r, 3, 3), p + "conv.gamma": (d, w, 1, 1, 1), p + "conv.identity": (w, r, 3, 3),
            p + "conv.bias": (d, w),
            p + "neck.kernel": (w, w * patch * patch), p + "neck.weight": (D, mid), p + "neck.bias": (D,),
            p + "head.weight": (K, D), p + "head.bias": (K,),
        }
        centering = p + "conv.running_mean" in names
        if centering:
            expected[p + "conv.running_mean"] = (d, w)
        if n:
            expected.update({p + "linear.weights": (n, D, D), p + "linear.gamma": (n, D, 1),
                             p + "linear.identity": (D, D), p + "linear.bias": (n, D)})
        ignored = tuple(p + key for key in _IGNORED if p + key in names)
        if p:  # bronet/train.py's checkpoint: the optimizer's state beside the model's
            ignored += tuple(sorted(key for key in names if key.startswith("optimizer.")))
        options.require("backbone_centering", told=p + "conv.running_mean" in names)
        conv = f"bro:rank={r},border={border},ridge={AUTHORS_BACKBONE_RIDGE:g}"
        model: dict[str, Any] = {
            "arch": f"bronet:depth={d},width={w},stem_kernel={k},neck_patch={patch},dense={n},dense_width={D}",
            "conv": conv, "activation": activation, "pool": "max", "head": head, "num_classes": K,
            "in_channels": 3, "image_size": (side, side), "mean": AUTHORS_MEAN, "std": AUTHORS_STD,
        }
        return ImportPlan(model=model, expected=expected, ignored=ignored, dataset=_DATASETS.get((side, K)),
                          description=f"BRONet (bronet/): {k}x{k} stem, {d} BRO blocks (width {w}, rank {r}), "
                                      f"Cholesky neck ({patch}x{patch} patches) and {n} dense layers (width {D}), "
                                      f"MaxMin, LLN head, {K} classes",
                          source_state={"prefix": p, "depth": d, "dense": n, "side": side, "centering": centering,
                                        "quasi_residual": quasi, "border": border},
                          options=stated)

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]:
        st = plan.source_state
        p, d, n, side = st["prefix"], st["depth"], st["dense"], st["side"]
        out: dict[str, Any] = {"body.normalize.mean": torch.tensor(AUTHORS_MEAN),
                               "body.normalize.std": torch.tensor(AUTHORS_STD),
                               "body.stem_conv.weight": tensors[p + "stem.0.weight"],
                               "body.stem_conv.bias": tensors[p + "stem.0.bias"]}
        # the authors' expressions, in their order of operations (LiResConvOrtho.get_wfft_ortho, forward)
        if st.get("quasi_residual", True):
            V = tensors[p + "conv.identity"] + tensors[p + "conv.weights"] * tensors[p + "conv.gamma"] * d ** -0.5
        else:  # backbone_quasi_residual: False (get_wfft_ortho: V = gamma * weights)
            V = tensors[p + "conv.gamma"] * tensors[p + "conv.weights"]
        bias = tensors[p + "conv.bias"]
        if st["centering"]:
            bias = bias - tensors[p + "conv.running_mean"]
        grid = side // 2 + 2 if st.get("border", "zero") == "zero" else side // 2  # their padding_input_size
        padded = torch.tensor((grid, grid), dtype=torch.int64)
        for i in range(d):
            out[f"body.block{i + 1}_conv.weight"] = V[i].flip(-1, -2)  # convolution -> correlation
            out[f"body.block{i + 1}_conv.bias"] = bias[i]
            out[f"body.block{i + 1}_conv.spatial_size"] = padded.clone()
        out["body.neck_conv.weight"] = tensors[p + "neck.kernel"]
        out["body.neck_dense.weight"] = tensors[p + "neck.weight"]
        out["body.neck_dense.bias"] = tensors[p + "neck.bias"]
        if n:  # LiResMLP.get_weight
            X = tensors[p + "linear.identity"] + tensors[p + "linear.weights"] * tensors[p + "linear.gamma"] * n ** -0.5
            for j in range(n):
                out[f"body.dense{j + 1}.weight"] = X[j]
                out[f"body.dense{j + 1}.bias"] = tensors[p + "linear.bias"][j]
        out["head.weight"] = tensors[p + "head.weight"]
        out["head.bias"] = tensors[p + "head.bias"]
        return {key: v.contiguous() for key, v in out.items()}

    def source_certificates(self, model: Any, images: torch.Tensor) -> SourceCertificates:
        """The source's rule (``test.py``: ``sub_lipschitz`` with 500 power steps, then
        ``get_predictions``): ``L`` = the stem's power-iteration estimate (from the all-ones
        vector: the stored one is not imported) times the largest singular values of the neck's
        and the dense layers' matrices (the BRO blocks taken as 1); the image is certified at
        ``eps`` when the predicted logit is at least every other ``f_j + L·eps·‖ŵ_y − ŵ_j‖``."""
        body = model.body
        with torch.no_grad():
            lip = body.stem_conv.power_estimate(AUTHORS_TEST_LC_ITER)
            for name, layer in body.named_children():
                if name == "neck_conv" or name.startswith("neck_dense") or (name.startswith("dense") and "_" not in name):
                    lip *= float(torch.linalg.matrix_norm(layer.matrix().reshape(layer.matrix().shape[0], -1), ord=2))
            logits = model(images)
            preds = logits.argmax(1)
            own = torch.nn.functional.one_hot(preds, logits.shape[1]).to(logits.dtype)
            rows = model.head.normalized_weight()
            spread = (rows[preds].unsqueeze(1) - rows.unsqueeze(0)).norm(dim=2) + own
            top = logits.gather(1, preds[:, None])
            radii = ((top - (logits - own * 1e6)) / (spread * lip)).min(dim=1).values
        return SourceCertificates(predictions=preds, radii=radii, lipschitz=lip, strict=False,
                                  label=f"the source's sub_lipschitz: {AUTHORS_TEST_LC_ITER} power steps on the stem "
                                        "(an estimate), SVD of the Cholesky layers, BRO blocks taken as 1")
