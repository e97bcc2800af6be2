"""Make the ``lip import`` fixtures of the configurations beyond the first ones (issue: every
option of the source's code that changes the function), by running the authors' code, unmodified.

Usage (development time only; the test suite never runs this or fetches anything)::

    git -C <mirror of ntuaislab/BRONet> archive 9d59c9bd15e8 | tar -x -C /tmp/bronet
    git -C <mirror of singlasahil14/improved_l2_robustness> archive 65dd5f244be8 | tar -x -C /tmp/il2
    pip install --target /tmp/pydeps einops          # the authors' SOC modules import it
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_options.py bronet /tmp/bronet/bronet
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_options.py improved-l2 /tmp/il2
    git -C <mirror of araujoalexandre/Lipschitz-SLL-Networks> archive 87865dbf74f0 | tar -x -C /tmp/sll
    .venv/bin/python tools/make_import_fixtures_options.py sll /tmp/sll
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures_options.py bronet-lipconvnet /tmp/bronet/lipconvnet

``bronet``: the BRONet authors' ``BRONet`` (``bronet/models/model.py``) at configurations whose
options change no tensor shape, made exactly as ``tools/make_import_fixtures_bronet.py bronet``
makes its cases (three NAdam steps, the ``train.py`` checkpoint dictionary with ``configs``,
the eval-mode logits on the fixed inputs): ``bronet_d2_w4_c10_plain`` (``backbone_quasi_residual:
False``, ``backbone_zero_padding: False``), ``bronet_lot_d1_w4_c10`` (``backbone_type: lot``,
which lipcli refuses by name) -> ``plugins/lipcli-bro/tests/data/``.

``improved-l2``: the paper's ``LipConvNet`` with its projection pooling (``--pooling lip1``,
``LipPool``) and the CRC-Lip head (``crc_full``) or its orthogonal last layer (``ortho``: an SOC
1×1 layer), made as ``tools/make_import_fixtures.py improved-l2`` makes its SOC cases (their
``update_sigma``, three SGD steps, ``torch.save(model.state_dict())``, their
``evaluate_certificates(exact=True)`` constant and radii) -> ``tests/data/import/``; also the
``config.json`` ``train_robust.py`` writes (its arguments) for ``lip import --config``.
``sll``: the SLL authors' ``LipschitzNetwork`` without convolutions (``n_conv 0``,
``sll_cifar10_c0_d2_w4``, the trainer's checkpoint dictionary as ``tools/make_import_fixtures.py
sll`` writes it) and one saved alone (``LipschitzNetwork.state_dict()``, no ``NormalizedModel``
or ``DataParallel`` around it: ``sll_cifar10_c2_d0_w4_net``; its logits those of the
``NormalizedModel`` their evaluation wraps it in) -> ``plugins/lipcli-sll/tests/data/``; and
for every SLL case (these and ``make_import_fixtures.py``'s) ``<case>.config.json``: the
``main.py`` arguments of the configuration (``shift_data: true``, their default).

``bronet-lipconvnet``: BRONet's ``lipconvnet/`` LipConvNet with ``--kernel 5`` (the stride-2
layers of layers 1-4), BRO (``bronet_lipconvnet_k5_b1_w2_c10``) and LOT
(``bronet_lipconvnet_lot_k5_b1_w2_c10``), made as ``tools/make_import_fixtures.py
bronet-lipconvnet`` makes its cases (behind the loader's normalisation, three SGD steps,
``torch.save(model.state_dict())``) -> ``plugins/lipcli-bro/tests/data/``.

Shims, outside the authors' code: ``Tensor.cuda`` is the identity (``LipPool`` puts its angles
on the GPU at construction), and their cuDNN extension's ``convolution_backward_weight`` is
``torch.nn.grad.conv2d_weight`` (the orthogonal last layer's SOC keeps ``fast_train=True``,
whose backward pass calls it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_import_fixtures import (  # noqa: E402
    COMMITS,
    INPUT_SEED,
    NUM_INPUTS,
    OUT,
    _shim_authors_imports,
    _train_a_little,
    fixed_inputs,
)
from make_import_fixtures_bronet import CASES as BRONET_BASE  # noqa: E402
from make_import_fixtures_bronet import COMMIT as BRONET_COMMIT  # noqa: E402
from make_import_fixtures_bronet import OUT as BRONET_OUT  # noqa: E402

BRONET_CASES = {
    "bronet_d2_w4_c10_plain": dict(BRONET_BASE["bronet_d2_w4_c10"], backbone_quasi_residual=False,
                                   backbone_zero_padding=False),
    "bronet_lot_d1_w4_c10": dict(BRONET_BASE["bronet_d2_w4_c10"], depth=1, backbone_type="lot", linear_num=1),
}

#: the paper's LipConvNet arguments, and its train_robust.py arguments of the same configuration
IMPROVED_L2_CASES = {
    "improved_l2_lip1_crc_d5_w2": dict(conv_name="soc", activation_name="maxmin", pooling_name="lip1",
                                       last_name="crc_full", init_channels=2, block_size=1, num_classes=10,
                                       num_hidden=16, fast_train=False),
    "improved_l2_lip1_ortho_d5_w2": dict(conv_name="soc", activation_name="maxmin", pooling_name="lip1",
                                         last_name="ortho", init_channels=2, block_size=1, num_classes=10,
                                         fast_train=False),
}


def _args_json(kwargs: dict) -> dict:
    """``train_robust.py``'s ``args.__dict__`` (its ``config.json``) for these LipConvNet arguments."""
    return {"conv_layer": kwargs["conv_name"], "activation": kwargs["activation_name"],
            "pooling": kwargs["pooling_name"], "last_layer": kwargs["last_name"],
            "init_channels": kwargs["init_channels"], "num_layers": 5 * kwargs["block_size"],
            "num_hidden": kwargs.get("num_hidden", 4096), "fast_train": kwargs["fast_train"],
            "dataset": "cifar10", "num_other": 9, "gamma": 0.0, "beta": 0.0, "attack_radius": 0.0}


