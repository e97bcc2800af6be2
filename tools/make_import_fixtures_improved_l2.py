"""Make the ``lip import --from improved-l2`` Cayley fixture by running the paper's code, unmodified.

Usage (development time only; the test suite never runs this or fetches anything)::

    git -C <mirror of singlasahil14/improved_l2_robustness> archive 65dd5f244be8 | tar -x -C /tmp/il2
    pip install --target /tmp/pydeps einops          # the authors' code imports it
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_improved_l2.py /tmp/il2
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_improved_l2.py /tmp/il2 bcop

The case ``improved_l2_cayley_lln_d5_w2``: their ``LipConvNet`` with ``conv_name='cayley'`` and
the LLN head (tiny: stem width 2), made exactly as ``tools/make_import_fixtures.py improved-l2``
makes the SOC cases (its shims, :func:`_train_a_little`, ``torch.save(model.state_dict())``,
their ``evaluate_certificates(exact=True)`` constant and radii) ->
``tests/data/import/<case>.pt`` and ``<case>.logits.json``.  It also records
``logits_float64``: their eval-mode model in float64 (a copy, ``.double()``, with float64 as
the default dtype so that their shift matrices are complex128 too) on the same inputs: their
float32 logits are off from it by about ``1.5e-5`` relative (their complex64 ``inverse``), so
the tests compare lipcli's float32 model with it at ``1e-5`` and lipcli's float64 model at ``1e-6``.

The case ``improved_l2_bcop_lln_d5_w2`` (``conv_name='bcop'``, ``block_ortho_conv.BCOP``): the
same, but its logits are those of a fresh model of theirs that loads the saved state dict (as
``test_robust.py`` does): their trained model's eval forward reuses the filter cached by its
last training forward, one SGD step behind the saved parameters.  Shim: ``Tensor.cuda`` is
the identity (their ``BCOP`` puts its bias on the GPU at construction).  No float64 logits.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_import_fixtures import (  # noqa: E402
    COMMITS,
    INPUT_SEED,
    NUM_INPUTS,
    _shim_authors_imports,
    _train_a_little,
    fixed_inputs,
)

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "import"
CASES = {"improved_l2_cayley_lln_d5_w2": dict(conv_name="cayley", activation_name="maxmin", pooling_name="max",
                                              last_name="lln", init_channels=2, block_size=1, num_classes=10)}

BCOP_CASES = {"improved_l2_bcop_lln_d5_w2": dict(conv_name="bcop", activation_name="maxmin", pooling_name="max",
                                                 last_name="lln", init_channels=2, block_size=1, num_classes=10)}


def bcop_cases(LipConvNet: type) -> None:
    """The BCOP cases (module docstring)."""
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    for case, kwargs in BCOP_CASES.items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        _train_a_little(model, opt, kwargs["num_classes"])
        torch.save(model.state_dict(), OUT / f"{case}.pt")
        fresh = LipConvNet(**kwargs)
        fresh.load_state_dict(torch.load(OUT / f"{case}.pt", weights_only=True))
        fresh.eval()
        lip = fresh.lipschitz_constant(exact=True)
        with torch.no_grad():
            logits, certs = fresh(fixed_inputs(), return_cert=True)
        record = {"source": "github.com/singlasahil14/improved_l2_robustness", "commit": COMMITS["improved-l2"],
                  "importer": "improved-l2", "lipconvnet_args": kwargs, "input_seed": INPUT_SEED,
                  "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist(),
                  "source_lipschitz": lip, "source_radii": certs.min(dim=1).values.tolist()}
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    _shim_authors_imports()
    from lip_convnets import LipConvNet  # the authors' module

    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[2:] == ["bcop"]:
        bcop_cases(LipConvNet)
        return
    for case, kwargs in CASES.items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(model, opt, kwargs["num_classes"])
        torch.save(model.state_dict(), OUT / f"{case}.pt")
        double = copy.deepcopy(model)
        for layer in double.modules():
            if hasattr(layer, "shift_matrix"):
                del layer.shift_matrix  # recomputed at the float64 default below
        x64 = fixed_inputs().double()  # drawn in float32, as the recorded inputs
        torch.set_default_dtype(torch.float64)
        with torch.no_grad():
            logits64 = double.double()(x64)
        torch.set_default_dtype(torch.float32)
        lip = model.lipschitz_constant(exact=True)
        with torch.no_grad():
            _logits, certs = model(fixed_inputs(), return_cert=True)
        record = {"source": "github.com/singlasahil14/improved_l2_robustness", "commit": COMMITS["improved-l2"],
                  "importer": "improved-l2", "lipconvnet_args": kwargs, "input_seed": INPUT_SEED,
                  "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist(), "logits_float64": logits64.tolist(),
                  "source_lipschitz": lip, "source_radii": certs.min(dim=1).values.tolist()}
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


if __name__ == "__main__":
    main()
