"""The layers of ``compare_authors.py``: for each method the authors' class (where it lives in
their checkout, how it is built) and the mapping of its parameters into lipcli's layer.

A *provider* is a function ``provider(method) -> class`` returning a class with the authors'
constructor and attribute names: :func:`import_authors` imports it unmodified from a checkout;
``tests/benchmarks/test_compare_authors.py`` passes stand-ins built on lipcli's own layers.

Each :class:`Method` builds the authors' layer (``authors``, parameters randomised with a seed),
lipcli's layer with the same parameters as a user runs it (``lipcli``, timed) and lipcli's
computation of the authors' map (``reference``, for the agreement).  The conventions:

* SOC (``soc-fast``): same filter and bias; the authors' power vectors ``_v1, _u1, _v2, _u2,
  _v3, _u3, _u4, _v4`` are lipcli's ``power_u0, power_v0, power_u1, power_v1, power_u2,
  power_v2, power_u3, power_v3`` (left, right vector of the reshapes (o,a)×(i,b),
  (o,b)×(i,a), o×(i,a,b), (o,a,b)×i).  The agreement runs without power steps
  (``update_iters=0`` / ``power_iters=0``: both take σ from the copied vectors), the timing
  with one (both defaults).
* BRO: lipcli's filter is the authors' flipped in both spatial axes (their spectrum is
  ``rfft2`` of the filter, lipcli's the conjugate phases; a per-frequency phase cancels in the
  reflector); ``rank`` = the authors' filter's second dimension (``mask_level=0.5``: half the
  channels for in = out).  The authors regularise ``V̂ᴴV̂`` by ``1e-5·mean diag``, lipcli does
  not: the agreement shows that ridge's effect.
* LOT: the same filter (both use the phases ``e^{2πi f(a−k//2)/n}``), 10 iterations, ``ε = 1e-4``.
  The authors' phase matrix is complex64 even for float64 filters, which limits the agreement
  to about ``1e-7``.
* SLL: the same filter and bias, ``log_q = 0`` (the authors' ``q`` multiplies and divides the
  same row, so it cancels).
* BRO and LOT in the authors' code zero-pad the input by ``k//2`` and convolve circularly on the
  padded torus; lipcli's layers are circular on the input's own torus.  The reference is lipcli's
  stride-1 layer on ``pad(pixel_unshuffle(x))``, cropped: the authors' map.  The timing runs each
  code as its users do.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: where each method's class lives in the authors' checkout: (folder, module, class)
AUTHORS_CODE = {
    "soc": ("", "skew_ortho_conv", "SOC"),
    "bro": ("lipconvnet/models/layers", "bro", "BRO"),
    "lot": ("", "lot_ortho_conv", "LOT"),
    "sll": ("core/models", "layers", "SDPBasedLipschitzConvLayer"),
    "soc-network": ("", "lip_convnets", "LipConvNet"),  # the paper's network (authors_networks.py)
}
REPOSITORIES = {
    "soc": "github.com/singlasahil14/improved_l2_robustness",
    "bro": "github.com/ntuaislab/BRONet",
    "lot": "github.com/AI-secure/Layerwise-Orthogonal-Training",
    "sll": "github.com/araujoalexandre/Lipschitz-SLL-Networks",
    "soc-network": "github.com/singlasahil14/improved_l2_robustness",
}
Provider = Callable[[str], type]


class Skip(Exception):
    """A method that cannot run here; its message is the line printed."""


@dataclass(frozen=True)
class Shape:
    cin: int
    cout: int
    size: int
    stride: int = 1
    kernel: int = 3

    @property
    def label(self) -> str:
        return f"{self.cin}→{self.cout} @{self.size}×{self.size} s{self.stride} k{self.kernel}"


def checkout_commit(path: Path) -> str:
    """The commit of a checkout: ``git rev-parse HEAD`` where ``path`` is a repository's top
    folder, else the 40 hex digits of a ``COMMIT`` file in it (an exported archive), else
    ``unknown`` (a folder inside another repository never reports that repository's commit)."""
    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True,
                                 timeout=30, check=False)
        except OSError:
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == Path(path).resolve():
        text = git("rev-parse", "HEAD")
        if len(text) == 40:
            return text
    marker = Path(path) / "COMMIT"
    text = marker.read_text().strip() if marker.is_file() else ""
    return text if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else "unknown"