def bronet(src: Path) -> None:
    torch.distributed.get_world_size = lambda *a, **k: 1  # their dense layers' call (as there)
    sys.path.insert(0, str(src))
    from models import BRONet  # the authors' modules

    for case, cfg in BRONET_CASES.items():
        torch.manual_seed(0)
        model = BRONet(**cfg)
        opt = torch.optim.NAdam(model.parameters(), lr=1e-2, weight_decay=4e-5)
        logits = _train_a_little(model, opt, cfg["num_classes"])
        state = dict(backbone=model.state_dict(), optimizer=opt.state_dict(), start_epoch=1, current_iter=3,
                     training_logs=["three steps on random images"], configs={"model": cfg})
        torch.save(state, BRONET_OUT / f"{case}.pt")
        model.set_num_lc_iter(500)
        with torch.no_grad():
            lc = float(model.sub_lipschitz())
        record = {"source": "github.com/ntuaislab/BRONet", "commit": BRONET_COMMIT, "importer": "bronet",
                  "model_config": cfg, "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32],
                  "logits": logits.tolist(), "source_lipschitz": lc}
        (BRONET_OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers, lc {lc:.4f}")


def improved_l2(src: Path) -> None:
    sys.path.insert(0, str(src))
    _shim_authors_imports()
    import types

    import torch.utils.cpp_extension as cpp

    def backward_weight(x, size, grad, stride, padding, dilation, groups, *_flags):
        return torch.nn.grad.conv2d_weight(x, size, grad, stride, padding, dilation, groups)

    cpp.load = lambda *a, **k: types.SimpleNamespace(convolution_backward_weight=backward_weight)
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    from lip_convnets import LipConvNet  # the authors' module

    for case, kwargs in IMPROVED_L2_CASES.items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        model.update_sigma()  # as train_robust.py does before training
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(model, opt, kwargs["num_classes"])
        torch.save(model.state_dict(), OUT / f"{case}.pt")
        lip = model.lipschitz_constant(exact=True)
        with torch.no_grad():
            _logits, certs = model(fixed_inputs(), return_cert=True)
        record = {"source": "github.com/singlasahil14/improved_l2_robustness", "commit": COMMITS["improved-l2"],
                  "importer": "improved-l2", "lipconvnet_args": kwargs, "input_seed": INPUT_SEED,
                  "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist(),
                  "source_lipschitz": lip, "source_radii": certs.min(dim=1).values.tolist()}
        if kwargs["last_name"] == "crc_full":  # as tools/make_import_fixtures.py records it
            with torch.no_grad():
                features = model(fixed_inputs(), only_features=True)
                torch.manual_seed(0)
                _l, crc = model.logits_layer.certificates(features, logits.argmax(1))
            record["source_crc_certs"] = crc.tolist()
            record["source_radii"] = (crc / lip).min(dim=1).values.tolist()
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        (OUT / f"{case}.config.json").write_text(json.dumps(_args_json(kwargs), indent=2) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


SLL_CASES = {
    "sll_cifar10_c0_d2_w4": (dict(dataset="cifar10", n_conv=0, n_dense=2, w=4, conv_inner_dim=-1,
                                  dense_inner_dim=16), False),
    "sll_cifar10_c2_d0_w4_net": (dict(dataset="cifar10", n_conv=2, n_dense=0, w=4, conv_inner_dim=3,
                                      dense_inner_dim=-1), True),
}


def sll(src: Path) -> None:
    import argparse

    from make_import_fixtures import SLL_CASES as SLL_BASE
    from make_import_fixtures import SLL_MEANS, SLL_OUT

    sys.path.insert(0, str(src))
    from core.models.model import LipschitzNetwork, NormalizedModel  # the authors' modules

    for case, (fields, alone) in SLL_CASES.items():
        torch.manual_seed(0)
        net = LipschitzNetwork(argparse.Namespace(**fields), 10)
        model = torch.nn.DataParallel(NormalizedModel(net, SLL_MEANS[fields["dataset"]], (1.0, 1.0, 1.0)))
        opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.5, 0.9))
        logits = _train_a_little(model, opt, 10)
        state = (net.state_dict() if alone else
                 {"epoch": 1, "global_step": 3, "model_state_dict": model.state_dict(),
                  "optimizer_state_dict": opt.state_dict()})
        torch.save(state, SLL_OUT / f"{case}.pth")
        record = {"source": "github.com/araujoalexandre/Lipschitz-SLL-Networks", "commit": COMMITS["sll"],
                  "importer": "sll", "config": fields, "saved": "LipschitzNetwork.state_dict()" if alone else
                  "core/trainer.py checkpoint", "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32],
                  "logits": logits.tolist()}
        (SLL_OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in net.state_dict().values())} numbers")
    for case, fields in {**SLL_BASE, **{c: f for c, (f, _a) in SLL_CASES.items()}}.items():
        args = {**fields, "shift_data": True, "mode": "train", "loss": "xent"}
        (SLL_OUT / f"{case}.config.json").write_text(json.dumps(args, indent=2) + "\n")


