"""GPU check of the polygon pool: CUDA == CPU (float64), and the cost against the built-in pools.

Run from the lipcli repository root on a CUDA machine::

    PYTHONPATH=.:plugins/lipcli-polygon-pool/src python3 plugins/lipcli-polygon-pool/benchmarks/gpu_check.py

Prints one JSON line per measurement.
"""

from __future__ import annotations

import json
import time

import torch

from lipcli.builtins.pooling import ChannelMaxPool, ProjectionPool
from lipcli_polygon_pool.polygon import PolygonPool, inverse_softplus


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def cuda_matches_cpu() -> None:
    torch.manual_seed(0)
    pool = PolygonPool(32, vertices=7).double()
    with torch.no_grad():
        pool.rho.copy_(inverse_softplus(torch.exp(torch.rand(16, 7, dtype=torch.float64) * 3 - 1.5)))
        pool.center.copy_(torch.randn(16, 2, dtype=torch.float64) * 0.5)
    z = torch.randn(8, 32, 6, 6, dtype=torch.float64) * 2
    results = {}
    for dev in ("cpu", "cuda"):
        p = PolygonPool(32, vertices=7).double().to(dev)
        p.load_state_dict(pool.state_dict())
        zz = z.detach().to(dev).clone().requires_grad_(True)
        out = p(zz)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=dev).view_as(out)).sum().backward()
        results[dev] = (out.detach().cpu(), zz.grad.cpu(), p.rho.grad.cpu(), p.center.grad.cpu())
    diffs = [float((a - b).abs().max()) for a, b in zip(results["cpu"], results["cuda"])]
    emit(check="cuda_vs_cpu_float64", max_abs_diff=max(diffs), ok=max(diffs) < 1e-10)
    grad_norm = torch.hypot(results["cuda"][1][:, :16], results["cuda"][1][:, 16:])
    emit(check="cuda_input_grad_norm_le_1", max=float(grad_norm.max()), ok=float(grad_norm.max()) <= 1 + 1e-12)


def timed(module: torch.nn.Module, z: torch.Tensor, reps: int = 20) -> tuple[float, float]:
    """(ms per forward+backward, peak MiB above the input)."""
    z = z.detach().requires_grad_(True)
    for _ in range(3):
        module(z).square().mean().backward()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(reps):
        module(z).square().mean().backward()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / reps * 1e3
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20


def pool_costs() -> None:
    # LipConvnet (width 32, batch 128) pool inputs: 4C channels at the block's output size
    shapes = [(128, 128, 16, 16), (128, 256, 8, 8), (128, 512, 4, 4), (128, 1024, 2, 2)]
    for shape in shapes:
        z = torch.randn(*shape, device="cuda")
        c = shape[1]
        pools = {
            "max": ChannelMaxPool(c),
            "projection": ProjectionPool(c),
            "polygon-6": PolygonPool(c, vertices=6),
            "polygon-16": PolygonPool(c, vertices=16),
        }
        for name, module in pools.items():
            ms, mib = timed(module.cuda(), z)
            emit(check="pool_cost", shape=list(shape), pool=name, ms_fwd_bwd=round(ms, 3),
                 peak_mib=round(mib, 1))


def model_step_costs() -> None:
    import lipcli_polygon_pool.plugin as plugin
    from lipcli.host.models import create_model
    from lipcli.host.plugins import create_host

    reg = create_host(autoload=False, extra=[("polygon", plugin)]).registry()
    x = torch.rand(128, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (128,), device="cuda")
    for pool in ("max", "projection", "polygon", "polygon:vertices=16"):
        torch.manual_seed(0)
        model = create_model("lipconvnet-5", pool=pool, registry=reg).cuda().train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        emit(check="lipconvnet5_train_step", pool=pool,
             ms=round((time.perf_counter() - start) / 10 * 1e3, 2))


if __name__ == "__main__":
    emit(device=torch.cuda.get_device_name(), torch=torch.__version__)
    cuda_matches_cpu()
    pool_costs()
    try:
        model_step_costs()
    except Exception as exc:  # noqa: BLE001 - report, keep the other numbers
        emit(check="lipconvnet5_train_step", error=f"{type(exc).__name__}: {exc}")
