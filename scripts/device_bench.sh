#!/usr/bin/env bash
# GPU checks and benchmarks for a lent GPU machine (recorded in docs/benchmarks.md).
# Usage (repository root, torch with CUDA installed): OUT=dir bash scripts/device_bench.sh
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
LIP="python3 -m lipcli"
{ git rev-parse HEAD 2>/dev/null || echo "no git"; git status --short 2>/dev/null | head; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
echo "== cuda smoke (skipped with SKIP_SMOKE=1)"; [ -n "${SKIP_SMOKE:-}" ] || { timeout 120 python3 scripts/cuda_smoke.py 2>&1 | tee "$OUT/cuda-smoke.txt" | tail -20; }
echo "== table 1"; timeout 240 $LIP bench train --device cuda --archs 5,10,15,20,25,30,35,40 \
    --steps 10 --warmup 3 -o "$OUT/gpu-table1.json" > "$OUT/gpu-table1.txt" 2> "$OUT/gpu-table1.err"; tail -30 "$OUT/gpu-table1.txt"
echo "== profile"; timeout 120 $LIP bench profile --arch 20 --device cuda --steps 3 \
    -o "$OUT/gpu-profile-lipconvnet20.json" > "$OUT/gpu-profile-lipconvnet20.txt" 2>&1; head -40 "$OUT/gpu-profile-lipconvnet20.txt"
echo "== table 1, batch 512"; timeout 150 $LIP bench train --device cuda --archs 5,20,40 --batch-size 512 \
    --steps 5 --warmup 2 -o "$OUT/gpu-table1-b512.json" > "$OUT/gpu-table1-b512.txt" 2>&1; tail -20 "$OUT/gpu-table1-b512.txt"