@contextlib.contextmanager
def _soc_cpu_stand_ins():
    """The SOC checkout compiles a cuDNN extension at import (``cudnn_convolution.cpp``) and its
    ``utils.py`` imports apex: substitute torch's own weight gradient of a convolution for the
    extension and an empty ``apex`` module, for the import only (the authors' files unchanged)."""
    import torch.utils.cpp_extension as cpp

    ext = types.SimpleNamespace(convolution_backward_weight=lambda x, shape, g, stride, pad, dil,
                                groups, *flags: torch.nn.grad.conv2d_weight(x, shape, g, stride,
                                                                             pad, dil, groups))
    saved_load, had_apex = cpp.load, "apex" in sys.modules
    cpp.load = lambda *a, **k: ext
    if not had_apex and importlib.util.find_spec("apex") is None:
        sys.modules["apex"] = types.SimpleNamespace(amp=None)  # type: ignore[assignment]
    try:
        yield
    finally:
        cpp.load = saved_load
        if not had_apex:
            sys.modules.pop("apex", None)


def import_authors(checkout: dict[str, Path], shim_soc: bool = False) -> Provider:
    """A provider importing each method's class unmodified from ``checkout[method]`` (its folder
    put first on ``sys.path``; the modules it brings are taken out of ``sys.modules`` afterwards
    so two checkouts' ``utils`` do not collide).  ``soc-network`` comes from the ``soc``
    checkout.  Raises :class:`Skip` with the reason."""

    def provide(method: str) -> type:
        repo = method.split("-")[0]
        if repo not in checkout:
            raise Skip(f"{method}: no checkout given")
        sub, module, cls = AUTHORS_CODE[method]
        folder = (checkout[repo] / sub).resolve()
        if not (folder / f"{module}.py").is_file():
            raise Skip(f"{method}: {folder / (module + '.py')} not found")
        if repo == "soc" and not shim_soc and not torch.cuda.is_available():
            raise Skip("soc: the authors' skew_ortho_conv.py compiles a cuDNN (CUDA) "
                       "extension at import and its utils.py needs apex; --shim-soc substitutes "
                       "torch.nn.grad.conv2d_weight for the extension")
        before = set(sys.modules)
        sys.path.insert(0, str(folder))
        try:
            with _soc_cpu_stand_ins() if repo == "soc" and shim_soc else contextlib.nullcontext():
                mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a missing module, a failing compile: one line
            raise Skip(f"{method}: importing the authors' {module}.py failed: "
                       f"{type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(str(folder))
            for name in set(sys.modules) - before:
                origin = getattr(sys.modules[name], "__file__", None) or ""
                if origin.startswith(str(folder)):
                    del sys.modules[name]
        return getattr(mod, cls)

    return provide


# --------------------------------------------------------------------------------------
def _randomise(t: Tensor, gen: torch.Generator, scale: float, add: bool = False) -> None:
    noise = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t) * scale
    with torch.no_grad():
        t.copy_(t + noise if add else noise)


def _copy(dst: Tensor, src: Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src.detach().reshape(dst.shape))


def padded_reference(layer_eq: nn.Module, shape: Shape) -> Callable[[Tensor], Tensor]:
    """The authors' zero-pad → circular → crop map, run by lipcli's stride-1 layer ``layer_eq``."""
    p = shape.kernel // 2

    def run(x: Tensor) -> Tensor:
        if shape.stride == 2:
            x = F.pixel_unshuffle(x, 2)
        y = layer_eq(F.pad(x, (p,) * 4)) if p else layer_eq(x)
        return y[:, :, p:-p, p:-p] if p else y

    return run


class Method:
    """One method: ``authors(cls, shape)``, ``lipcli(a, shape)``, ``reference(a, shape)``."""

    name = ""
    lipcli_conv = ""
    network = True  # whether the method has stride-2 / channel-changing layers (a network row)

    def authors(self, cls: type, shape: Shape, gen: torch.Generator, agreement: bool) -> nn.Module:
        raise NotImplementedError

    def lipcli(self, a: nn.Module, shape: Shape) -> nn.Module:
        raise NotImplementedError

    def reference(self, a: nn.Module, shape: Shape) -> Callable[[Tensor], Tensor]:
        return self.lipcli(a, shape)

    def prepare_eval(self, a: nn.Module, shape: Shape) -> None:
        """What the authors' code runs before evaluating (their eval cache, if any)."""


