#!/usr/bin/env bash
# GPU checks and benchmarks for a lent GPU machine (recorded in docs/benchmarks.md).
# Usage (repository root, torch with CUDA installed): OUT=dir bash benchmarks/device_bench.sh
# Runs from the working tree (PYTHONPATH), no installation; each step has its own time limit.
set -u
FINAL=${OUT:-device-out}   # receives one archive, device-bench.tgz (the device tool returns at most 8 files)
OUT=$(mktemp -d)
trap 'tar czf "$FINAL/device-bench.tgz" -C "$OUT" . ; ls -l "$FINAL"' EXIT
mkdir -p "$FINAL"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
LIP="python3 -m lipcli"
{ git rev-parse HEAD 2>/dev/null || echo "no git"; git status --short 2>/dev/null | head; nvidia-smi -L;
  python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
echo "== cuda smoke (skipped with SKIP_SMOKE=1)"; [ -n "${SKIP_SMOKE:-}" ] || { timeout 90 python3 benchmarks/cuda_smoke.py > "$OUT/cuda-smoke.txt" 2>&1; tail -22 "$OUT/cuda-smoke.txt"; }
echo "== table 1"; timeout 150 $LIP bench train --device cuda --archs 5,10,15,20,25,30,35,40 \
    --steps 10 --warmup 3 -o "$OUT/gpu-table1.json" > "$OUT/gpu-table1.txt" 2> "$OUT/gpu-table1.err"; tail -16 "$OUT/gpu-table1.txt"; tail -3 "$OUT/gpu-table1.err"
echo "== profile"; timeout 60 $LIP bench profile --arch 20 --device cuda --steps 3 \
    -o "$OUT/gpu-profile-lipconvnet20.json" > "$OUT/gpu-profile-lipconvnet20.txt" 2>&1; grep -E "^│ conv|share|Step|step" "$OUT/gpu-profile-lipconvnet20.txt" | head -8
echo "== certify bench"; timeout 60 $LIP bench certify --arch 20 --device cuda \
    -o "$OUT/gpu-certify-lipconvnet20-lln.json" > "$OUT/gpu-certify.txt" 2>&1; tail -12 "$OUT/gpu-certify.txt"
echo "== digits quick start on cuda (train + certify + PGD check)"; mkdir -p "$OUT/q"
( timeout 80 $LIP train --dataset digits --arch lipconvnet-5 --width 8 --epochs 30 --device cuda \
    --out "$OUT/q/model.safetensors" -q --json > "$OUT/q/train.json" \
  && timeout 50 $LIP certify "$OUT/q/model.safetensors" --radii 36,72,108 --device cuda \
    --attack --attack-steps 50 --attack-restarts 1 > "$OUT/digits-cuda-certify.txt" ) > "$OUT/digits-cuda.log" 2>&1
tail -5 "$OUT/digits-cuda.log"; tail -25 "$OUT/digits-cuda-certify.txt"; rm -rf "$OUT/q"
echo "== table 1, batch 512"; timeout 90 $LIP bench train --device cuda --archs 5,20,40 --batch-size 512 \
    --steps 5 --warmup 2 -o "$OUT/gpu-table1-b512.json" > "$OUT/gpu-table1-b512.txt" 2>&1; tail -10 "$OUT/gpu-table1-b512.txt"
