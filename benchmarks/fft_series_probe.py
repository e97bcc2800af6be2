"""Would an FFT form of SOC's eval series be faster than the direct convolutions on this machine?

A probe, not part of lipcli: the 15-term Horner series ``u <- x + conv(u, S)/i`` (zero "same"
padding, 3x3 filter, float32, batch 256) on the literal shapes of LipConvnet-20, once with
``F.conv2d`` (contiguous and channels-last) and once in the Fourier domain: every step pads
``u`` to ``N x N`` (``N >= H + 1``: the circular wrap only meets padding), ``rfft2``, one complex
``C x C`` product per frequency, ``irfft2``, crop, add.  Prints one line per shape: the relative
difference of the two results and the best of 3 timings of each.  Used by docs/benchmarks.md
("Certification")::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/fft_series_probe.py > docs/data/cpu-fft-series-probe.txt
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

TERMS = 15
BATCH = 256
#: (channels, image side): LipConvnet-20's literal layers at widths 16 and 32 (after unshuffle)
SHAPES = [(16, 32), (32, 32), (64, 16), (128, 16), (128, 8), (256, 8)]


def direct(x: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    u = x
    for i in range(TERMS - 1, 0, -1):
        u = torch.add(x, F.conv2d(u, S, padding=1), alpha=1.0 / i)
    return u


def fourier_filter(S: torch.Tensor, n: int) -> torch.Tensor:
    """``(frequencies, C_in, C_out)``: the filter's transform on an ``n x n`` circle, laid out
    so that cross-correlation with ``S`` is a product per frequency."""
    C, k = S.shape[0], S.shape[-1]
    p = k // 2
    G = S.new_zeros(C, C, n, n)
    for a in range(k):
        for b in range(k):
            G[:, :, (p - a) % n, (p - b) % n] += S[:, :, a, b]
    return torch.fft.rfft2(G).permute(2, 3, 1, 0).reshape(-1, C, C).contiguous()


def fourier(x: torch.Tensor, Sh: torch.Tensor, n: int) -> torch.Tensor:
    B, C, H, W = x.shape
    u = x
    for i in range(TERMS - 1, 0, -1):
        Uh = torch.fft.rfft2(F.pad(u, (0, n - W, 0, n - H))).permute(2, 3, 0, 1).reshape(-1, B, C)
        Yh = torch.bmm(Uh, Sh).reshape(n, n // 2 + 1, B, C).permute(2, 3, 0, 1)
        u = torch.add(x, torch.fft.irfft2(Yh, s=(n, n))[:, :, :H, :W], alpha=1.0 / i)
    return u


def best_of(fn, repeats: int = 3) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@torch.no_grad()
def main() -> None:
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}, {TERMS} terms")
    for C, H in SHAPES:
        W0 = torch.randn(C, C, 3, 3, generator=gen) / math.sqrt(9 * C)
        S = (W0 - W0.transpose(0, 1).flip(2, 3)) / 2
        x = torch.rand(BATCH, C, H, H, generator=gen)
        xl = x.contiguous(memory_format=torch.channels_last)
        t_direct = min(best_of(lambda: direct(x, S)), best_of(lambda: direct(xl, S)))
        ref = direct(x, S)
        cells = []
        for n in (H + 1, H + 2):
            Sh = fourier_filter(S, n)
            err = float((fourier(x, Sh, n) - ref).norm() / ref.norm())
            t_fft = best_of(lambda: fourier(x, Sh, n))
            cells.append(f"N={n}: {t_fft * 1e3:.0f} ms ({t_fft / t_direct:.2f}x, rel. diff {err:.1e})")
        print(f"C={C:3d} {H}x{H}: direct {t_direct * 1e3:.0f} ms; fft " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
