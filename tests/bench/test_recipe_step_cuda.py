"""The recipe's training step on CUDA (``cuda`` marker; skipped without a GPU): a LipConvnet-5
trains (finite, moving losses) and a whole step runs without any GPU→host synchronisation
(the SOC layers once synchronised twice per step)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from lipcli.bench import RecipeStep, build_model, synthetic_batch


def check_trains(device: torch.device) -> tuple[RecipeStep, torch.Generator]:
    model = build_model("lipconvnet-5", conv="soc-fast", width=32, seed=0).to(device)
    step = RecipeStep(model)
    gen = torch.Generator().manual_seed(0)
    losses = [float(step(*synthetic_batch(128, 10, gen, device))) for _ in range(5)]
    assert all(math.isfinite(v) for v in losses), losses
    assert len(set(losses)) > 1, f"the loss does not move: {losses}"
    return step, gen


@pytest.mark.cuda
def test_lipconvnet5_trains_without_host_synchronisation():
    device = torch.device("cuda")
    step, gen = check_trains(device)
    batch = synthetic_batch(128, 10, gen, device)  # host->device copies: outside the check
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(*batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the first warning only announces that the detector is a prototype
    syncs = [str(w.message).splitlines()[0] for w in caught if "prototype" not in str(w.message)]
    assert not syncs, "; ".join(syncs[:3])
