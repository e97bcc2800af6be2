"""Importer ``bronet-lipconvnet``: LipConvNet checkpoints saved by the BRONet authors' code
(github.com/ntuaislab/BRONet, ``lipconvnet/trainer/trainer.py``: ``torch.save(model.state_dict(),
...)`` of ``models/lip_convnets.py::LipConvNet`` with ``--conv-layer bro`` or ``soc``) onto
``bronet-lipconvnet-<n>`` (:mod:`lipcli_bro.lipconvnet`) with the ``bro`` convolution in the
authors' form (``rank_rule=lipconvnet,border=zero,ridge=1e-5``) and the ``lln`` head.

Source layout (``b`` blocks per layer, width ``w``)::

    layer{i}.{j}.conv.weight (c, r, k, k), .bias (out,)   i = 1..5, j = 0..b-1  -> body.layer{i}_conv{j+1}
    last_layer.weight (K, D), .bias (K,)                   NormalizedLinear       -> head (lln)

The authors' ``BRO`` stores its low-rank filter as ``(max, min, k, k)`` (``c = max(in·s², out)``
rows) and transforms it with ``rfft2`` (a convolution), lipcli's ``kernel_spectrum`` is a
correlation: the filter is imported flipped in both spatial axes, which gives every frequency
the same block reflector.  The rank of the square layers is ``mask_mapping(c, --bro-rank)``:
``rank_ratio`` is read back from the shapes.  Their solve adds ``1e-5·mean(diag)`` (``ridge``).
Not in the checkpoint, so fixed as the authors' code fixes it: the MaxMin activation (their
default; HouseHolder activations have parameters and are refused), the input normalisation
(``utils/__init__.py``: the CIFAR-10 mean, std 0.2507, for every data set) and the image size
(32 for 10 and 100 classes, 64 for 200: Tiny ImageNet), told apart by ``D``.

Their SOC LipConvNet (``--conv-layer soc``; ``models/layers/soc.py``, the paper's SOC: a square
``(C, C, k, k)`` filter, a bias and the power vectors ``_u1 .. _v4`` that fix its ``σ``) maps onto
the same architecture with lipcli's ``soc-fast`` (15 terms in evaluation, as theirs), the filter
as it is (both are ``conv2d``) and the power vectors as ``power_u{r}``/``power_v{r}`` (as the
``improved-l2`` importer maps the paper's).  Their LOT LipConvNet (``--conv-layer lot``;
``models/layers/lot.py``, the LOT authors' layer line for line: an ``(out, in·s², k, k)`` filter
and a bias) maps onto the same architecture with lipcli-lot's ``lot:border=zero`` (zero pad
``k//2`` and crop, ``ε = 10⁻⁴``, 10 Newton–Schulz iterations; the ``lot`` importer's mapping), the
filter as it is; their 1×1 LOT last layer (no ``--lln``, 32×32 images) is lipcli-lot's ``lot``
head.  Dense layers (``--num-dense``) and the Cayley LipConvNet are refused naming the piece.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.importers import ImportPlan, ImportRefused, SourceCertificates

from lipcli.sdk.source_options import SourceOption

from .border import mask_mapping
from .lipconvnet import AUTHORS_MEAN, AUTHORS_STD, DEPTHS, layer_plan

SOURCE = "github.com/ntuaislab/BRONet"
DESCRIPTION = "the BRONet authors' LipConvNet with BRO, SOC or LOT layers (lipconvnet/), LLN or LOT head"
#: the authors' solve regularisation (``perturb_ratio`` in ``BRO.cal_wfft_ortho``)
AUTHORS_RIDGE = 1e-5
#: lipcli-lot's LOT layer in the authors' form (zero pad and crop; their eps and iterations are its defaults)
AUTHORS_LOT = "lot:border=zero"
#: ``--bro-rank`` values tried first when reading the rank back (the authors' mask levels)
_LEVELS = (0.125, 0.25, 0.5, 0.75, 1.0)
_DATASETS = {10: "cifar10", 100: "cifar100"}
_KEY = re.compile(r"layer([1-5])\.(\d{1,6})\.(\w+)\.(\w+)$")
#: the SOC layer's power vectors (their ``lipconvnet/models/layers/soc.py``, the paper's SOC):
#: shape from ``(C, k)``, and the pairs that are lipcli's ``power_u{r}``/``power_v{r}`` (rows,
#: columns of reshape ``r``; as the ``improved-l2`` importer maps the paper's)
SOC_BUFFERS = {"_u1": lambda C, k: (1, C, 1, k), "_v1": lambda C, k: (C, 1, k, 1),
               "_u2": lambda C, k: (1, C, k, 1), "_v2": lambda C, k: (C, 1, 1, k),
               "_u3": lambda C, k: (1, C, k, k), "_v3": lambda C, k: (C, 1, 1, 1),
               "_u4": lambda C, k: (C, 1, k, k), "_v4": lambda C, k: (1, C, 1, 1)}
SOC_POWER_PAIRS = (("_v1", "_u1"), ("_v2", "_u2"), ("_v3", "_u3"), ("_u4", "_v4"))


#: every option of their lipconvnet/main.py that changes the network, and how it is handled (each
#: leaves its mark in the keys or shapes: no configuration is needed)
OPTIONS = (
    SourceOption("conv_layer", "the convolution", "the keys/shapes: bro -> bro (authors' form), soc -> soc-fast, "
                 "lot -> lot:border=zero; cayley and standard refused by name"),
    SourceOption("bro_rank", "the BRO rank", "the shapes"),
    SourceOption("activation", "the activation", "the keys: maxmin -> maxmin; hh1/hh2 refused by name"),
    SourceOption("lln", "the head", "the keys/shapes: lln -> lln, their LOT last layer -> lot, else refused"),
    SourceOption("kernel", "the stride-2 layers' kernel in layers 1-4", "the shapes: odd 1..7 -> the arch's kernel; "
                 "others refused by name"),
    SourceOption("num_dense, dense_layer", "dense layers", "the keys: 0 mapped, dense layers refused by name"),
    SourceOption("block_size, init_channels, dataset", "the sizes", "the shapes"),
)


def _kernel(tensors: Mapping[str, Any], b: int) -> int:
    """Their ``--kernel``: the stride-2 layers' kernel in layers 1-4 (``layer{i}.{b-1}``), from the shape."""
    t = tensors.get(f"layer1.{b - 1}.conv.weight")
    k = int(t.shape[-1]) if t is not None and t.dim() == 4 else 3
    if k % 2 == 0 or not 1 <= k <= 7:
        raise ImportRefused(f"cannot import option kernel={k} (the stride-2 layers' {k}x{k} filters): "
                            "bronet-lipconvnet maps odd kernels 1..7")
    return k