class SOCMethod(Method):
    name, lipcli_conv = "soc", "soc-fast"
    #: authors' power-vector buffer -> lipcli's (see the module docstring)
    VECTORS = {"_v1": "power_u0", "_u1": "power_v0", "_v2": "power_u1", "_u2": "power_v1",
               "_v3": "power_u2", "_u3": "power_v2", "_u4": "power_u3", "_v4": "power_v3"}

    def authors(self, cls, shape, gen, agreement):
        a = cls(shape.cin, shape.cout, kernel_size=shape.kernel, stride=shape.stride,
                train_terms=6, eval_terms=15, update_iters=0 if agreement else 1, fast_train=True)
        _randomise(a.weight, gen, a.weight.shape[0] ** -0.5)
        a.update_sigma()  # the authors' 50 power steps at construction of a model
        return a

    def lipcli(self, a, shape):
        from lipcli.builtins.soc.layer import SOC

        lay = SOC(shape.cin, shape.cout, shape.kernel, shape.stride, train_terms=a.train_terms,
                  eval_terms=a.eval_terms, fast_grad=True, power_iters=a.update_iters)
        lay = lay.to(a.weight.dtype)
        _copy(lay.weight, a.weight)
        _copy(lay.bias, a.bias)
        for theirs, ours in self.VECTORS.items():
            _copy(getattr(lay, ours), getattr(a, theirs))
        lay.refresh(0)
        return lay


class PaddedMethod(Method):
    """A Fourier layer the authors run on the zero-padded input (BRO, LOT): ``_build(a, cin,
    stride)`` is lipcli's layer with the authors' parameters."""

    def _build(self, a: nn.Module, cin: int, stride: int) -> nn.Module:
        raise NotImplementedError

    def lipcli(self, a, shape):
        return self._build(a, shape.cin, shape.stride)

    def reference(self, a, shape):
        return padded_reference(self._build(a, shape.cin * shape.stride**2, 1), shape)


class BROMethod(PaddedMethod):
    name, lipcli_conv = "bro", "bro"

    def authors(self, cls, shape, gen, agreement):
        return cls(shape.cin, shape.cout, kernel_size=shape.kernel, input_size=shape.size,
                   stride=shape.stride, mask_level=0.5, id_init=False)

    def _build(self, a, cin, stride):
        from lipcli_bro.bro import BROConv

        lay = BROConv(cin, a.raw_out_channels, a.kernel_size[0], stride,
                      rank=a.weight.shape[1], init="random").to(a.weight.dtype)
        _copy(lay.weight, a.weight.flip(2, 3))
        _copy(lay.bias, a.bias)
        return lay


class LOTMethod(PaddedMethod):
    name, lipcli_conv = "lot", "lot"

    def authors(self, cls, shape, gen, agreement):
        a = cls(shape.cin, shape.cout, kernel_size=shape.kernel, stride=shape.stride,
                padding=shape.kernel // 2, bias=True)
        fan = a.weight[0].numel()
        _randomise(a.weight, gen, 0.5 * fan**-0.5, add=True)  # identity init plus noise
        _randomise(a.bias, gen, 0.1)
        return a

    def _build(self, a, cin, stride):
        from lipcli_lot.lot import LOTConv

        lay = LOTConv(cin, a.weight.shape[0], a.weight.shape[2], stride, iterations=a.iter_T,
                      eps=1e-4, init="random").to(a.weight.dtype)
        _copy(lay.weight, a.weight)
        _copy(lay.bias, a.bias)
        return lay

    def prepare_eval(self, a, shape):
        if hasattr(a, "frozen_w_ortho"):
            a.frozen_w_ortho(shape.size)


class SLLMethod(Method):
    name, lipcli_conv, network = "sll", "sll", False

    def authors(self, cls, shape, gen, agreement):
        if shape.stride != 1 or shape.cin != shape.cout or shape.kernel != 3:
            raise Skip("sll: the authors' layer is stride 1, in = out, kernel 3")
        return cls(shape.cin, shape.cin, kernel_size=3)

    def lipcli(self, a, shape):
        from lipcli_sll.conv import SLLConv

        hidden, c = a.kernel.shape[:2]
        lay = SLLConv(c, c, a.kernel.shape[-1], 1, inner_factor=hidden // c).to(a.kernel.dtype)
        _copy(lay.weight, a.kernel)
        _copy(lay.bias, a.bias)
        with torch.no_grad():
            lay.log_q.zero_()
        return lay


METHODS: dict[str, Method] = {m.name: m for m in (SOCMethod(), BROMethod(), LOTMethod(), SLLMethod())}