KERNEL_CASES = {
    "bronet_lipconvnet_k5_b1_w2_c10": dict(conv_name="bro", activation="maxmin", init_channels=2, block_size=1,
                                           num_classes=10, input_size=32, lln=True, kernel_size=5),
    "bronet_lipconvnet_lot_k5_b1_w2_c10": dict(conv_name="lot", activation="maxmin", init_channels=2, block_size=1,
                                               num_classes=10, input_size=32, lln=True, kernel_size=5),
}


def bronet_lipconvnet(src: Path) -> None:
    from make_import_fixtures import COMMITS as C
    from make_import_fixtures import _LoaderNormalized

    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    sys.path.insert(0, str(src))
    from models.lip_convnets import LipConvNet  # the authors' modules
    from utils import cifar10_mean, cifar10_std

    mean, std = torch.tensor(cifar10_mean).view(3, 1, 1), torch.tensor(cifar10_std).view(3, 1, 1)
    for case, kwargs in KERNEL_CASES.items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(_LoaderNormalized(model, mean, std), opt, kwargs["num_classes"])
        torch.save(model.state_dict(), BRONET_OUT / f"{case}.pt")
        record = {"source": "github.com/ntuaislab/BRONet", "commit": C["bronet-lipconvnet"],
                  "importer": "bronet-lipconvnet", "lipconvnet_args": kwargs, "input_seed": INPUT_SEED,
                  "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist()}
        (BRONET_OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


def main() -> None:
    which, src = sys.argv[1], Path(sys.argv[2])
    {"bronet": bronet, "improved-l2": improved_l2, "sll": sll, "bronet-lipconvnet": bronet_lipconvnet}[which](src)


if __name__ == "__main__":
    main()
