"""Make the ``lip import --from liresnet`` test fixtures by running the LiResNet authors' code,
unmodified (github.com/hukkai/liresnet).

Usage (development time only; the test suite never runs this or fetches anything)::

    git -C <mirror of hukkai/liresnet> archive 0c0611a7fae0 | tar -x -C /tmp/liresnet
    .venv/bin/python tools/make_import_fixtures_liresnet.py /tmp/liresnet     # torch only

For each case it builds the authors' ``GloroNet`` (``models/model.py``) at a tiny size, runs a
few training steps on random images as ``train.py`` does (``model.train()``,
``sub_lipschitz()`` with ``num_lc_iter`` power steps, ``emma_loss``, gradient clipping at 3,
NAdam), then what ``train.py`` does at the end of an evaluated epoch: ``model.eval()``,
``set_num_lc_iter(500)``, ``sub_lipschitz()`` (their certificate's constant, a power-iteration
estimate), ``torch.save`` of the checkpoint dictionary (``backbone``, ``optimizer``,
``start_epoch``, ``current_iter``, ``training_logs``, ``configs``), and their evaluation of the
saved checkpoint: ``sub_lipschitz()`` again (its power vectors continue from the saved ones, as
after ``load_state_dict``; the epoch's own value is recorded too) and ``trades_loss`` on fixed
inputs.  Written to plugins/lipcli-liresnet/tests/data/: ``<case>.pth`` and
``<case>.logits.json`` (inputs are ``torch.rand`` with the recorded seed; the authors' eval
logits, their ``sub_lipschitz`` and, per input, the radius their rule certifies the predicted
class at: the smallest ``(y_p − y_i) / (lc·‖ŵ_p − ŵ_i‖)``, checked against their
``trades_loss`` decision at half and twice that radius).

Shims, outside the authors' code: ``GloroNet`` hard-codes a 2048-wide neck and 8 dense layers
(``out_dim = 2048``, ``LiResMLP(depth=8)``), too large for test data, so after building it the
fixture replaces ``neck``, ``linear`` and ``head`` by the authors' own ``Map2Vec``, ``LiResMLP``
and ``head`` classes at the case's width (their forward is unchanged); the optimizer is plain
NAdam (``train.py`` wraps it in ``timm.optim.Lookahead``, which only changes the training
trajectory, not what is saved for the model); no data parallelism (the saved ``backbone`` is
``model.module.state_dict()``, the unwrapped model, as here).  Everything runs on the CPU in
float32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_import_fixtures import INPUT_SEED, NUM_INPUTS, fixed_inputs  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "plugins" / "lipcli-liresnet" / "tests" / "data"
SOURCE = "github.com/hukkai/liresnet"
#: the source commit the fixtures were made with (the archive given on the command line)
COMMIT = "0c0611a7fae0b299d671b7ccb3cd6aef703bf3d6"
#: case -> the authors' model config (``GloroNet`` arguments) and the neck/dense sizes of the shim
CASES = {
    "liresnet_cifar10_d2_w4": (dict(depth=2, width=4, input_size=32, num_classes=10, num_lc_iter=10,
                                    act_name="MinMax", use_lln=True), dict(out_dim=16, dense_depth=2)),
    "liresnet_cifar100_d3_w6": (dict(depth=3, width=6, input_size=32, num_classes=100, num_lc_iter=10,
                                     act_name="MinMax", use_lln=True), dict(out_dim=12, dense_depth=1)),
}
#: the authors' CIFAR-10 radius (``configs/cifar10.yaml``, ``gloro.eps``) and first-epoch factor
EPS, MIN_EPS = 0.1411764705882353, 0.1
STEPS = 4


def _build(models, cfg: dict, shim: dict) -> torch.nn.Module:
    from models.blocks import LiResMLP
    from models.model import Map2Vec, head

    model = models.GloroNet(**cfg)
    act = model.neck.activation  # the authors' shared activation module
    model.neck = Map2Vec(feat_dim=cfg["width"], feat_size=16, out_dim=shim["out_dim"], activation=act)
    model.linear = LiResMLP(num_features=shim["out_dim"], depth=shim["dense_depth"], activation=act)
    model.head = head(shim["out_dim"], cfg["num_classes"], cfg["use_lln"])
    model.set_num_lc_iter()
    return model


def _train(models, model: torch.nn.Module, classes: int) -> torch.optim.Optimizer:
    """``train.py``'s inner loop, ``STEPS`` times on random images."""
    opt = torch.optim.NAdam(model.parameters(), lr=0.01, weight_decay=0.0)
    gen = torch.Generator().manual_seed(7)
    model.train()
    for _ in range(STEPS):
        x = torch.rand(8, 3, 32, 32, generator=gen)
        y = torch.randint(0, classes, (8,), generator=gen)
        opt.zero_grad(set_to_none=True)
        lc = model.sub_lipschitz()
        _y, _y_, loss = models.emma_loss(model, x=x, label=y, lc=lc, eps=EPS * MIN_EPS, return_loss=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 3)
        opt.step()
    return opt


