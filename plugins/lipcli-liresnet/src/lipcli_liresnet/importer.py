"""Importer ``liresnet``: checkpoints saved by the LiResNet authors' code (github.com/hukkai/liresnet,
``train.py``: ``torch.save`` of ``{"backbone": model.module.state_dict(), "optimizer", ...}``, or
the bare ``GloroNet`` state dict, with or without ``module.``) onto ``--arch liresnet`` with
the authors' options and ``layers=free`` (:mod:`lipcli_liresnet.free_conv`), MaxMin and the LLN head.

Source layout (prefix ``P`` = ``[backbone.][module.]``; ``d`` residual blocks of width ``w`` on
``16×16``, neck and dense width ``D``, ``n`` dense layers, ``K`` classes)::

    P stem.0.weight (w, 3, 5, 5), .bias (w,)        5×5 stride-2 conv      -> body.stem_conv
    P conv.weights (d, w, w, 3, 3), .gamma (d, w, 1, 1, 1), .bias (d, w),
      .running_mean (d, w) (centring), .identity, .init_x (1, d·w, 16, 16)
                                                    -> body.block{i}_res (weight, gamma, bias,
                                                       running_mean; power_v = init_x's block i)
    P neck.kernel (w, 16w)  Cholesky-orthogonalised -> body.neck_conv (the 4×4 stride-4 conv
                                                       as pixel_unshuffle + 1×1)
    P neck.weight (D, 16w), .bias (D,)  Cholesky-orthogonalised -> body.neck_dense
    P linear.weights (n, D, D), .gamma (n, D, 1), .bias (n, D), .identity
                                        CholeskyOrth(I + W·γ·n^-1/2) -> body.dense{j}
    P head.weight (K, D), .bias (K,)                LLN (use_lln: True)  -> head (lln)

The neck and dense matrices are what the authors' evaluation computes from the parameters
(``Map2Vec.get_weight``, ``LiResMLP.train(False)``: ``L⁻¹X`` with ``LLᵀ = XXᵀ + ε·I``, in
float32 as there); ``linear.eval_weight`` is their cached copy of the same (recomputed by
``model.eval()``), the stem's ``init_x`` their power-iteration vector, and the optimizer
state training state: read by no one here.  The input transform is the authors' ``x − 0.5``.

The options of the authors' ``train.py`` configuration (``configs/*.yaml``, ``model:`` and
``dataset:``; :data:`OPTIONS`) that change the network: the shapes tell the sizes and the
centring; ``act_name`` and ``use_lln`` change no shape, so they are taken from the
configuration ``train.py`` saves in every checkpoint (``configs``, read as plain values by
the weights-only loader) or, for a bare state dict, from ``lip import --config`` (their YAML)
or ``--option``: never assumed (a configuration that leaves a key out gets ``GloroNet``'s
default for it, as their code does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from .cholesky import cholesky_orthogonal
from lipcli.sdk.errors import LipUsageError
from .free_conv import FreeConv
from lipcli.sdk.importers import ImportPlan, ImportRefused, SourceCertificates
from lipcli.sdk.source_options import SourceOption, SourceOptions

from .network import MAX_DENSE, MAX_DEPTH, MAX_WIDTH, PATCH
from .residual import ResidualConv

SOURCE = "github.com/hukkai/liresnet"
DESCRIPTION = "LiResNet (residual blocks, neck, dense layers, LLN head) saved by the LiResNet authors' train.py"
#: the authors' CIFAR stem (``build_stem``: 5×5, stride 2, input 32) and its output side
STEM_KERNEL, FEATURE_SIDE, INPUT_SIDE = 5, 16, 32
#: classes -> lipcli data set (CIFAR, 32×32)
DATASETS = {10: "cifar10", 100: "cifar100"}
#: the power-iteration steps of the authors' evaluation (``train.py``: ``set_num_lc_iter(500)``)
EVAL_LC_ITERS = 500
#: every option of the authors' configuration that changes the network, and how it is handled
OPTIONS = (
    SourceOption("act_name", "every activation (stem, blocks, neck, dense)",
                 "stated (configs or --config/--option): 'MinMax' -> maxmin; HalfAbs, ReLU, RAbs and the "
                 "HouseHolder activations refused by name"),
    SourceOption("use_lln", "the head: normalised rows (LLN) or a plain linear layer",
                 "stated: True -> lln; False refused (no plain linear head in lipcli)"),
    SourceOption("input_size", "the stem (5x5 stride 2 for 32 and 64, a patch stem for 224)",
                 "the shapes (init_x side 16: 32); a stated value must agree; 64 and 224 refused"),
    SourceOption("depth, width, num_classes", "the sizes", "the shapes"),
    SourceOption("centering (LiResConv, not a config key)", "running-mean subtraction in the blocks",
                 "the shapes (conv.running_mean present or not)"),
    SourceOption("num_lc_iter", "the power-iteration estimate only (not the function)", "not needed"),
)
#: ``act_name`` (lower-cased, as their ``build_activation``) -> lipcli activation
ACTIVATIONS = {"minmax": "maxmin"}
_PREFIX = re.compile(r"^((?:backbone\.)?(?:module\.)?)conv\.weights$")


def _prefix(names: set[str]) -> str:
    """``[backbone.][module.]``, the one prefix of ``conv.weights`` in the checkpoint."""
    found = {m.group(1) for n in names if (m := _PREFIX.match(n))}
    if len(found) == 1:
        return found.pop()
    raise ImportRefused("no single '[backbone.][module.]conv.weights': not a checkpoint of the LiResNet "
                        "authors' GloroNet")


def _shape(tensors: Mapping[str, Any], key: str, dims: int) -> tuple[int, ...]:
    """The shape of ``tensors[key]``, which must have ``dims`` dimensions."""
    t = tensors.get(key)
    if t is not None and t.dim() == dims:
        return tuple(int(s) for s in t.shape)
    raise ImportRefused(f"no {key} of {dims} dimensions: cannot read the LiResNet's sizes")


def _sizes(tensors: Mapping[str, Any], p: str) -> dict[str, int]:
    """``d, w, k, c, D, n, K`` and whether the blocks are centred, from the shapes alone."""
    d, w, w2, kh, kw = _shape(tensors, f"{p}conv.weights", 5)
    if w2 != w or (kh, kw) != (3, 3):
        raise ImportRefused(f"{p}conv.weights has shape {(d, w, w2, kh, kw)}: not the authors' LiResConv")
    wo, c, k, k2 = _shape(tensors, f"{p}stem.0.weight", 4)
    if (k, k2) != (STEM_KERNEL, STEM_KERNEL):
        raise ImportRefused(f"cannot import a {k}x{k2} stem: lipcli's liresnet has the authors' CIFAR stem "
                            f"(5x5, stride 2, 32x32 input); their ImageNet patch stem is not built")
    side = _shape(tensors, f"{p}conv.init_x", 4)[-1]
    if side != FEATURE_SIDE:
        raise ImportRefused(f"cannot import {side}x{side} residual blocks ({2 * side}x{2 * side} input): "
                            f"lipcli's liresnet runs its blocks on 16x16 (the authors' CIFAR layout)")
    D = _shape(tensors, f"{p}neck.weight", 2)[0]
    n = _shape(tensors, f"{p}linear.weights", 3)[0]
    (K,) = _shape(tensors, f"{p}head.bias", 1)
    if wo != w or w % 2 or D % 2:
        raise ImportRefused(f"cannot import stem width {wo}, block width {w}, dense width {D}: MinMax needs "
                            "equal, even widths")
    if not (1 <= d <= MAX_DEPTH and w <= MAX_WIDTH and n <= MAX_DENSE and D <= 16 * MAX_WIDTH and K >= 2):
        raise ImportRefused(f"cannot import depth {d}, width {w}, {n} dense layers of {D}, {K} classes: "
                            f"beyond lipcli's liresnet (depth <= {MAX_DEPTH}, width <= {MAX_WIDTH}, "
                            f"<= {MAX_DENSE} dense layers, >= 2 classes)")
    return {"d": d, "w": w, "c": c, "D": D, "n": n, "K": K,
            "centering": int(f"{p}conv.running_mean" in tensors)}


def cholesky_orth(X: torch.Tensor) -> torch.Tensor:
    """The authors' orthogonalisation of ``X`` (batched over leading dimensions, in ``X``'s
    dtype): :func:`lipcli_liresnet.cholesky.cholesky_orthogonal` with their ridge; ``ImportRefused``
    when the Gram is not positive definite."""
    try:
        return cholesky_orthogonal(X)
    except torch.linalg.LinAlgError:
        raise ImportRefused("cannot import a neck or dense matrix whose Gram is not positive definite: "
                            "the authors' Cholesky orthogonalisation fails on it") from None


def _identity_pattern(t: torch.Tensor) -> torch.Tensor:
    """The authors' ``identity`` buffer for a tensor of ``t``'s shape (its last two dims
    square, or a centre tap)."""
    if t.dim() == 2:
        return torch.eye(t.shape[0], dtype=t.dtype)
    out = torch.zeros_like(t)
    out[..., 1, 1] = torch.eye(t.shape[1], dtype=t.dtype)
    return out


class LiResNetImporter:
    """The ``liresnet`` importer (see the module)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None,
             options: SourceOptions | None = None) -> ImportPlan:
        options = options if options is not None else SourceOptions()
        if arch is not None:
            raise LipUsageError(f"--arch {arch!r}: the liresnet importer reads the architecture from the "
                                "checkpoint's shapes (leave --arch out)")
        p = _prefix(set(tensors))
        s = _sizes(tensors, p)
        d, w, c, D, n, K, centred = (s[k] for k in ("d", "w", "c", "D", "n", "K", "centering"))
        hint = " (their configs/*.yaml)"
        # GloroNet's own defaults (act_name='MinMax', use_lln=True) for a configuration without the key
        activation = options.choose("act_name", ACTIVATIONS, key=lambda v: str(v).lower(), hint=hint,
                                    default="MinMax")
        head = options.choose("use_lln", {True: "lln"}, hint=hint, default=True)
        options.require("input_size", told=INPUT_SIDE)
        options.require("num_classes", told=K)
        options.require("depth", told=d)
        options.require("width", told=w)
        stated = {"act_name": options.require("act_name", default="MinMax"), "use_lln": True}
        flat = w * (FEATURE_SIDE // PATCH) ** 2
        expected: dict[str, tuple[int, ...]] = {
            f"{p}stem.0.weight": (w, c, STEM_KERNEL, STEM_KERNEL), f"{p}stem.0.bias": (w,),
            f"{p}conv.weights": (d, w, w, 3, 3), f"{p}conv.gamma": (d, w, 1, 1, 1), f"{p}conv.bias": (d, w),
            f"{p}conv.identity": (d, w, w, 3, 3), f"{p}conv.init_x": (1, d * w, FEATURE_SIDE, FEATURE_SIDE),
            f"{p}neck.kernel": (w, flat), f"{p}neck.weight": (D, flat), f"{p}neck.bias": (D,),
            f"{p}linear.weights": (n, D, D), f"{p}linear.gamma": (n, D, 1), f"{p}linear.bias": (n, D),
            f"{p}linear.identity": (D, D), f"{p}head.weight": (K, D), f"{p}head.bias": (K,),
        }
        if centred:
            expected[f"{p}conv.running_mean"] = (d, w)
        ignored = tuple(k for k in tensors if k.startswith("optimizer.")) + tuple(
            k for k in (f"{p}stem.0.init_x", f"{p}linear.eval_weight") if k in tensors)
        model: dict[str, Any] = {
            "arch": (f"liresnet:depth={d},width={w},block=residual,dense={n},gamma=true,depth_scale=true,"
                     f"centering={'true' if centred else 'false'},stem_kernel={STEM_KERNEL},neck=patch,"
                     f"dense_width={D},features=act,layers=free"),
            "conv": "soc-fast", "pool": "max",  # unused: layers=free, features=act
            "activation": activation, "head": head, "num_classes": K, "in_channels": c,
            "image_size": (INPUT_SIDE, INPUT_SIDE), "mean": (0.5,) * c, "std": (1.0,) * c,
        }
        return ImportPlan(model=model, expected=expected, ignored=ignored, dataset=DATASETS.get(K),
                          description=f"LiResNet ({d} residual blocks of width {w}{', centred' if centred else ''}; "
                                      f"{n} dense layer{'' if n == 1 else 's'} of {D}), LLN head, {K} classes",
                          source_state={"prefix": p, **s}, options=stated)

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]:
        st = plan.source_state
        p, d, w, n = st["prefix"], st["d"], st["w"], st["n"]
        for key in (f"{p}conv.identity", f"{p}linear.identity"):
            if not torch.equal(tensors[key], _identity_pattern(tensors[key])):
                raise ImportRefused(f"cannot import {key}: it is not the identity the authors' layer adds")
        out: dict[str, Any] = {"body.normalize.mean": torch.tensor(plan.model["mean"]),
                               "body.normalize.std": torch.tensor(plan.model["std"]),
                               "body.stem_conv.weight": tensors[f"{p}stem.0.weight"],
                               "body.stem_conv.bias": tensors[f"{p}stem.0.bias"]}
        init_x = tensors[f"{p}conv.init_x"].reshape(d, w, FEATURE_SIDE, FEATURE_SIDE)
        for i in range(d):
            b = f"body.block{i + 1}_res."
            v = init_x[i:i + 1]
            out.update({b + "weight": tensors[f"{p}conv.weights"][i], b + "bias": tensors[f"{p}conv.bias"][i],
                        b + "gamma": tensors[f"{p}conv.gamma"][i].reshape(w),
                        b + "power_v": v / v.norm().clamp_min(1e-30)})
            if st["centering"]:
                out[b + "running_mean"] = tensors[f"{p}conv.running_mean"][i]
        # Map2Vec.get_weight: ε = mean(diag Σ)/1000 (a Python number there: equal to rounding)
        kernel, weight = tensors[f"{p}neck.kernel"], tensors[f"{p}neck.weight"]
        for name, X in (("neck_conv", kernel), ("neck_dense", weight)):
            out[f"body.{name}.weight"] = cholesky_orth(X)[:, :, None, None]
        out["body.neck_conv.bias"] = torch.zeros(w, dtype=kernel.dtype)
        out["body.neck_dense.bias"] = tensors[f"{p}neck.bias"]
        # LiResMLP.get_weight: CholeskyOrth(I + W·γ·n^-1/2), ε = 1e-3·mean(diag Σ) per layer
        if n:
            X = tensors[f"{p}linear.identity"] + tensors[f"{p}linear.weights"] * tensors[f"{p}linear.gamma"] * n ** -0.5
            dense = cholesky_orth(X)
            for j in range(n):
                out[f"body.dense{j + 1}.weight"] = dense[j][:, :, None, None]
                out[f"body.dense{j + 1}.bias"] = tensors[f"{p}linear.bias"][j]
        out["head.weight"], out["head.bias"] = tensors[f"{p}head.weight"], tensors[f"{p}head.bias"]
        return {k: v.contiguous() for k, v in out.items()}

    def source_certificates(self, model: Any, images: torch.Tensor) -> SourceCertificates:
        """The authors' rule (``train.py`` evaluation, ``trades_loss``): their ``sub_lipschitz()``
        after ``set_num_lc_iter(500)`` and, for the predicted class ``p``, the smallest
        ``(y_p − y_i) / (lc·‖ŵ_p − ŵ_i‖)``; certified when ``> eps``."""
        lc = source_lipschitz(model)
        with torch.no_grad():
            logits = model(images)
            preds = logits.argmax(1)
            wn = model.head.normalized_weight()
            gaps = logits.gather(1, preds[:, None]) - logits
            dist = torch.linalg.vector_norm(wn[preds][:, None, :] - wn[None, :, :], dim=2) * lc
            ratio = gaps / dist.where(dist > 0, torch.ones_like(dist))
            ratio[torch.arange(len(preds)), preds] = torch.inf
            radii = ratio.min(1).values.clamp_min(0)
        return SourceCertificates(predictions=preds, radii=radii, lipschitz=lc,
                                  label=f"the authors' sub_lipschitz: power-iteration estimates ({EVAL_LC_ITERS} "
                                        "steps) for the stem and residual blocks, float32 SVD for the neck and "
                                        "dense layers")


def source_lipschitz(model: Any, steps: int = EVAL_LC_ITERS) -> float:
    """The authors' ``GloroNet.sub_lipschitz()`` in evaluation, on the imported model: the
    stem's and each residual block's power-iteration estimate (the blocks from their imported
    ``init_x``), times the exact float32 spectral norms of the neck and dense matrices."""
    body = model.body
    value = body.stem_conv.power_estimate(steps)
    for module in body:
        if isinstance(module, ResidualConv):
            value *= module.lipschitz_estimate(iters=steps)
        elif isinstance(module, FreeConv) and module is not body.stem_conv:
            value *= float(torch.linalg.matrix_norm(module.weight.detach()[:, :, 0, 0], ord=2))
    return value
