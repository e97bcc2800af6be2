"""Make the ``lip import --from bronet`` test fixtures by running the BRONet authors' code, unmodified.

Usage (development time only; the test suite never runs this or fetches anything)::

    git -C <mirror of ntuaislab/BRONet> archive 9d59c9bd15e8 | tar -x -C /tmp/bronet
    pip install --target /tmp/pydeps einops          # their SOC modules import it
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_bronet.py bronet /tmp/bronet/bronet
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_bronet.py lipconvnet-soc /tmp/bronet/lipconvnet
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_bronet.py lipconvnet-lot /tmp/bronet/lipconvnet
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_bronet.py train-forward /tmp/bronet/bronet

``lipconvnet-soc`` / ``lipconvnet-lot``: their ``lipconvnet/`` LipConvNet with ``--conv-layer
soc`` (the case ``bronet_lipconvnet_soc_b2_w2_c10``) or ``lot`` (``bronet_lipconvnet_lot_*``:
``--lln`` and their LOT last layer), made as ``tools/make_import_fixtures.py
bronet-lipconvnet`` makes the BRO cases (behind the loader's normalisation, three SGD steps,
``torch.save(model.state_dict())``, their ``lln_certificates`` or, without ``--lln``,
``ortho_certificates``, with ``L = 1/max(std)``).

For each case it builds the authors' ``BRONet`` (``bronet/models/model.py``; tiny, the
``benchmark_reproduce`` configurations' layer types: BRO backbone, Cholesky neck and dense
layers, MinMax, LLN), trains it three NAdam steps (``train.py``'s optimizer, without timm's
Lookahead wrapper) on random images with the authors' own training-mode forward (centring,
running means), saves the checkpoint dictionary ``train.py`` writes
(``dict(backbone=..., optimizer=..., start_epoch, current_iter, training_logs, configs)``) and
records, on fixed inputs, the authors' eval-mode logits and their certificate (``test.py``:
``sub_lipschitz()`` with ``set_num_lc_iter(500)``, then ``get_predictions``' rule as a radius)
-> ``plugins/lipcli-bro/tests/data/<case>.pt`` and ``<case>.logits.json``.

Shim, outside the authors' code: ``torch.distributed.get_world_size`` returns 1 (their dense
layers call it at construction, also without a process group; a single process is what it
describes).  Everything runs on the CPU in float32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_import_fixtures import INPUT_SEED, NUM_INPUTS, _train_a_little, fixed_inputs  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "plugins" / "lipcli-bro" / "tests" / "data"
#: the source commit the fixtures were made with (the archive given on the command line)
COMMIT = "9d59c9bd15e8361685a7a30c0ff8f6bb9ec05ca0"
#: case -> the authors' ``model`` configuration (their key names, ``configs/*.yaml``)
CASES = {
    "bronet_d2_w4_c10": dict(depth=2, width=4, input_size=32, num_classes=10, act_name="MinMax", use_lln=True,
                             stem_kernel_size=5, backbone_type="bro", backbone_centering=True,
                             backbone_weight_rank_ratio=0.5, neck_conv_type="cholesky",
                             neck_linear_type="cholesky", dense_type="cholesky", dense_width=16, linear_num=2),
    "bronet_d1_w6_c100": dict(depth=1, width=6, input_size=32, num_classes=100, act_name="MinMax", use_lln=True,
                              stem_kernel_size=3, backbone_type="bro", backbone_centering=False,
                              backbone_weight_rank_ratio=0.25, neck_conv_type="cholesky",
                              neck_linear_type="cholesky", neck_conv_patch_size=2, dense_type="cholesky",
                              dense_width=8, linear_num=1),
}


#: their lipconvnet/ LipConvNet with SOC or LOT layers: the authors' LipConvNet arguments, by --conv-layer
LIPCONVNET_CASES = {
    "soc": {"bronet_lipconvnet_soc_b2_w2_c10": dict(conv_name="soc", activation="maxmin", init_channels=2,
                                                    block_size=2, num_classes=10, input_size=32, lln=True)},
    "lot": {"bronet_lipconvnet_lot_b2_w2_c10": dict(conv_name="lot", activation="maxmin", init_channels=2,
                                                    block_size=2, num_classes=10, input_size=32, lln=True),
            "bronet_lipconvnet_lot_b1_w2_c100": dict(conv_name="lot", activation="maxmin", init_channels=2,
                                                     block_size=1, num_classes=100, input_size=32, lln=False)},
}


def lipconvnet_cases(src: Path, conv: str) -> None:
    """The SOC or LOT LipConvNet cases (module docstring); ``Tensor.cuda`` is the identity (a
    shim for ``utils/__init__.py``'s module-level ``.cuda()``)."""
    from make_import_fixtures import _LoaderNormalized

    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    sys.path.insert(0, str(src))
    from models.lip_convnets import LipConvNet  # the authors' modules
    from utils import cifar10_mean, cifar10_std
    from utils.eval import lln_certificates, ortho_certificates

    mean, std = torch.tensor(cifar10_mean).view(3, 1, 1), torch.tensor(cifar10_std).view(3, 1, 1)
    for case, kwargs in LIPCONVNET_CASES[conv].items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(_LoaderNormalized(model, mean, std), opt, kwargs["num_classes"])
        L = 1 / torch.max(std)
        radii = (lln_certificates(logits, logits.argmax(1), model.last_layer, L) if kwargs["lln"]
                 else ortho_certificates(logits, logits.argmax(1), L))
        torch.save(model.state_dict(), OUT / f"{case}.pt")
        record = {"source": "github.com/ntuaislab/BRONet", "commit": COMMIT, "importer": "bronet-lipconvnet",
                  "lipconvnet_args": kwargs, "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32],
                  "logits": logits.tolist(), "source_radii": radii.tolist()}
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


#: the case whose training-mode forward ``train-forward`` records
TRAIN_CASE = "bronet_d2_w4_c10"


def train_forward() -> None:
    """``train-forward``: the authors' ``BRONet`` with the weights of ``bronet_d2_w4_c10.pt``
    (written by the ``bronet`` mode, not rewritten), one training-mode forward on the fixed
    inputs (their centring on the batch mean, running means updated with momentum 0.1)
    -> ``<case>.train.json``: the logits and the backbone's running means after it (what
    ``test_bronet_backbone.py`` compares lipcli's ``quasi_residual``/``centering`` with)."""
    from models import BRONet  # the authors' modules

    cfg = CASES[TRAIN_CASE]
    model = BRONet(**cfg)
    model.load_state_dict(torch.load(OUT / f"{TRAIN_CASE}.pt", weights_only=True)["backbone"])
    model.train()
    with torch.no_grad():
        logits = model(fixed_inputs())
    record = {"source": "github.com/ntuaislab/BRONet", "commit": COMMIT, "checkpoint": f"{TRAIN_CASE}.pt",
              "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32], "train_logits": logits.tolist(),
              "running_mean_after": model.conv.running_mean.tolist()}
    (OUT / f"{TRAIN_CASE}.train.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {TRAIN_CASE}.train.json")


def main() -> None:
    which, src = sys.argv[1], Path(sys.argv[2])
    if which in ("lipconvnet-soc", "lipconvnet-lot"):
        lipconvnet_cases(src, which.removeprefix("lipconvnet-"))
        return
    torch.distributed.get_world_size = lambda *a, **k: 1  # the shim (module docstring)
    sys.path.insert(0, str(src))
    if which == "train-forward":
        train_forward()
        return
    from models import BRONet, get_predictions  # the authors' modules

    OUT.mkdir(parents=True, exist_ok=True)
    for case, cfg in CASES.items():
        torch.manual_seed(0)
        model = BRONet(**cfg)
        opt = torch.optim.NAdam(model.parameters(), lr=1e-2, weight_decay=4e-5)
        logits = _train_a_little(model, opt, cfg["num_classes"])
        state = dict(backbone=model.state_dict(), optimizer=opt.state_dict(), start_epoch=1, current_iter=3,
                     training_logs=["three steps on random images"], configs={"model": cfg})
        torch.save(state, OUT / f"{case}.pt")
        # test.py: eval, 500 power steps, sub_lipschitz, get_predictions (certified at eps iff the
        # predicted logit >= every other f_j + lc*eps*|w_y - w_j|): the largest such eps per image
        model.set_num_lc_iter(500)
        with torch.no_grad():
            lc = float(model.sub_lipschitz())
            clean, _ = get_predictions(model, fixed_inputs(), [0.0], lc)
            head = model.head.get_weight()
            pred = clean.argmax(1)
            spread = (head[pred].unsqueeze(1) - head.unsqueeze(0)).norm(dim=-1)
            gaps = (clean.gather(1, pred[:, None]) - clean) / (lc * spread)
            radii = gaps.scatter(1, pred[:, None], float("inf")).min(dim=1).values
        assert torch.equal(clean, logits)
        record = {"source": "github.com/ntuaislab/BRONet", "commit": COMMIT, "importer": "bronet",
                  "model_config": cfg, "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32],
                  "logits": logits.tolist(), "source_lipschitz": lc, "source_radii": radii.tolist()}
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers, lc {lc:.4f}")


if __name__ == "__main__":
    main()
