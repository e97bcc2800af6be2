"""``lip bench``'s settings, each declared once (:func:`lipcli.host.settings.setting`): the
options of ``lip bench train``, ``certify`` and ``profile`` (spelling, default, help) and the
range checks of the benchmark functions (:func:`check_settings`) derive from these tables.
Torch-free (``lip bench --help`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from lipcli._util.constants import COMPILE_MODES, MAX_CLASSES
from lipcli.host.defaults import DEFAULT_COMPONENTS as _DC
from lipcli.host.settings import setting, settings_of
from lipcli.sdk.errors import SettingError, render_template

_B = "bench"
#: every registered LipConvnet depth (lipcli.builtins.lipconvnet.DEPTHS, spelled out: torch-free)
DEFAULT_ARCHS = "5,10,15,20,25,30,35,40"
#: the largest batch, step count and warm-up of a benchmark (memory and time grow with them)
MAX_BATCH, MAX_STEPS = 65_536, 100_000
_CUDNN_HELP = "CUDA: let cuDNN autotune convolution algorithms (warm-up steps absorb the tuning)."


@dataclass
class StepBenchOptions:
    """What the training-step benchmarks share (``lip bench train`` and ``profile``)."""

    batch_size: int = setting(128, "Images per training step.", owner=_B, min=1, max=MAX_BATCH)
    steps: int = setting(10, "Timed steps per model.", owner=_B, min=1, max=MAX_STEPS)
    warmup: int = setting(2, "Untimed warm-up steps per model.", owner=_B, min=0, max=MAX_STEPS)
    width: int = setting(32, "LipConvnet width (channels after the stem).", owner=_B, min=1)
    classes: int = setting(10, "Number of classes.", owner=_B, min=2, max=MAX_CLASSES)
    seed: int = setting(0, "Seed for weights and synthetic batches.", owner=_B, min=0)
    cudnn_benchmark: bool = setting(False, _CUDNN_HELP, owner=_B, negative=True)


@dataclass
class TrainBenchOptions(StepBenchOptions):
    """``lip bench train``."""

    archs: str = setting(DEFAULT_ARCHS, "Comma-separated LipConvnet depths or names (5,10 or "
                         "lipconvnet-5,...).", owner=_B)
    conv: str | None = setting(None, "Compare these convolutions instead of Table 1, e.g. soc-fast,soc,cayley "
                               "(any installed plugin's; inline parameters as name:key=value).", owner=_B)
    activation: str | None = setting(None, "Compare these activations, e.g. maxmin,householder (default: "
                                     f"{_DC['activation']}).", owner=_B)
    head: str = setting(_DC["head"], "Head component(s) (Table 1: lln); several compare them.", owner=_B)
    pool: str = setting(_DC["pool"], "Pool component(s) (Table 1: max); several compare them.", owner=_B)
    memory: bool = setting(True, "Measure peak memory.", owner=_B, negative=True)
    recipe_widths: str | None = setting(None, "With --recipe: NAME=WIDTH[,NAME=WIDTH] gives those recipes' "
                                        "networks their own width (e.g. equal parameter counts); the others and "
                                        "lipconvnet-5 take --width.", owner=_B)
    cuda_graphs: str = setting("auto", "auto (on for CUDA), on or off: replay both models' steps from CUDA "
                               "graphs.", owner=_B, choices=("auto", "on", "off"))
    floor: bool = setting(True, "CUDA: profile the convolution kernel time per step (the floor of a step).",
                          owner=_B, negative=True)
    compile: bool | None = setting(None, "Table 1: torch.compile both models' forward (in the warm-up steps; "
                                   "compile seconds reported apart).", owner=_B, negative=True)
    compile_mode: str = setting("default", "torch.compile mode with {compile}.", owner=_B, choices=COMPILE_MODES)


@dataclass
class ProfileBenchOptions(StepBenchOptions):
    """``lip bench profile``."""

    arch: str = setting("lipconvnet-20", "Architecture (e.g. 20 or lipconvnet-20).", owner=_B)
    conv: str = setting(_DC["conv"], "Convolution component.", owner=_B)
    head: str = setting(_DC["head"], "Head component.", owner=_B)
    pool: str = setting(_DC["pool"], "Pool component.", owner=_B)
    steps: int = setting(3, "Profiled steps.", owner=_B, min=1, max=MAX_STEPS)
    warmup: int = setting(1, "Unprofiled warm-up steps.", owner=_B, min=0, max=MAX_STEPS)
    target: float = setting(90.0, "Convolution share to check against (%).", owner=_B, min=0.0, max=100.0)


@dataclass
class CertifyBenchOptions:
    """``lip bench certify`` (the model options describe a random model, not a model file)."""

    arch: str = setting(_DC["arch"], "Architecture (e.g. 5 or lipconvnet-10).", owner=_B)
    head: str = setting(_DC["head"], "Head: lln (linear) or mlp (CRC-Lip).", owner=_B)
    conv: str = setting(_DC["conv"], "Convolution component.", owner=_B)
    pool: str = setting(_DC["pool"], "Pool component.", owner=_B)
    width: int = setting(32, "LipConvnet width.", owner=_B, min=1)
    classes: int = setting(10, "Number of classes (10 or 100 for CIFAR).", owner=_B, min=2, max=MAX_CLASSES)
    batch_size: int = setting(256, "Inputs per batch.", owner=_B, min=1, max=MAX_BATCH)
    n: int = setting(1024, "Number of synthetic inputs.", owner=_B, min=1, max=1_000_000)
    top_k: int | None = setting(None, "Also time the certificate restricted to the top-k classes (heuristic).",
                                owner=_B, min=1)
    fit_head: int = setting(0, "At most this many Adam steps fitting the head to a random teacher "
                            "(trained-like margins); 0 = random head.", owner=_B, min=0, max=MAX_STEPS)
    fit_loss: float = setting(0.7, "With {fit_head}: stop once the head's cross-entropy is this low.",
                              owner=_B, min=0.0)
    lipschitz_iters: int = setting(50, "Power-method iterations.", owner=_B, min=1, max=MAX_STEPS)
    refresh_steps: int = setting(50, "Power-iteration steps refreshing σ before evaluation.", owner=_B,
                                 min=0, max=1000)
    seed: int = setting(0, "Seed for weights and inputs.", owner=_B, min=0)
    cudnn_benchmark: bool = setting(False, "CUDA: let cuDNN autotune convolution algorithms (lip certify "
                                    "does not).", owner=_B, negative=True)
    path_rounds: int = setting(3, "Rounds of the interleaved series-vs-lowered feature pass comparison (one "
                               "batch each per round, FLOP per input by torch's flop counter); 0: none.",
                               owner=_B, min=0, max=1000)
    dense_max_mib: float | None = setting(None, "Cap of the eval lowering per layer, MiB of float32 (default: "
                                          "lip certify's); every layer that fits and is cheaper is lowered "
                                          "(the build's time is reported, not weighed).", owner=_B, min=0.0)
    compile: bool | None = setting(None, "Add the lowered feature pass compiled by torch.compile to the feature "
                                   "paths.", owner=_B, negative=True)
    compile_mode: str = setting("default", "torch.compile mode with {compile}.", owner=_B, choices=COMPILE_MODES)


@dataclass
class LayersBenchOptions:
    """``lip bench layers`` (the comparison study's network, a row per convolution)."""

    recipe: str = setting("layers-compared", "Recipe whose network (arch, head) the rows share: by default the "
                          "comparison study's (lipcli-compared); --arch and --head replace its values.", owner=_B)
    arch: str | None = setting(None, "Architecture (default: the recipe's; e.g. convnet-s for the study's "
                               "network at another size).", owner=_B)
    conv: str | None = setting(None, "Comma-separated convolutions (default: every installed one).", owner=_B)
    head: str | None = setting(None, "Head component (default: the recipe's).", owner=_B)
    width: int | None = setting(None, "Architecture width (default: the architecture's).", owner=_B, min=1)
    batch_size: int = setting(64, "Images per step.", owner=_B, min=1, max=MAX_BATCH)
    steps: int = setting(5, "Timed rounds.", owner=_B, min=1, max=10_000)
    warmup: int = setting(2, "Untimed rounds.", owner=_B, min=0, max=1000)
    seed: int = setting(0, "Seed for weights and inputs.", owner=_B, min=0)
    plot: str | None = setting(None, "Write a plot: training step time vs certified accuracy (with "
                               "{results}) or vs inference time.", owner=_B)
    results: str | None = setting(None, "JSON object conv -> certified accuracy for the plot (e.g. from "
                                  "docs/results.md's raw report).", owner=_B)


#: the model options of ``lip bench certify`` (meaningless for a model file)
CERTIFY_MODEL_OPTIONS = ("arch", "head", "conv", "pool", "width", "classes")


def check_settings(cls: type, **values: object) -> None:
    """A :class:`SettingError` naming the first of ``values`` outside its declared range in
    ``cls``'s table (a benchmark function's own check; unknown names are not checked)."""
    declared = {s.name: s for s in settings_of(cls)}
    for name, value in values.items():
        item = declared.get(name)
        problem = None if item is None else item.problem(value)
        if problem is not None:
            raise SettingError(name, render_template(problem, str))
