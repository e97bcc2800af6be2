"""Make the ``lip import --from lot`` test fixtures by running the LOT authors' code, unmodified.

Usage (development time only; the test suite never runs this or fetches anything)::

    git -C <mirror of AI-secure/Layerwise-Orthogonal-Training> archive 65f7ea4 | tar -x -C /tmp/lot
    pip install --target /tmp/pydeps einops          # the authors' code imports it
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_lot.py /tmp/lot [CASE ...]

For each case it builds the authors' ``LipConvNet`` or ``LipResNet`` (``lip_convnets.py``, as
``train_robust.py``'s ``init_model``; tiny: ``--init-channels 2``), trains it three SGD steps on
random images behind their loader's normalisation (:func:`make_import_fixtures._train_a_little`,
their training-mode forward), saves ``model.state_dict()`` with ``torch.save`` exactly as
``train_robust.py`` does, and records their eval-mode logits on the fixed inputs and their
certificate of the predicted class (``utils.evaluate_certificates``: ``lln_certificates`` or
``ortho_certificates`` with ``L = 1/max(std)``, before the accuracy mask):
``plugins/lipcli-lot/tests/data/<case>.pt`` and ``<case>.logits.json``.

Shims, outside the authors' code: ``Tensor.cuda`` is the identity (``utils.py`` moves its
normalisation constants to the GPU at import time, ``ortho_certificates`` its one-hot).
Everything runs on the CPU in float32 (the authors train LOT with ``--opt-level O0``: float32).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from make_import_fixtures import INPUT_SEED, NUM_INPUTS, _LoaderNormalized, _train_a_little

OUT = Path(__file__).resolve().parent.parent / "plugins" / "lipcli-lot" / "tests" / "data"
SOURCE = "github.com/AI-secure/Layerwise-Orthogonal-Training"
#: the source commit the fixtures were made with (the archive given on the command line)
COMMIT = "65f7ea4508d7ec9921d219cdd469ac8a2d48b817"
#: case -> (residual, the authors' model arguments)
CASES = {
    "lot_lipconvnet_b2_w2_lln": (False, dict(conv_name="lot", activation="maxmin", init_channels=2,
                                             block_size=2, num_classes=10, lln=True)),
    "lot_lipresnet_b3_w2_lln": (True, dict(conv_name="lot", activation="maxmin", init_channels=2,
                                           block_size=3, num_classes=10, lln=True)),
    "lot_lipconvnet_b1_w2_c100": (False, dict(conv_name="lot", activation="maxmin", init_channels=2,
                                              block_size=1, num_classes=100, lln=False)),
    "lot_lipresnet_b3_w2_hh1": (True, dict(conv_name="lot", activation="hh1", init_channels=2,
                                           block_size=3, num_classes=10, lln=True)),
    "lot_lipconvnet_b1_w2_hh2": (False, dict(conv_name="lot", activation="hh2", init_channels=2,
                                             block_size=1, num_classes=10, lln=True)),
}


def main() -> None:
    src = Path(sys.argv[1])
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    sys.path.insert(0, str(src))
    from lip_convnets import LipConvNet, LipResNet  # the authors' modules
    from utils import cifar10_mean, cifar10_std, lln_certificates, ortho_certificates

    mean, std = torch.tensor(cifar10_mean).view(3, 1, 1), torch.tensor(cifar10_std).view(3, 1, 1)
    L = 1 / torch.max(std)
    OUT.mkdir(parents=True, exist_ok=True)
    cases = {k: v for k, v in CASES.items() if len(sys.argv) < 3 or k in sys.argv[2:]}
    for case, (residual, kwargs) in cases.items():
        torch.manual_seed(0)
        model = (LipResNet if residual else LipConvNet)(**kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(_LoaderNormalized(model, mean, std), opt, kwargs["num_classes"])
        preds = logits.argmax(1)
        with torch.no_grad():
            radii = (lln_certificates(logits, preds, model.last_layer, L) if kwargs["lln"]
                     else ortho_certificates(logits, preds, L))
        torch.save(model.state_dict(), OUT / f"{case}.pt")
        record = {"source": SOURCE, "commit": COMMIT, "importer": "lot", "residual": residual,
                  "model_args": kwargs, "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32],
                  "logits": logits.tolist(), "source_lipschitz": float(L), "source_radii": radii.tolist()}
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


if __name__ == "__main__":
    main()
