"""Make the ``lip import`` test fixtures by running the authors' code, unmodified.

Usage (development time only; the test suite never runs this or fetches anything)::

    git -C <mirror of singlasahil14/improved_l2_robustness> archive 65dd5f244be8 | tar -x -C /tmp/il2
    pip install --target /tmp/pydeps einops          # the authors' code imports it
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures.py improved-l2 /tmp/il2

    git -C <mirror of araujoalexandre/Lipschitz-SLL-Networks> archive 87865dbf74f0 | tar -x -C /tmp/sll
    .venv/bin/python tools/make_import_fixtures.py sll /tmp/sll      # numpy, torch, torchvision only

    git -C <mirror of ntuaislab/BRONet> archive 9d59c9bd15e8 lipconvnet | tar -x -C /tmp/bronet
    PYTHONPATH=/tmp/pydeps .venv/bin/python tools/make_import_fixtures.py bronet-lipconvnet /tmp/bronet/lipconvnet

For each case it builds the authors' ``LipConvNet`` (tiny: stem width 2), trains it a few
SGD steps on random images with the authors' own training-mode forward (power vectors
updated as in ``train_robust.py``), saves ``model.state_dict()`` with ``torch.save`` exactly
as ``train_robust.py`` does, and records the authors' eval-mode logits on fixed inputs:
``tests/data/import/<case>.pt`` and ``tests/data/import/<case>.logits.json`` (inputs are
``torch.rand`` with the recorded seed, shape ``(N, 3, 32, 32)``), with the authors' own
certificate of the predicted class on the same inputs (``evaluate_certificates(exact=True)``:
their power-iteration estimate ``source_lipschitz`` and the radii before the accuracy mask).

Shims, outside the authors' code: ``apex`` (``utils.py`` imports ``amp``, unused here) and
``torch.utils.cpp_extension.load`` (``skew_ortho_conv.py`` compiles a cuDNN extension at import
time; it is only used by the fast backward pass, and these cases train with the plain autograd
forward, ``fast_train=False``).  Everything runs on the CPU in float32.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "import"
#: the source commit the fixtures were made with (the archive given on the command line)
COMMITS = {"improved-l2": "65dd5f244be8a7212b05268541d0abdce909bd81",
           "sll": "87865dbf74f07b443b595ea777edbb1d4596faf0",
           "bronet-lipconvnet": "9d59c9bd15e8361685a7a30c0ff8f6bb9ec05ca0"}
INPUT_SEED = 1234
NUM_INPUTS = 4

#: case -> LipConvNet arguments (the authors' names)
IMPROVED_L2_CASES = {
    "improved_l2_lln_d10_w2": dict(conv_name="soc", activation_name="maxmin", pooling_name="max",
                                   last_name="lln", init_channels=2, block_size=2, num_classes=10,
                                   fast_train=False),
    "improved_l2_crc_d5_w2": dict(conv_name="soc", activation_name="maxmin", pooling_name="max",
                                  last_name="crc_full", init_channels=2, block_size=1, num_classes=10,
                                  num_hidden=16, fast_train=False),
}


def _shim_authors_imports() -> None:
    sys.modules.setdefault("apex", types.SimpleNamespace(amp=None))  # type: ignore[arg-type]
    import torch.utils.cpp_extension as cpp

    cpp.load = lambda *a, **k: types.SimpleNamespace()  # the cuDNN extension: not used here


def fixed_inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(INPUT_SEED)
    return torch.rand(NUM_INPUTS, 3, 32, 32, generator=gen)


def _train_a_little(model: torch.nn.Module, opt: torch.optim.Optimizer, classes: int) -> torch.Tensor:
    """Three steps of ``opt`` on random images (the model's own training-mode forward), then
    the eval-mode logits on :func:`fixed_inputs`."""
    gen = torch.Generator().manual_seed(7)
    model.train()
    for _ in range(3):
        x = torch.rand(8, 3, 32, 32, generator=gen)
        y = torch.randint(0, classes, (8,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return model(fixed_inputs())


def _improved_l2(src: Path) -> None:
    sys.path.insert(0, str(src))
    _shim_authors_imports()
    from lip_convnets import LipConvNet  # the authors' module

    commit = COMMITS["improved-l2"]
    for case, kwargs in IMPROVED_L2_CASES.items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        model.update_sigma()  # as train_robust.py does before training
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(model, opt, kwargs["num_classes"])
        torch.save(model.state_dict(), OUT / f"{case}.pt")
        # the authors' certificate rule (utils.evaluate_certificates, exact=True), predicted class
        lip = model.lipschitz_constant(exact=True)
        with torch.no_grad():
            _logits, certs = model(fixed_inputs(), return_cert=True)
        record = {"source": "github.com/singlasahil14/improved_l2_robustness", "commit": commit,
                  "importer": "improved-l2", "lipconvnet_args": kwargs, "input_seed": INPUT_SEED,
                  "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist(),
                  "source_lipschitz": lip, "source_radii": certs.min(dim=1).values.tolist()}
        if kwargs["last_name"] == "crc_full":
            # test_robust.py's rule for this head (evaluate_certificates_precise): the head's
            # certificates of the prediction in feature space, divided by ``lip``; its curvature
            # power method starts from torch's global generator, seeded here
            with torch.no_grad():
                features = model(fixed_inputs(), only_features=True)
                torch.manual_seed(0)
                _l, crc = model.logits_layer.certificates(features, logits.argmax(1))
            record["source_crc_certs"] = crc.tolist()
            record["source_radii"] = (crc / lip).min(dim=1).values.tolist()
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


#: SLL cases (araujoalexandre/Lipschitz-SLL-Networks, ``core/models/model.py``): the authors'
#: config fields; written to plugins/lipcli-sll/tests/data/
SLL_OUT = OUT.parent.parent.parent / "plugins" / "lipcli-sll" / "tests" / "data"
SLL_CASES = {
    "sll_cifar10_c2_d1_w4": dict(dataset="cifar10", n_conv=2, n_dense=1, w=4, conv_inner_dim=3,
                                 dense_inner_dim=32),
    "sll_cifar100_c3_d0_w3": dict(dataset="cifar100", n_conv=3, n_dense=0, w=3, conv_inner_dim=-1,
                                  dense_inner_dim=-1),
}
#: the authors' readers' means (``core/data/readers.py``, ``shift_data=True``; stds are 1)
SLL_MEANS = {"cifar10": (0.4913, 0.4821, 0.4465), "cifar100": (0.5071, 0.4865, 0.4409)}


def _sll(src: Path) -> None:
    """The authors' ``LipschitzNetwork`` wrapped as ``core/trainer.py`` wraps it
    (``NormalizedModel``, then ``nn.DataParallel``, which on a machine without GPUs only adds
    the ``module.`` prefix), a few Adam steps (the authors' default optimizer) on random
    images, and the checkpoint dictionary ``Trainer._save_ckpt`` writes."""
    import argparse

    sys.path.insert(0, str(src))
    from core.models.model import LipschitzNetwork, NormalizedModel  # the authors' modules

    SLL_OUT.mkdir(parents=True, exist_ok=True)
    for case, fields in SLL_CASES.items():
        torch.manual_seed(0)
        classes = {"cifar10": 10, "cifar100": 100}[fields["dataset"]]
        net = LipschitzNetwork(argparse.Namespace(**fields), classes)
        model = torch.nn.DataParallel(NormalizedModel(net, SLL_MEANS[fields["dataset"]], (1.0, 1.0, 1.0)))
        opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.5, 0.9))
        logits = _train_a_little(model, opt, classes)
        state = {"epoch": 1, "global_step": 3, "model_state_dict": model.state_dict(),
                 "optimizer_state_dict": opt.state_dict()}
        torch.save(state, SLL_OUT / f"{case}.pth")
        record = {"source": "github.com/araujoalexandre/Lipschitz-SLL-Networks", "commit": COMMITS["sll"],
                  "importer": "sll", "config": fields, "input_seed": INPUT_SEED,
                  "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist()}
        (SLL_OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


#: BRONet LipConvNet cases (ntuaislab/BRONet, ``lipconvnet/models/lip_convnets.py``): the
#: authors' ``LipConvNet`` arguments, and whether the BRO filters start from the authors'
#: identity (``id_init``, their default) or their own Kaiming branch of ``BRO.reset_parameters``
#: (taps off the centre: the filter's orientation shows); written to plugins/lipcli-bro/tests/data/
BRONET_OUT = OUT.parent.parent.parent / "plugins" / "lipcli-bro" / "tests" / "data"
BRONET_CASES = {
    "bronet_lipconvnet_b2_w2_c10": (dict(conv_name="bro", activation="maxmin", init_channels=2, block_size=2,
                                         num_classes=10, input_size=32, lln=True, mask_level=0.5), True),
    "bronet_lipconvnet_b1_w2_c100": (dict(conv_name="bro", activation="maxmin", init_channels=2, block_size=1,
                                          num_classes=100, input_size=32, lln=True), False),
}


class _LoaderNormalized(torch.nn.Module):
    """The authors' data loader's ``Normalize(mean, std)`` in front of their model (a shim:
    their model takes normalised images)."""

    def __init__(self, net: torch.nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.net, self.mean, self.std = net, mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)


def _bronet_lipconvnet(src: Path) -> None:
    """The authors' ``LipConvNet`` (on the CPU: ``Tensor.cuda`` is the identity, a shim for
    ``utils/__init__.py``'s module-level ``.cuda()``), :func:`_train_a_little` behind the
    loader's normalisation (their training forward), ``torch.save(model.state_dict())`` as
    ``trainer/trainer.py`` does, their eval-mode logits on the normalised fixed inputs
    (``utils/data.py`` normalises in the loader) and their certificate (``utils/eval.py``:
    ``lln_certificates`` with ``L = 1/max(std)``, the evaluator's)."""
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    sys.path.insert(0, str(src))
    from models.lip_convnets import LipConvNet  # the authors' modules
    from models.layers import BRO
    from utils import cifar10_mean, cifar10_std
    from utils.eval import lln_certificates

    mean, std = torch.tensor(cifar10_mean).view(3, 1, 1), torch.tensor(cifar10_std).view(3, 1, 1)
    BRONET_OUT.mkdir(parents=True, exist_ok=True)
    for case, (kwargs, identity) in BRONET_CASES.items():
        torch.manual_seed(0)
        model = LipConvNet(**kwargs)
        for layer in model.modules():
            if isinstance(layer, BRO) and not identity:
                layer.id_init = False
                layer.reset_parameters()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        logits = _train_a_little(_LoaderNormalized(model, mean, std), opt, kwargs["num_classes"])
        radii = lln_certificates(logits, logits.argmax(1), model.last_layer, 1 / torch.max(std))
        torch.save(model.state_dict(), BRONET_OUT / f"{case}.pt")
        record = {"source": "github.com/ntuaislab/BRONet", "commit": COMMITS["bronet-lipconvnet"],
                  "importer": "bronet-lipconvnet", "lipconvnet_args": kwargs, "id_init": identity,
                  "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist(),
                  "source_radii": radii.tolist()}
        (BRONET_OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers")


def main() -> None:
    which, src = sys.argv[1], Path(sys.argv[2])
    OUT.mkdir(parents=True, exist_ok=True)
    {"improved-l2": _improved_l2, "sll": _sll, "bronet-lipconvnet": _bronet_lipconvnet}[which](src)


if __name__ == "__main__":
    main()