def source_prefix(name: str) -> str:
    """The authors' module of lipcli's ``layer{i}_conv{j}``: ``layer{i}.{j-1}.conv``."""
    layer, j = name.split("_conv")
    return f"{layer}.{int(j) - 1}.conv"


def _refuse_unsupported(names: set[str]) -> None:
    parts = {m.group(3, 4) for n in names if (m := _KEY.match(n))}
    if any(part == "activation" for part, _ in parts):
        raise ImportRefused("cannot import the authors' HouseHolder activations ('hh1'/'hh2'): "
                            "bronet-lipconvnet maps MaxMin only")
    others = sorted({leaf for part, leaf in parts if part == "conv" and leaf not in ("weight", "bias", *SOC_BUFFERS)})
    if others:
        layer = "Cayley" if "alpha" in others else "LOT" if "lot" in " ".join(others).lower() else "non-BRO"
        raise ImportRefused(f"cannot import the authors' {layer} LipConvNet (conv.{others[0]}): "
                            "bronet-lipconvnet maps the BRO and SOC layers only")
    if any(n.startswith("dense_layers.") for n in names):
        raise ImportRefused("cannot import the authors' dense layers (--num-dense > 0): "
                            "bronet-lipconvnet has no lipcli piece for them")


def _blocks(names: set[str], arch: str | None) -> int:
    found = {int(m.group(2)) for n in names if (m := _KEY.match(n)) and m.group(1) == "1"}
    b = max(found) + 1 if found else 0
    if b > DEPTHS[-1] // 5:  # a key's block index, before anything is sized by it
        raise ImportRefused(f"the checkpoint names {b} blocks per layer, beyond the {DEPTHS[-1] // 5} of "
                            f"bronet-lipconvnet-{DEPTHS[-1]}")
    if arch is not None:
        m = re.fullmatch(r"bronet-lipconvnet-(\d{1,6})", arch.strip())
        if m is None or int(m.group(1)) not in DEPTHS:
            raise LipUsageError(f"--arch {arch!r}: bronet-lipconvnet takes bronet-lipconvnet-N, "
                                f"N in {DEPTHS[0]}..{DEPTHS[-1]} a multiple of 5")
        if b and int(m.group(1)) // 5 != b:
            raise ImportRefused(f"--arch {arch} has {int(m.group(1)) // 5} blocks per layer but the checkpoint has {b}")
        b = int(m.group(1)) // 5
    if not b:
        raise ImportRefused("no layer1.<j>.conv.weight: not a checkpoint of BRONet's lipconvnet/ LipConvNet")
    return b


