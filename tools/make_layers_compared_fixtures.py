"""Fixtures for the ``cpl`` and ``sandwich`` plugins, made by running the comparison study's
own layer code unmodified (``berndprach/1LipschitzLayersCompared``, the commit below):
``models/layers/lipschitz/cpl.py`` (``CPLConv2d``) and ``models/layers/lipschitz/sandwich.py``
(``SandwichConv``, ``SandwichFc``), each file imported by path (the package ``__init__`` pulls
in every other layer and its dependencies).

Usage: ``python tools/make_layers_compared_fixtures.py /tmp/authors/1LipschitzLayersCompared``
(a checkout of that commit).  Writes, per case, ``<case>.safetensors`` (the layer's state after
one training-mode forward pass, its inputs and outputs) and ``<case>.json`` (sizes, the commit)
into ``plugins/lipcli-cpl/tests/data`` and ``plugins/lipcli-sandwich/tests/data``.  Tiny sizes
(4 to 8 channels, 6x6 or 8x8 images): a few KB each.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

COMMIT = "01e3f2ad1f48ad749b2e91452c1d5869d3a6159a"
ROOT = Path(__file__).resolve().parents[1]


def load(repo: Path, rel: str, name: str):
    spec = importlib.util.spec_from_file_location(name, repo / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(folder: Path, case: str, tensors: dict, meta: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / f"{case}.safetensors"))
    (folder / f"{case}.json").write_text(json.dumps({**meta, "commit": COMMIT}, indent=1) + "\n")


def cpl_case(cpl, case: str, c: int, k: int, n: int, seed: int) -> None:
    torch.manual_seed(seed)
    layer = cpl.CPLConv2d(c, c, k)
    x_train = torch.randn(3, c, n, n)
    x_eval = torch.randn(3, c, n, n)
    state = torch.random.get_rng_state()
    u0 = torch.randn(1, c, n, n)  # the draw the layer's first forward pass makes
    torch.random.set_rng_state(state)
    layer.train()
    y_train = layer(x_train)
    layer.eval()
    with torch.no_grad():
        y_eval = layer(x_eval)
    tensors = {"kernel": layer.kernel, "bias": layer.bias, "u0": u0, "u": layer.u,
               "x_train": x_train, "y_train": y_train, "x_eval": x_eval, "y_eval": y_eval,
               "eval_rescaling": layer.val_rescaling_cached.reshape(1)}
    write(ROOT / "plugins/lipcli-cpl/tests/data", case, tensors,
          {"layer": "CPLConv2d", "channels": c, "kernel": k, "size": n, "seed": seed,
           "val_niter": layer.val_niter, "epsilon": layer.epsilon})


def sandwich_conv_case(sw, case: str, cin: int, cout: int, k: int, n: int, seed: int, stable: bool) -> None:
    torch.manual_seed(seed)
    layer = sw.SandwichConv(cin, cout, k, numerical_stable=stable)
    with torch.no_grad():
        layer.psi.normal_(0.0, 0.3)  # Psi != I, so that its placement is tested
    x_train = torch.randn(3, cin, n, n)
    x_eval = torch.randn(3, cin, n, n)
    layer.train()
    y_train = layer(x_train)  # sets alpha (first call)
    layer.eval()
    with torch.no_grad():
        layer.Qfft = None
        y_eval = layer(x_eval)
    tensors = {"weight": layer.weight, "bias": layer.bias, "psi": layer.psi, "alpha": layer.alpha.reshape(1),
               "x_train": x_train, "y_train": y_train, "x_eval": x_eval, "y_eval": y_eval}
    write(ROOT / "plugins/lipcli-sandwich/tests/data", case, tensors,
          {"layer": "SandwichConv", "in": cin, "out": cout, "kernel": k, "size": n, "seed": seed,
           "numerical_stable": stable})


def sandwich_fc_case(sw, case: str, fin: int, fout: int, seed: int, stable: bool) -> None:
    torch.manual_seed(seed)
    layer = sw.SandwichFc(fin, fout, numerical_stable=stable)
    with torch.no_grad():
        layer.psi.normal_(0.0, 0.3)
    x_train = torch.randn(5, fin)
    x_eval = torch.randn(5, fin)
    layer.train()
    y_train = layer(x_train)
    layer.eval()
    with torch.no_grad():
        layer.Q = None
        y_eval = layer(x_eval)
    tensors = {"weight": layer.weight, "bias": layer.bias, "psi": layer.psi, "alpha": layer.alpha.reshape(1),
               "x_train": x_train, "y_train": y_train, "x_eval": x_eval, "y_eval": y_eval}
    write(ROOT / "plugins/lipcli-sandwich/tests/data", case, tensors,
          {"layer": "SandwichFc", "in": fin, "out": fout, "seed": seed, "numerical_stable": stable})


def main(repo: Path) -> None:
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != COMMIT:
        sys.exit(f"expected {repo} at {COMMIT}, found {head or 'no git checkout'}")
    torch.set_default_dtype(torch.float64)  # fixtures in float64: comparisons to ~1e-12
    cpl = load(repo, "models/layers/lipschitz/cpl.py", "lc_cpl")
    sw = load(repo, "models/layers/lipschitz/sandwich.py", "lc_sandwich")
    cpl_case(cpl, "cpl_conv_c4_k3_n6", 4, 3, 6, seed=0)
    cpl_case(cpl, "cpl_conv_c6_k1_n1", 6, 1, 1, seed=1)  # the study's head: a 1x1 CPL on 1x1 images
    sandwich_conv_case(sw, "sandwich_conv_c4_c4_k3_n8", 4, 4, 3, 8, seed=0, stable=False)
    sandwich_conv_case(sw, "sandwich_conv_c4_c6_k3_n6", 4, 6, 3, 6, seed=1, stable=False)
    sandwich_conv_case(sw, "sandwich_conv_c6_c4_k3_n4_stable", 6, 4, 3, 4, seed=2, stable=True)
    sandwich_fc_case(sw, "sandwich_fc_8_8", 8, 8, seed=0, stable=False)
    sandwich_fc_case(sw, "sandwich_fc_8_5", 8, 5, seed=1, stable=False)
    sandwich_fc_case(sw, "sandwich_fc_5_8_stable", 5, 8, seed=2, stable=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