def _radii(model: torch.nn.Module, logits: torch.Tensor, lc: float) -> torch.Tensor:
    """The radius at which the authors' rule (``trades_loss``: ``y_i + lc·eps·‖ŵ_p − ŵ_i‖``
    against ``y_p``) stops certifying the predicted class ``p``."""
    w = model.head.get_weight()
    pred = logits.argmax(1)
    dist = (w[pred][:, None, :] - w[None, :, :]).norm(dim=-1)
    ratio = (logits.gather(1, pred[:, None]) - logits) / (lc * dist.clamp_min(1e-30))
    ratio[torch.arange(len(pred)), pred] = float("inf")
    return ratio.min(1).values


def main() -> None:
    src = Path(sys.argv[1])
    sys.path.insert(0, str(src))
    import models  # the authors' package

    OUT.mkdir(parents=True, exist_ok=True)
    for case, (cfg, shim) in CASES.items():
        torch.manual_seed(0)
        model = _build(models, cfg, shim)
        opt = _train(models, model, cfg["num_classes"])
        model.eval()
        model.set_num_lc_iter(500)  # train.py: "let the power method converge"
        lc_epoch = model.sub_lipschitz().item()  # what the epoch's evaluation reports
        config = {"model": {**cfg, "neck_out_dim": shim["out_dim"], "dense_depth": shim["dense_depth"]},
                  "training": {"nadam": True, "lookahead": False, "grad_clip_val": 3, "lr": 0.01},
                  "gloro": {"eps": EPS, "min_eps": MIN_EPS, "loss_type": "emma_loss"}}
        state = dict(backbone=model.state_dict(), optimizer=opt.state_dict(), start_epoch=1,
                     current_iter=STEPS, training_logs=[f"{STEPS} steps on random images"], configs=config)
        torch.save(state, OUT / f"{case}.pth")
        # the saved checkpoint evaluated by the authors' code (their power vectors continue from
        # the saved ones, as after load_state_dict): its certificate
        lc = model.sub_lipschitz().item()
        x = fixed_inputs()
        with torch.no_grad():
            logits, _y_, _ = models.trades_loss(model, x=x, label=torch.zeros(len(x), dtype=torch.long),
                                                eps=EPS, lc=lc, return_loss=False)
            radii = _radii(model, logits, lc)
            for factor, want in ((0.5, True), (2.0, False)):  # the authors' own decision agrees
                for i in range(len(x)):
                    if radii[i] <= 0:
                        continue
                    _y, y_, _ = models.trades_loss(model, x=x[i:i + 1], label=logits[i:i + 1].argmax(1),
                                                   eps=float(radii[i]) * factor, lc=lc, return_loss=False)
                    assert bool(y_.argmax(1).eq(logits[i:i + 1].argmax(1)).item()) == want, (case, i, factor)
        record = {"source": SOURCE, "commit": COMMIT, "importer": "liresnet", "config": config,
                  "input_seed": INPUT_SEED, "inputs": [NUM_INPUTS, 3, 32, 32], "logits": logits.tolist(),
                  "source_lipschitz": lc, "source_lipschitz_epoch": lc_epoch, "num_lc_iter": 500, "source_radii": radii.tolist()}
        (OUT / f"{case}.logits.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {case}: {sum(t.numel() for t in model.state_dict().values())} numbers, lc={lc:.6g}")


if __name__ == "__main__":
    main()