def _shape(tensors: Mapping[str, Any], key: str, dims: int) -> tuple[int, ...]:
    t = tensors.get(key)
    if t is None or t.dim() != dims:
        raise ImportRefused(f"no {key} of {dims} dimensions: cannot read the LipConvNet's sizes")
    return tuple(int(s) for s in t.shape)


def _rank_ratio(tensors: Mapping[str, Any], b: int, w: int) -> float:
    """The ``--bro-rank`` that gives every square layer (``in·s² = out``) its stored rank."""
    square = [(c_out, f"{source_prefix(name)}.weight")
              for name, c_in, c_out, _k, s in layer_plan(b, w, kernel=3) if c_in * s * s == c_out]
    ranks = []
    for c, key in square:
        shape = tensors.get(key)
        ranks.append((c, int(shape.shape[1]) if shape is not None and shape.dim() == 4 else -1))
    if not ranks:
        return _LEVELS[0]  # one block per layer: every layer changes its channels
    c0, r0 = max(ranks)
    for level in (*_LEVELS, r0 / c0, (r0 + 0.5) / c0):
        if 0 < level <= 1 and all(mask_mapping(c, level) == r for c, r in ranks):
            return level
    raise ImportRefused(f"the square BRO layers' ranks {[r for _c, r in ranks]} (of {[c for c, _r in ranks]} "
                        "channels) follow no single --bro-rank: not the authors' LipConvNet")


def _is_lot(tensors: Mapping[str, Any], b: int) -> bool:
    """Their LOT layer is an ``nn.Conv2d`` (``weight``, ``bias``): its stride-2 ``C → 2C``
    filter is ``(2C, 4C, k, k)``, where BRO's is ``(4C, 2C, k, k)`` (rows ``max(in·s², out)``)."""
    t = tensors.get(f"{source_prefix(f'layer2_conv{b}')}.weight")
    return t is not None and t.dim() == 4 and t.shape[0] < t.shape[1]


def _last_layer(tensors: Mapping[str, Any], lot: bool) -> tuple[int, int, bool]:
    """``(K, D, lot_head)``: an ``NormalizedLinear`` ``(K, D)`` (``--lln``) or, in a LOT
    LipConvNet, their 1×1 LOT last layer ``(K, D, 1, 1)``."""
    t = tensors.get("last_layer.weight")
    if lot and t is not None and t.dim() == 4 and tuple(t.shape[2:]) == (1, 1):
        return int(t.shape[0]), int(t.shape[1]), True
    K, D = _shape(tensors, "last_layer.weight", 2)
    return K, D, False


