"""``lip export`` conformance checks for a component's stand-in (re-exported by
:mod:`lipcli.testing`).

A component that offers ``export_module()`` (see :mod:`lipcli.sdk.export`) returns a
parameter-free module equal to itself; ``lip export`` traces it with ``torch.export`` and
writes a program that runs without lipcli.  The checks:

* :func:`check_export_module` -- the stand-in has the expected type, no parameters, and
  equals the component on an input;
* :func:`check_export_follows` -- a stand-in is baked when exported: after an in-place edit
  of the component the old stand-in differs and a new one equals it;
* :func:`check_aten_program` -- ``torch.export`` of a module with a dynamic batch calls aten
  operations only;
* :func:`run_exported_program` -- runs a written program (``pt2``, ``torchscript``, ``onnx``)
  in a fresh interpreter where every ``lipcli*`` module is unimportable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

__all__ = [
    "ISOLATED_RUNNER",
    "check_aten_program",
    "check_export_follows",
    "check_export_module",
    "relative_error",
    "run_exported_program",
]


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |got − ref| / max |ref|``."""
    return float((got - ref).abs().max() / ref.abs().max())


def check_export_module(component: nn.Module, kind: type, x: torch.Tensor, rtol: float = 1e-12) -> nn.Module:
    """``component.export_module()``: of type ``kind``, without parameters, and equal to
    ``component(x)`` within ``rtol`` of the largest output; returned."""
    standin = component.export_module()
    assert isinstance(standin, kind), f"export_module() returned {type(standin).__name__}, not {kind.__name__}"
    names = [name for name, _ in standin.named_parameters()]
    assert not names, f"the stand-in has parameters {names} (bake them as buffers or constants)"
    with torch.no_grad():
        error = relative_error(standin(x), component(x))
    assert error <= rtol, f"the stand-in differs from the component by {error:.3g} (relative; at most {rtol:g})"
    return standin


def check_export_follows(component: nn.Module, change: Callable[[], None], x: torch.Tensor) -> None:
    """A stand-in is baked when exported: after ``change()`` (an in-place edit of
    ``component``'s parameters) the earlier stand-in differs from ``component(x)`` (so a
    stand-in test can fail) and a new one equals it."""
    before = component.export_module()
    with torch.no_grad():
        change()
        assert not torch.allclose(before(x), component(x)), "change() did not change the component's output"
        torch.testing.assert_close(component.export_module()(x), component(x), rtol=1e-12, atol=1e-12)


def check_aten_program(module: nn.Module, example: torch.Tensor) -> Callable[[torch.Tensor], Any]:
    """``torch.export`` of ``module`` with a dynamic batch, under ``no_grad`` as ``lip export``
    runs it; asserts that the graph calls aten operations only (and Python's ``getitem`` on
    tuple returns); returns the exported program as a callable."""
    with torch.no_grad():
        program = torch.export.export(module, (example,), strict=False,
                                      dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets, "the exported graph calls nothing"
    other = [t for t in targets if not (t.startswith("aten.") or "getitem" in t)]
    assert not other, f"the exported graph calls non-aten operations: {other}"
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


def run_exported_program(directory: Path, fmt: str, exported: Path, images: np.ndarray, *,
                         runner_script: str = ISOLATED_RUNNER) -> tuple[Any, Any]:
    """Run an exported program in a fresh isolated interpreter (``python -I``: no lipcli, no
    plugin on the path) with ``runner_script``, which gets ``fmt, exported, images.npy,
    outputs.npz`` (files in ``directory``), saves its outputs to the last and prints a JSON
    line last.  Returns that JSON value (for :data:`ISOLATED_RUNNER`: the ``lipcli*`` modules
    loaded, which must be none) and the loaded outputs (``arr_0``, ``arr_1``, ...)."""
    directory = Path(directory)
    script = directory / "run_export.py"
    script.write_text(runner_script)
    np.save(directory / "images.npy", images)
    out = directory / "outputs.npz"
    proc = subprocess.run(
        [sys.executable, "-I", str(script), fmt, str(exported), str(directory / "images.npy"), str(out)],
        capture_output=True, text=True, cwd=directory, timeout=600,
    )
    assert proc.returncode == 0, f"the exported program failed to run: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(out)
