"""The whole-network rows of ``compare_authors.py --soc-networks``: the SOC paper's LipConvNet
(``lip_convnets.LipConvNet`` of github.com/singlasahil14/improved_l2_robustness, imported
unmodified) against ``lipcli.create_model("lipconvnet-N")`` with the same weights, timed as a
full training step: forward, cross-entropy loss, backward and an SGD step.

Both networks are the paper's: SOC with the fast gradient (``fast_train=True`` / ``soc-fast``),
MaxMin, the pairwise max pool, the LLN head (``last_name="lln"`` / ``head="lln"``), CIFAR's
mean and std.  The authors' state dict is mapped by lipcli's own ``improved-l2`` importer
(:class:`lipcli.builtins.lipconvnet.importer.ImprovedL2Importer`: weights, biases, the power
vectors of the four reshapes, the head), so both start from identical parameters and power
vectors.  The optimiser is ``torch.optim.SGD`` (the authors' ``lr`` schedule start 0.1 is
scaled down to 0.01 so that many timed steps on random data stay finite; momentum 0.9, weight
decay 5e-4 on every parameter) on both sides.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

def authors_network(cls: type, depth: int, width: int, num_classes: int = 10) -> nn.Module:
    """The authors' ``LipConvNet`` as their ``train_robust.py`` builds it (SOC fast, MaxMin, max
    pool, LLN head), its 50 construction power steps run (``update_sigma``)."""
    net = cls("soc", "maxmin", "max", "lln", init_channels=width, block_size=depth // 5,
              num_classes=num_classes, fast_train=True)
    net.update_sigma()
    return net


def lipcli_network(theirs: nn.Module, depth: int, width: int, num_classes: int = 10) -> nn.Module:
    """``lipcli.create_model("lipconvnet-<depth>")`` with the paper's components, loaded with the
    authors' parameters and power vectors through the ``improved-l2`` importer's mapping."""
    from lipcli.builtins.lipconvnet.importer import ImprovedL2Importer
    from lipcli.host.models import create_model

    tensors = {k: v.detach() for k, v in theirs.state_dict().items()}
    importer = ImprovedL2Importer()
    plan = importer.plan(tensors, f"lipconvnet-{depth}")
    ours = create_model(f"lipconvnet-{depth}", conv="soc-fast", activation="maxmin", pool="max",
                        head="lln", num_classes=num_classes, width=width,
                        mean=tuple(plan.model["mean"]), std=tuple(plan.model["std"]))
    ours = ours.to(tensors["init_layer.ortho.weight"].dtype)
    state = importer.convert(tensors, plan)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith(("mean", "std")) for k in missing):
        raise RuntimeError(f"mapping mismatch: missing {missing}, unexpected {unexpected}")
    return ours


def network_agreement(theirs: nn.Module, ours: nn.Module, x: Tensor) -> float:
    """``max |lipcli − authors| / max |authors|`` of the logits in train and eval mode, on
    copies, without power steps (``update_iters=0`` / ``power_iters=0``: both take σ from the
    same vectors; one step from them differs by the order in which the two codes update the
    left and right vectors, as for the single layers)."""
    import copy

    worst = 0.0
    for mode in (True, False):
        a, b = copy.deepcopy(theirs).train(mode), copy.deepcopy(ours).train(mode)
        for m in a.modules():
            if hasattr(m, "update_iters"):
                m.update_iters = 0
        for m in b.modules():
            if hasattr(m, "power_iters"):
                m.power_iters = 0
        with torch.no_grad():
            ya, yb = a(x), b(x)
        worst = max(worst, float((yb - ya).abs().max() / ya.abs().max().clamp_min(1e-300)))
    return worst


def training_step(model: nn.Module, x: Tensor, y: Tensor,
                  forward: Callable[[Tensor], Tensor] | None = None) -> Callable[[], None]:
    """One SGD training step of ``model`` on ``(x, y)`` (forward, cross-entropy, backward, step);
    ``forward``: the model's forward compiled (default: the model)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    model.train()
    run = forward or model

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(run(x), y).backward()
        opt.step()

    return step


def network_pair(cls: type, depth: int, width: int, batch: int, seed: int,
                 dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module, Tensor, Tensor]:
    """``(authors, lipcli, x, y)``: both networks with the same parameters, CIFAR-shaped inputs
    in ``[0, 1]`` and labels, from ``seed``."""
    torch.manual_seed(seed)
    theirs = authors_network(cls, depth, width).to(dtype)
    ours = lipcli_network(theirs, depth, width)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, 3, 32, 32, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return theirs, ours, x, y