class BRONetLipConvNetImporter:
    """The ``bronet-lipconvnet`` importer (see the module)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None) -> ImportPlan:
        names = set(tensors)
        _refuse_unsupported(names)
        b = _blocks(names, arch)
        kernel = _kernel(tensors, b)
        first = _shape(tensors, "layer1.0.conv.bias", 1)[0]
        w = first if b > 1 else first // 2
        lot = _is_lot(tensors, b)
        K, D, lot_head = _last_layer(tensors, lot)
        side = {32 * w: 32, 128 * w: 64}.get(D)
        if side is None or w < 1:
            raise ImportRefused(f"last_layer.weight has {D} features, not 32*{w} (32x32 images) or 128*{w} "
                                "(64x64): not the authors' LipConvNet with --num-dense 0")
        if lot_head and side != 32:
            raise ImportRefused(f"cannot import the authors' 1x1 LOT last layer on {side}x{side} images (their "
                                "forward gives 4 logits a class): lipcli-lot's lot head takes 32x32")
        soc = any(n.endswith(".conv._u1") for n in names)
        ratio = 0.0 if soc or lot else _rank_ratio(tensors, b, w)
        expected: dict[str, tuple[int, ...]] = {}
        sizes: dict[str, tuple[int, int]] = {}
        image = side
        for name, c_in, c_out, k, s in layer_plan(b, w, kernel=kernel):
            src = source_prefix(name)
            conv_in = c_in * s * s
            expected[f"{src}.bias"] = (c_out,)
            image //= s
            sizes[name] = (image + 2 * (k // 2),) * 2
            if soc:  # a square (C, C, k, k) filter and its power vectors
                C = max(conv_in, c_out)
                expected.update({f"{src}.weight": (C, C, k, k)}, **{f"{src}.{b_}": shape(C, k)
                                                                      for b_, shape in SOC_BUFFERS.items()})
                continue
            if lot:  # an (out, in*s^2, k, k) filter, as the lot importer maps the LOT authors'
                expected[f"{src}.weight"] = (c_out, conv_in, k, k)
                continue
            rank = min(conv_in, c_out) if conv_in != c_out else mask_mapping(c_out, ratio)
            if rank < 1:
                raise ImportRefused(f"cannot import {src}: the authors' rank rule gives it 0 columns (an identity "
                                    "layer); lipcli's bro has rank at least 1")
            expected[f"{src}.weight"] = (max(conv_in, c_out), rank, k, k)
        expected.update({"last_layer.weight": (K, D, 1, 1) if lot_head else (K, D), "last_layer.bias": (K,)})
        conv = ("soc-fast" if soc else AUTHORS_LOT if lot else
                f"bro:rank_ratio={ratio:g},rank_rule=lipconvnet,border=zero,ridge={AUTHORS_RIDGE:g}")
        model: dict[str, Any] = {
            "arch": f"bronet-lipconvnet-{5 * b}:width={w}" + (f",kernel={kernel}" if kernel != 3 else ""), "conv": conv, "activation": "maxmin",
            "pool": "max", "head": "lot" if lot_head else "lln", "num_classes": K, "in_channels": 3,
            "image_size": (side, side),
            "mean": AUTHORS_MEAN, "std": AUTHORS_STD,
        }
        layer = "SOC" if soc else "LOT" if lot else f"BRO (rank ratio {ratio:g})"
        return ImportPlan(model=model, expected=expected, ignored=(), dataset=_DATASETS.get(K) if side == 32 else None,
                          description=f"BRONet LipConvNet-{5 * b} (width {w}), {layer}, MaxMin, "
                                      f"{'LOT' if lot_head else 'LLN'} head, {K} classes",
                          source_state={"blocks": b, "width": w, "sizes": sizes, "soc": soc, "lot_head": lot_head,
                                        "kernel": kernel})

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]:
        out: dict[str, Any] = {"body.normalize.mean": torch.tensor(AUTHORS_MEAN),
                               "body.normalize.std": torch.tensor(AUTHORS_STD)}
        for name, *_ in layer_plan(plan.source_state["blocks"], plan.source_state["width"],
                                   kernel=plan.source_state.get("kernel", 3)):
            src = source_prefix(name)
            out[f"body.{name}.bias"] = tensors[f"{src}.bias"]
            if plan.source_state.get("soc"):  # conv2d on both sides; sigma from the imported vectors
                out[f"body.{name}.weight"] = tensors[f"{src}.weight"]
                for r, (rows, cols) in enumerate(SOC_POWER_PAIRS):
                    out[f"body.{name}.power_u{r}"] = tensors[f"{src}.{rows}"].flatten()
                    out[f"body.{name}.power_v{r}"] = tensors[f"{src}.{cols}"].flatten()
                continue
            weight = tensors[f"{src}.weight"]  # BRO's rfft2 is a convolution, lipcli's a correlation; LOT's not
            out[f"body.{name}.weight"] = weight if plan.model["conv"] == AUTHORS_LOT else weight.flip(-1, -2)
            out[f"body.{name}.spatial_size"] = torch.tensor(plan.source_state["sizes"][name], dtype=torch.int64)
        out["head.weight"] = tensors["last_layer.weight"].flatten(1)  # the LOT head's (K, D, 1, 1) too
        out["head.bias"] = tensors["last_layer.bias"]
        return {k: v.contiguous() for k, v in out.items()}

    def source_certificates(self, model: Any, images: torch.Tensor) -> SourceCertificates:
        """The source's rule (``utils/eval.py``, ``evaluate_certificates`` with
        ``lln_certificates``): ``L = 1/max(std)`` times 1 for every BRO layer, and the smallest
        ``(f_y − f_j)/(‖ŵ_y − ŵ_j‖·L)`` over every other class ``j``; with their LOT last layer
        ``(f_y − max_{j≠y} f_j)/(√2·L)`` (``ortho_certificates``); certified when ``> eps``."""
        lipschitz = 1.0 / max(AUTHORS_STD)
        with torch.no_grad():
            logits = model(images)
            preds = logits.argmax(1)
            own = torch.nn.functional.one_hot(preds, logits.shape[1]).to(logits.dtype)
            if type(model.head).__name__ != "LOTHead":  # lln_certificates (lipcli-lot's head named, not imported)
                rows = model.head.normalized_weight()
                spread = (rows[preds].unsqueeze(1) - rows.unsqueeze(0)).norm(dim=2) + own  # 1 on the own class
            else:  # their LOT last layer: ortho_certificates
                spread = torch.full_like(logits, 2.0 ** 0.5)
            top = logits.gather(1, preds[:, None])
            radii = ((top - (logits - own * 1e6)) / (spread * lipschitz)).min(dim=1).values
        return SourceCertificates(predictions=preds, radii=radii, lipschitz=lipschitz,
                                  label="the source's L = 1/max(std): every BRO, SOC or LOT layer taken as "
                                        "exactly 1-Lipschitz")
