"""Importer ``improved-l2``: LipConvNet checkpoints saved by the paper's code
(github.com/singlasahil14/improved_l2_robustness, ``train_robust.py``:
``torch.save(model.state_dict(), ...)``).

Source layout (``lip_convnets.LipConvNet``; block size ``b = depth/5``, stem width ``w``)::

    shift, scale                       (3, 1, 1) input mean and std
    init_layer.ortho.*                 SOC 3 -> w, k3              -> body.stem_conv
    block{1..4}.{0..b-2}.ortho.*       SOC C -> C, k3              -> body.block{n}_conv{j+1}
    block{1..4}.{b-1}.ortho.*          SOC C -> 4C, k3, stride 2   -> body.block{n}_down
    block5.0.ortho.*                   SOC 16w -> 64w, k1, stride 2 -> body.block5_down
    block5.{1..b-1}.ortho.*            SOC 64w -> 64w, k1          -> body.block5_conv{j}
    logits_layer.weight, .bias         LLN head                    -> head.weight, head.bias
    logits_layer.linear{1,2}.*         CRC head (``crc_full``)      -> head.fc1, head.fc2

An SOC layer holds ``weight``, ``bias`` and the power vectors ``_u1 .. _v4`` of the four
reshapes of its skew filter; they define the layer's ``σ`` (the smallest of the four
quotients), so they are imported as lipcli's ``power_u{r}``/``power_v{r}`` (``_v1/_u1``,
``_v2/_u2``, ``_v3/_u3``, ``_u4/_v4``); the CRC head's ``_u``/``_v`` are estimator state.  MaxMin and the pairwise max pool are
lipcli's ``maxmin`` and ``max``; the source's projection pooling (``--pooling lip1``,
``LipPool``: the signed distance of each channel pair to the cone of angle
``clamp(θ, 0, π)``) is lipcli's ``projection`` pool, ``θ`` as it is (``blockN.{b-1}.act.theta``
-> ``body.blockN_pool.theta``).  The source's orthogonal last layer (``--last-layer ortho``
with SOC: a 1×1 SOC layer from the ``D`` features, its first ``K`` outputs) is the
``ortho`` head of lipcli-ortho-head (installed): its ``K × D`` matrix is the source's
evaluation series (15 terms of ``exp(S/σ)``, ``σ`` from the stored power vectors; float64)
cut to ``K`` rows, which lipcli's head re-orthonormalises (a change of ~1e-7: their series is
orthogonal to rounding) and bounds with a guaranteed spectral bound (:func:`_ortho_head`).
Their HouseHolder activations and their Cayley/BCOP orthogonal last layers are refused
naming the piece.

Every option of ``train_robust.py`` that changes the network (:data:`OPTIONS`) leaves its mark
in the keys or shapes; a stated configuration (``--config``, ``--option``) must agree with them.

The source's Cayley LipConvNet (``conv_name='cayley'``: ``weight``, ``bias`` and the scale
``alpha`` per layer) maps onto the same architecture with the ``cayley`` convolution of the
lipcli-cayley plugin (the model needs it installed): the stride-2 layers' ``k//2`` filters
(after their space-to-depth) are centred in lipcli's ``k × k`` and ``alpha`` is rescaled from
the source's spectral Frobenius norm to lipcli's filter norm (:func:`_cayley_state`).

The source's BCOP LipConvNet (``conv_name='bcop'``: ``conv_matrices`` ``(2k−1, c, c)``, their
half-rank ``mask`` and ``bias`` per layer, ``c = max(in·s², out)``) maps onto lipcli-bcop's
``bcop:taps=authors`` (the plugin installed): their filter is ``H·Π_t(P_t + (I−P_t)z_x)(Q_t +
(I−Q_t)z_y)`` with ``H``, ``P_t``, ``Q_t`` from the orthogonal polar factors of
``conv_matrices[0]``, ``[1+2t]``, ``[2+2t]`` (``P = VVᵀ``, ``V`` the first ``c//2`` columns),
each tap transposed when ``in·s² ≤ out`` — lipcli-bcop's form with ``ortho = O₀`` (``O₀ᵀ`` when
``in·s² > out``) and ``proj_x``/``proj_y`` the ``V`` (:func:`_bcop_state`; orthonormal columns,
which Björck leaves as they are).  Their Björck iteration (20 steps from a power-iteration
scale) is taken as converged: lipcli's eval iterates to convergence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from lipcli.sdk.errors import LipUsageError
from lipcli.sdk.importers import ImportPlan, ImportRefused, SourceCertificates
from lipcli.sdk.source_options import SourceOption, SourceOptions

from .network import DEPTHS

SOURCE = "github.com/singlasahil14/improved_l2_robustness"
_SOC_KEYS = ("weight", "bias", "_u1", "_v1", "_u2", "_v2", "_u3", "_v3", "_u4", "_v4")
#: the source's power vectors of lipcli's reshape r (rows, columns): the source's ``_u4`` is
#: indexed (out, tap, tap) and ``_v4`` by the input channel; the other pairs the other way
_POWER_VECTORS = (("_v1", "_u1"), ("_v2", "_u2"), ("_v3", "_u3"), ("_u4", "_v4"))
#: every option of train_robust.py that changes the network, and how it is handled (all told by the keys)
OPTIONS = (
    SourceOption("conv_layer", "the orthogonal convolution", "the keys: soc -> soc-fast, cayley -> cayley, "
                 "bcop -> bcop:taps=authors"),
    SourceOption("activation", "the activation", "the keys: maxmin -> maxmin; hh1/hh2 (theta) refused by name"),
    SourceOption("pooling", "the channel-halving pool", "the keys: max -> max, lip1 (theta) -> projection"),
    SourceOption("last_layer", "the head", "the keys: lln -> lln, crc_full -> mlp, ortho (SOC) -> ortho; "
                 "Cayley/BCOP ortho and crc_ortho refused by name"),
    SourceOption("num_layers, init_channels, num_hidden, dataset", "the sizes", "the shapes"),
    SourceOption("fast_train", "the SOC backward pass only (not the function)", "not needed"),
)
#: stated train_robust.py arguments that must agree with the keys: option -> plan key
_TOLD = {"conv_layer": "conv_layer", "activation": "activation", "pooling": "pooling",
         "last_layer": "last_layer", "num_layers": "num_layers", "init_channels": "init_channels"}
_SOC_TERMS = 15  # SOC(eval_terms=15): the evaluation series of their orthogonal last layer
_NUM_OTHER = 9  # the source's --num-other: classes its certificate compares with
_DATASETS = {10: "cifar10", 100: "cifar100"}
#: the most layers per block: lipcli's deepest registered LipConvNet
MAX_BLOCKS = DEPTHS[-1] // 5


def _soc_shapes(c_in: int, c_out: int, k: int, stride: int) -> dict[str, tuple[int, ...]]:
    C = max(c_out, c_in * stride * stride)
    return {"weight": (C, C, k, k), "bias": (c_out,), "_u1": (1, C, 1, k), "_v1": (C, 1, k, 1),
            "_u2": (1, C, k, 1), "_v2": (C, 1, 1, k), "_u3": (1, C, k, k), "_v3": (C, 1, 1, 1),
            "_u4": (C, 1, k, k), "_v4": (1, C, 1, 1)}


def _bcop_shapes(c_in: int, c_out: int, k: int, stride: int) -> dict[str, tuple[int, ...]]:
    c = max(c_out, c_in * stride * stride)
    return {"conv_matrices": (2 * k - 1, c, c), "mask": (2 * k - 2, 1, c), "bias": (c_out,)}


def _polar(m: torch.Tensor) -> torch.Tensor:
    """The orthogonal polar factor ``UVᵀ`` of each square matrix, in float64."""
    u, _s, vh = torch.linalg.svd(m.double())
    return u @ vh


def _bcop_state(tensors: Mapping[str, Any], src: str, c_in: int, c_out: int) -> dict[str, torch.Tensor]:
    """lipcli-bcop's ``ortho``, ``proj_x``, ``proj_y`` (``taps=authors``) for the source's layer."""
    ortho = _polar(tensors[f"{src}.conv_matrices"])
    c = ortho.shape[-1]
    r = max(1, c // 2)
    dtype = tensors[f"{src}.conv_matrices"].dtype
    head = ortho[0] if c_in <= c_out else ortho[0].T
    return {"ortho": head.to(dtype), "proj_x": ortho[1::2, :, :r].to(dtype), "proj_y": ortho[2::2, :, :r].to(dtype)}


def _check_bcop_masks(tensors: Mapping[str, Any], layers: list[tuple[str, str, int, int, int, int]]) -> None:
    """Their ``mask`` keeps the first ``c//2`` columns (rank ``c/2`` projectors), as lipcli-bcop."""
    for src, _dst, c_in, c_out, k, s in layers:
        shape = _bcop_shapes(c_in, c_out, k, s)["mask"]
        t = tensors.get(f"{src}.mask")
        if t is None or tuple(t.shape) != shape or not bool(torch.isfinite(t).all()):
            continue  # the host refuses it with the shape check
        want = torch.zeros(shape, dtype=t.dtype)
        want[..., : shape[-1] // 2] = 1
        if not torch.equal(t, want):
            raise ImportRefused(f"cannot import {src}.mask: not the authors' half-rank mask (ones in the first "
                                f"{shape[-1] // 2} of {shape[-1]} columns), the projector rank lipcli-bcop has")


def _layers(b: int, w: int) -> list[tuple[str, str, int, int, int, int]]:
    """``(source prefix, lipcli prefix, c_in, c_out, kernel, stride)`` of every SOC layer."""
    out = [("init_layer.ortho", "body.stem_conv", 3, w, 3, 1)]
    c = w
    for n in range(1, 5):
        for j in range(b - 1):
            out.append((f"block{n}.{j}.ortho", f"body.block{n}_conv{j + 1}", c, c, 3, 1))
        out.append((f"block{n}.{b - 1}.ortho", f"body.block{n}_down", c, 4 * c, 3, 2))
        c *= 2
    out.append(("block5.0.ortho", "body.block5_down", c, 4 * c, 1, 2))
    for j in range(1, b):
        out.append((f"block5.{j}.ortho", f"body.block5_conv{j}", 4 * c, 4 * c, 1, 1))
    return out


def _cayley_shapes(c_in: int, c_out: int, k: int, stride: int) -> dict[str, tuple[int, ...]]:
    """The source's ``Cayley`` layer: a stride-2 layer is a ``k//2 × k//2`` (at least 1×1)
    convolution from ``4·in`` channels after its space-to-depth (``StridedConv``)."""
    kk = max(1, k // 2) if stride == 2 else k
    return {"weight": (c_out, c_in * stride * stride, kk, kk), "bias": (c_out,), "alpha": ()}


def _cayley_state(tensors: Mapping[str, Any], src: str, k: int, size: int) -> dict[str, torch.Tensor]:
    """lipcli-cayley's ``weight``, ``alpha`` and ``spatial_size`` for the source's layer on
    ``size × size`` (rearranged) images.  The source's filter is centred in lipcli's ``k × k``
    (a centred tap has phase 1: the same spectrum; its ``conj(rfft2)`` times the shift is
    lipcli's centred correlation).  The source scales by ``α/‖Ŵ‖_F`` over the spectrum's half
    plane at that size, lipcli by ``α'/‖W‖_F``: ``α' = α·‖W‖_F/‖Ŵ‖_F`` (float64, then float32)."""
    src_w = tensors[f"{src}.weight"]
    weight = src_w.new_zeros(src_w.shape[0], src_w.shape[1], k, k)
    lo = (k - src_w.shape[-1]) // 2
    weight[:, :, lo:lo + src_w.shape[-1], lo:lo + src_w.shape[-1]] = src_w
    w64 = src_w.double()
    spectrum = torch.fft.rfft2(w64, (size, size)).abs().square().sum().sqrt()
    alpha = tensors[f"{src}.alpha"].double() * w64.square().sum().sqrt() / spectrum
    return {"weight": weight, "alpha": alpha.to(src_w.dtype),
            "spatial_size": torch.tensor((size, size), dtype=torch.int64)}


def _is_pool_theta(name: str, t: Any) -> bool:
    """LipPool's angles: one-dimensional ``blockN.j.act.theta`` (HouseHolder's are 4-D)."""
    return name.endswith(".act.theta") and t.dim() == 1 and not name.startswith("init_layer")


def _refuse_unsupported(tensors: Mapping[str, Any]) -> None:
    names = set(tensors)
    thetas = [n for n in names if re.search(r"\.act\.theta\d?$", n) and not _is_pool_theta(n, tensors[n])]
    if thetas:  # HouseHolder's theta is (1, C/2, 1, 1) or per group
        raise ImportRefused("cannot import the source's HouseHolder activations (--activation hh1/hh2): "
                            "improved-l2 maps no lipcli component to them yet")
    if any(n.startswith("logits_layer.ortho.") for n in names) and not all(
            f"logits_layer.ortho.{k}" in names for k in _SOC_KEYS):
        raise ImportRefused("cannot import the source's Cayley or BCOP orthogonal last layer (--last-layer ortho "
                            "with --conv-layer cayley/bcop): improved-l2 maps the SOC one only")
    if any(n.startswith("features_layer.") for n in names):
        raise ImportRefused("cannot import the source's 'crc_ortho' features layer: no lipcli equivalent yet")


def _block_size(names: set[str], arch: str | None) -> int:
    found = {int(m.group(1)) for n in names if (m := re.match(r"block1\.(\d{1,6})\.", n))}
    b = max(found) + 1 if found else 0
    if b > MAX_BLOCKS:  # a key's layer index, before anything is sized by it
        raise ImportRefused(f"the checkpoint names block1.{b - 1}: {b} layers per block, beyond the "
                            f"{MAX_BLOCKS} of lipcli's deepest LipConvNet (lipconvnet-{DEPTHS[-1]})")
    if arch is not None:
        m = re.fullmatch(r"(?:lipconvnet|LipConvNet)-?(\d{1,6})", arch.strip())
        if m is None or int(m.group(1)) not in DEPTHS:
            raise LipUsageError(f"--arch {arch!r}: improved-l2 takes lipconvnet-N, N a multiple of 5 "
                                f"from {DEPTHS[0]} to {DEPTHS[-1]}")
        if b and int(m.group(1)) // 5 != b:
            raise ImportRefused(f"--arch {arch} has {int(m.group(1)) // 5} layers per block but the "
                                f"checkpoint has {b}")
        b = int(m.group(1)) // 5
    if not b:
        raise ImportRefused("no LipConvNet blocks (block1.*): not a checkpoint of improved_l2_robustness")
    return b


def _pool_layers(b: int, w: int, last: bool) -> dict[str, tuple[str, int]]:
    """The source's LipPool keys -> (lipcli pool module, channels in): the stride-2 layer of
    blocks 1-4 (``4C`` channels) and, unless the head is ``crc_full``, block 5's last layer."""
    out, c = {}, w
    for n in range(1, 5):
        out[f"block{n}.{b - 1}.act.theta"] = (f"block{n}_pool", 4 * c)
        c *= 2
    if last:
        out[f"block5.{b - 1}.act.theta"] = ("block5_pool", 4 * c)
    return out


def _ortho_head(tensors: Mapping[str, Any], k: int) -> torch.Tensor:
    """The ``K × D`` matrix of the source's SOC 1×1 last layer in evaluation: ``S = (W − Wᵀ)/2``
    over ``σ = min_r Σ S·u_r·v_r`` (the stored vectors), the series ``Σ_{j<15} S^j/j!`` by
    Horner (their ``conv_exp``/``SOC_Function``), its first ``K`` rows; float64, then the
    checkpoint's dtype."""
    p = "logits_layer.ortho."
    w = tensors[p + "weight"].double()
    skew4 = 0.5 * (w - w.transpose(0, 1))
    sigma = min(float((skew4 * tensors[p + f"_u{r}"].double() * tensors[p + f"_v{r}"].double()).sum())
                for r in range(1, 5))
    if not sigma > 0:
        raise ImportRefused("cannot import logits_layer.ortho: its power vectors give sigma <= 0")
    skew = skew4[:, :, 0, 0] / sigma
    eye = torch.eye(skew.shape[0], dtype=torch.float64)
    m = eye.clone()
    for i in range(_SOC_TERMS - 1, 0, -1):
        m = eye + skew @ m / i
    return m[:k].to(tensors[p + "weight"].dtype)


def _values(tensors: Mapping[str, Any], key: str, shape: tuple[int, ...]) -> list[float] | None:
    t = tensors.get(key)
    if t is None or tuple(t.shape) != shape or not bool(torch.isfinite(t).all()):
        return None  # the host refuses it with the shape check
    return [float(v) for v in t.flatten().tolist()]


class ImprovedL2Importer:
    """The ``improved-l2`` importer (see the module)."""

    def plan(self, tensors: Mapping[str, Any], arch: str | None,
             options: SourceOptions | None = None) -> ImportPlan:
        names = set(tensors)
        _refuse_unsupported(tensors)
        b = _block_size(names, arch)
        bias = tensors.get("init_layer.ortho.bias")
        if bias is None or bias.dim() != 1:
            raise ImportRefused("no init_layer.ortho.bias of one dimension: cannot read the stem width")
        w = int(bias.shape[0])
        feat_pool, feat_act = 32 * w, 64 * w
        expected: dict[str, tuple[int, ...]] = {"shift": (3, 1, 1), "scale": (3, 1, 1)}
        cayley = "init_layer.ortho.alpha" in names
        bcop = "init_layer.ortho.conv_matrices" in names
        if bcop:
            _check_bcop_masks(tensors, _layers(b, w))
        for src, _dst, c_in, c_out, k, s in _layers(b, w):
            shapes = (_cayley_shapes if cayley else _bcop_shapes if bcop else _soc_shapes)(c_in, c_out, k, s)
            expected.update({f"{src}.{key}": shape for key, shape in shapes.items()})
        ignored: list[str] = []
        pool_thetas = {n for n in names if _is_pool_theta(n, tensors[n])}
        pools = _pool_layers(b, w, last="logits_layer.linear1.weight" not in names)
        if pool_thetas:
            if pool_thetas != set(pools):
                raise ImportRefused(f"LipPool angles at {sorted(pool_thetas)[:3]}, not at every pooling layer "
                                    f"({', '.join(sorted(pools))}): not the source's --pooling lip1 network")
            expected.update({key: (c // 2,) for key, (_dst, c) in pools.items()})
        pool = "projection" if pool_thetas else "max"
        if "logits_layer.ortho.weight" in names:
            bias = tensors.get("logits_layer.ortho.bias")
            k = int(bias.shape[0]) if bias is not None and bias.dim() == 1 else 10
            expected.update({f"logits_layer.ortho.{key}": shape
                             for key, shape in _soc_shapes(feat_pool, k, 1, 1).items()})
            head, what = "ortho", "orthogonal (SOC) last layer"
        elif "logits_layer.linear1.weight" in names:
            lw = tensors["logits_layer.linear1.weight"]
            hidden = int(lw.shape[0]) if lw.dim() == 2 else 1
            classes = tensors.get("logits_layer.linear2.bias")
            k = int(classes.shape[0]) if classes is not None and classes.dim() == 1 else 10
            expected.update({"logits_layer.linear1.weight": (hidden, feat_act),
                             "logits_layer.linear1.bias": (hidden,),
                             "logits_layer.linear2.weight": (k, hidden),
                             "logits_layer.linear2.bias": (k,)})
            ignored = ["logits_layer._u", "logits_layer._v"]
            head, what = f"mlp:hidden={hidden}", "CRC-Lip head"
        else:
            classes = tensors.get("logits_layer.bias")
            k = int(classes.shape[0]) if classes is not None and classes.dim() == 1 else 10
            expected.update({"logits_layer.weight": (k, feat_pool), "logits_layer.bias": (k,)})
            head, what = "lln", "LLN head"
        conv_layer = "cayley" if cayley else "bcop" if bcop else "soc"
        told = {"conv_layer": conv_layer, "activation": "maxmin", "pooling": "lip1" if pool_thetas else "max",
                "last_layer": "ortho" if head == "ortho" else "lln" if head == "lln" else "crc_full",
                "num_layers": 5 * b, "init_channels": w}
        if options is not None:
            for name, value in told.items():
                options.require(name, told=value)
        model: dict[str, Any] = {
            "arch": f"lipconvnet-{5 * b}:width={w}",
            "conv": "cayley" if cayley else "bcop:taps=authors" if bcop else "soc-fast", "activation": "maxmin",
            "pool": pool, "head": head, "num_classes": k, "in_channels": 3, "image_size": (32, 32),
        }
        mean, std = _values(tensors, "shift", (3, 1, 1)), _values(tensors, "scale", (3, 1, 1))
        if std is not None and not min(std) > 0:
            raise ImportRefused(f"cannot import scale (the input std) {std}: every entry must be positive")
        if mean is not None and std is not None:
            model.update(mean=tuple(mean), std=tuple(std))
        return ImportPlan(model=model, expected=expected, ignored=tuple(ignored), dataset=_DATASETS.get(k),
                          description=f"LipConvNet-{5 * b} (width {w}), "
                                      f"{'Cayley' if cayley else 'BCOP' if bcop else 'SOC'}, MaxMin, "
                                      f"{'projection (lip1)' if pool_thetas else 'max'} pooling, {what}, {k} classes",
                          source_state={"blocks": b, "width": w, "cayley": cayley, "bcop": bcop,
                                        "pools": {key: dst for key, (dst, _c) in pools.items()} if pool_thetas else {}},
                          options=told)

    def convert(self, tensors: Mapping[str, Any], plan: ImportPlan) -> dict[str, Any]:
        b, w = plan.source_state["blocks"], plan.source_state["width"]
        out: dict[str, Any] = {"body.normalize.mean": tensors["shift"].flatten(),
                               "body.normalize.std": tensors["scale"].flatten()}
        image = 32
        for src, dst, c_in, c_out, k, s in _layers(b, w):
            out[f"{dst}.bias"] = tensors[f"{src}.bias"]
            image //= s
            if plan.source_state.get("bcop"):
                out.update({f"{dst}.{key}": v for key, v in _bcop_state(tensors, src, c_in, c_out).items()})
                continue
            if plan.source_state.get("cayley"):
                out.update({f"{dst}.{key}": v for key, v in _cayley_state(tensors, src, k, image).items()})
                continue
            out[f"{dst}.weight"] = tensors[f"{src}.weight"]
            for key in _SOC_KEYS[2:]:  # the power vectors fix the layer's scale: zero is no vector
                if not bool(tensors[f"{src}.{key}"].abs().max() > 0):
                    raise ImportRefused(f"cannot import {src}.{key}: an all-zero power vector (the "
                                        "layer's scale would be 0/0)")
            for r, (rows, cols) in enumerate(_POWER_VECTORS):
                out[f"{dst}.power_u{r}"] = tensors[f"{src}.{rows}"].flatten()
                out[f"{dst}.power_v{r}"] = tensors[f"{src}.{cols}"].flatten()
        for key, dst in plan.source_state.get("pools", {}).items():
            out[f"body.{dst}.theta"] = tensors[key]
        if "logits_layer.ortho.weight" in tensors:
            out["head.weight"] = _ortho_head(tensors, int(tensors["logits_layer.ortho.bias"].shape[0]))
            out["head.bias"] = tensors["logits_layer.ortho.bias"]
        elif "logits_layer.linear1.weight" in tensors:
            for i in (1, 2):
                out[f"head.fc{i}.weight"] = tensors[f"logits_layer.linear{i}.weight"]
                out[f"head.fc{i}.bias"] = tensors[f"logits_layer.linear{i}.bias"]
        else:
            out["head.weight"] = tensors["logits_layer.weight"]
            out["head.bias"] = tensors["logits_layer.bias"]
        return {k: v.contiguous() for k, v in out.items()}

    def source_certificates(self, model: Any, images: torch.Tensor) -> SourceCertificates | None:
        """The source's rule: the product of per-layer power-iteration estimates (50 steps, as
        ``lipschitz_constant(exact=True)``; its Cayley and BCOP layers have no ``norm()``:
        ``1/min(scale)`` alone) and the head's certificate divided by it, the smallest over the
        top-9 other classes; certified when ``> r``.  LLN head (``utils.evaluate_certificates``):
        ``(f_y - f_j) / ||ŵ_y - ŵ_j||``.  CRC head (``evaluate_certificates_precise``, what
        ``test_robust.py`` runs for ``crc_full``): :func:`~.source_crc.paper_crc_certificates`,
        its estimated curvature and unconverged pairs at 0 included."""
        from lipcli.builtins.lipconvnet.source_crc import paper_crc_certificates
        from lipcli.lipschitz.report import lipschitz_report

        crc = hasattr(model.head, "fc1") and hasattr(model.head, "fc2")
        if not crc and not hasattr(model.head, "normalized_weight"):
            return None
        conv = getattr(model, "lipcli_config", {}).get("conv", {})
        if isinstance(conv, dict) and conv.get("name") in ("cayley", "bcop"):  # no norm() on them: 1 each
            estimate = 1.0 / float(model.body.normalize.std.min())
        else:
            estimate = float(lipschitz_report(model, estimate=True, iters=50).estimate)
        label = "power-iteration estimate (the source's lipschitz_constant(exact=True))"
        with torch.no_grad():
            features = model.features(images)
            logits = model.head(features)
            preds = logits.argmax(1)
            if crc:
                certs = paper_crc_certificates(model.head, features, preds)
                radii = certs.min(1).values.double().clamp_min(0) / estimate
                return SourceCertificates(predictions=preds, radii=radii, lipschitz=estimate,
                                          label=label + "; CRC with a power-iteration curvature estimate")
            other = logits.clone()
            other[torch.arange(len(preds)), preds] = -torch.inf
            top = other.topk(min(_NUM_OTHER, logits.shape[1] - 1), dim=1).indices
            wn = model.head.normalized_weight()
            diff = logits.gather(1, preds[:, None]) - logits.gather(1, top)
            dist = torch.sqrt(2 * (1 - wn @ wn.T))[preds[:, None], top]
            radii = (diff / dist).min(1).values.clamp_min(0) / estimate
        return SourceCertificates(predictions=preds, radii=radii, lipschitz=estimate, label=label)
