"""Helpers for the ``lip export`` tests of the plugin distributions under ``plugins/``
(``plugins/*/tests/test_*_export.py``): random float64 parameters, the stand-in check
(``export_module()`` returns a parameter-free module equal to the component) and a
``torch.export`` of it that must contain aten operations only; and the isolated runner of an
exported program shared with ``tests/export``."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from lipcli.testing import randomise_parameters


#: every parameter redrawn ``scale · N(0, 1)`` from a seeded generator (the SDK's helper)
randomise_ = randomise_parameters


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |got − ref| / max |ref|``."""
    return float((got - ref).abs().max() / ref.abs().max())


def check_stand_in(component: nn.Module, kind: type, x: torch.Tensor, rtol: float = 1e-12) -> nn.Module:
    """``component.export_module()``: of type ``kind``, without parameters, and equal to
    ``component(x)`` within ``rtol`` of the largest output; returned."""
    standin = component.export_module()
    assert isinstance(standin, kind), type(standin)
    assert not list(standin.parameters())
    with torch.no_grad():
        error = relative_error(standin(x), component(x))
    assert error <= rtol, error
    return standin


def check_stand_in_follows(component: nn.Module, change: Callable[[], None], x: torch.Tensor) -> None:
    """A stand-in is baked when exported: after ``change()`` (an in-place edit of
    ``component``'s parameters) the earlier stand-in differs from ``component(x)`` (so a
    stand-in test can fail) and a new one equals it."""
    before = component.export_module()
    with torch.no_grad():
        change()
        assert not torch.allclose(before(x), component(x))
        torch.testing.assert_close(component.export_module()(x), component(x), rtol=1e-12, atol=1e-12)


def aten_program(module: nn.Module, example: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``torch.export`` of ``module`` with a dynamic batch, under ``no_grad`` as ``lip export``
    runs it; asserts that the graph calls aten operations only (and Python's ``getitem`` on
    the pairs min/max return); returns the exported program as a callable."""
    with torch.no_grad():
        program = torch.export.export(module, (example,), strict=False,
                                      dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets and all(t.startswith("aten.") or "getitem" in t for t in targets), targets
    return program.module()


#: runs an exported file (``fmt, path, images.npy, outputs.npz``) with every ``lipcli*`` module
#: (lipcli and any plugin package) unimportable; saves the program's outputs to the ``.npz``
#: and prints, last, the JSON list of ``lipcli*`` modules that were loaded (must be empty)
ISOLATED_RUNNER = r'''
import json, sys
class _NoLipcli:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0].startswith("lipcli"):
            raise ImportError(f"{name} is blocked in this interpreter")
        return None
sys.meta_path.insert(0, _NoLipcli)      # any import of lipcli or a plugin now fails
import numpy as np
fmt, path, images, out = sys.argv[1:]
x = np.load(images)
if fmt == "onnx":
    import onnxruntime as ort
    result = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"image": x})
else:
    import torch
    program = torch.export.load(path).module() if fmt == "pt2" else torch.jit.load(path)
    with torch.no_grad():
        result = program(torch.from_numpy(x))
    result = [t.numpy() for t in (result if isinstance(result, (tuple, list)) else [result])]
np.savez(out, *result)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("lipcli") and sys.modules[m] is not None)))
'''


def run_exported_program(tmp_path, runner_script: str, fmt: str, exported, images):
    """Run an exported program in a fresh isolated interpreter (``python -I``: no lipcli, no
    plugin on the path) with ``runner_script``, which gets ``fmt, exported, images.npy,
    outputs.npz``, saves its outputs to the last and prints a JSON line last.  Returns that
    JSON value and the loaded outputs."""
    import json
    import subprocess
    import sys

    import numpy as np

    script = tmp_path / "run_export.py"
    script.write_text(runner_script)
    np.save(tmp_path / "images.npy", images)
    out = tmp_path / "outputs.npz"
    proc = subprocess.run(
        [sys.executable, "-I", str(script), fmt, str(exported), str(tmp_path / "images.npy"), str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(out)
