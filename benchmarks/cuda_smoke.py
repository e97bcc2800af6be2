"""CUDA correctness smoke test (run on a GPU machine; the test suite itself is CPU-only).

Checks on the GPU what the CPU tests check on the CPU: ``soc-fast`` and ``soc`` give
bit-identical forwards and matching gradients, MaxMin/max-pool gradients route exactly,
a LipConvnet-5 trains a few steps, and certification runs without TF32.
Prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import os
import sys

import torch

from lipcli.bench import RecipeStep, build_model, synthetic_batch
from lipcli.builtins.activations import max_min
from lipcli.builtins.pooling import ChannelMaxPool
from lipcli.builtins.soc.layer import SOC
from lipcli.numerics.precision import full_float32_precision, tf32_state


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        sys.exit(1)


def main() -> None:
    dev = torch.device(os.environ.get("SMOKE_DEVICE", "cuda"))  # cpu: dry run of this script
    if dev.type == "cuda":
        print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    for c_in, c_out, k, s, hw in [(32, 32, 3, 1, 32), (64, 256, 3, 2, 16), (256, 1024, 3, 2, 4),
                                  (512, 2048, 1, 2, 2), (2048, 2048, 1, 1, 1)]:
        torch.manual_seed(0)
        fast = SOC(c_in, c_out, k, s, fast_grad=True).to(dev)
        exact = SOC(c_in, c_out, k, s, fast_grad=False).to(dev)
        exact.load_state_dict(fast.state_dict())
        x = torch.randn(16, c_in, hw, hw, device=dev)
        g = torch.randn(16, c_out, hw // s, hw // s, device=dev)
        with full_float32_precision():
            outs = []
            for layer in (fast, exact):
                xr = x.clone().requires_grad_(True)
                z = layer(xr)
                (z * g).sum().backward()
                outs.append((z.detach(), xr.grad, layer.weight.grad))
        (zf, gxf, gwf), (ze, gxe, gwe) = outs
        cos = torch.nn.functional.cosine_similarity(gwf.double().flatten(), gwe.double().flatten(), dim=0).item()
        check(f"SOC {c_in}->{c_out} k{k} s{s} {hw}x{hw}: forward bit-identical", torch.equal(zf, ze))
        err = ((gxf - gxe).norm() / gxe.norm()).item()
        check("   input gradient equal (rel. error)", err < 1e-5, f"{err:.2e}")
        check("   filter gradient cosine fast/exact", cos > 0.99, f"{cos:.6f}")
    z = torch.randn(32, 64, 8, 8, device=dev).contiguous(memory_format=torch.channels_last)
    for layer in (max_min, ChannelMaxPool(64)):
        zr = z.clone().requires_grad_(True)
        out = layer(zr)
        gout = torch.randn_like(out)
        (got,) = torch.autograd.grad(out, zr, gout)
        zz = z.clone().requires_grad_(True)
        a, b = zz[:, :32], zz[:, 32:]
        ref = torch.where(a >= b, a, b)
        if layer is max_min:
            ref = torch.cat((ref, torch.where(a >= b, b, a)), 1)
        (want,) = torch.autograd.grad(ref, zz, gout)
        check(f"{getattr(layer, '__name__', type(layer).__name__)} gradient routing exact",
              torch.equal(got, want) and torch.equal(out, ref.detach()))
    model = build_model("lipconvnet-5", conv="soc-fast", width=32, seed=0).to(dev)
    step = RecipeStep(model)
    gen = torch.Generator().manual_seed(0)
    losses = [float(step(*synthetic_batch(128, 10, gen, dev))) for _ in range(5)]
    check("LipConvnet-5 trains on CUDA (finite losses)", all(map(lambda v: v == v, losses)),
          " ".join(f"{v:.3f}" for v in losses))
    if dev.type == "cuda":  # a training step should not wait for the GPU
        import warnings

        batch = synthetic_batch(128, 10, gen, dev)  # host→device copies: outside the check
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step(*batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # the first warning only announces that the detector is a prototype
        caught = [w for w in caught if "prototype" not in str(w.message)]
        syncs = [str(w.message).splitlines()[0] for w in caught]
        check("training step without GPU->host synchronisation", not syncs, "; ".join(syncs[:3]))
    before = tf32_state()
    with full_float32_precision():
        inside = tf32_state()
    check("TF32 off inside certification context", inside != before or "tf32" not in before,
          f"{before} -> {inside}")


if __name__ == "__main__":
    main()
