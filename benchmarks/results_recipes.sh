#!/usr/bin/env bash
# Reproduces the "recipes" figures in docs/results.md: the digits data at the quick-start
# budget (LipConvnet-5, width 8, 30 epochs) with (a) the default recipe, (b) digits upscaled
# to 64x64 through imagefolder:size=64, (c) the margin-offset loss, (d) extra data at ratio
# 0.5.  Every model is certified at 36/72/108 and checked with l2 PGD (50 steps; ATTACK_STEPS=N
# for fewer); a finished step (its output file) is skipped.
# Usage: bash benchmarks/results_recipes.sh [OUTDIR]   (default runs/recipes); ONLY=name for one.
set -euo pipefail
# idle OpenMP threads sleep instead of spinning: the same work split (the quick start's model
# is unchanged), but 2-thread epochs took 4 s instead of 15-40 s beside another busy process
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OUT=${1:-runs/recipes}
LIP=${LIP:-.venv/bin/lip}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
[ -d "$OUT/digits64" ] || "$PY" benchmarks/digits_variants.py imagefolder "$OUT/digits64" --size 64
[ -f "$OUT/digits-extra.npz" ] || "$PY" benchmarks/digits_variants.py extra "$OUT/digits-extra.npz" --copies 4 --seed 0
run() {  # name, then lip train options
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then return; fi
  local start=$(date +%s)
  [ -f "$OUT/$name.safetensors" ] || "$LIP" train --arch lipconvnet-5 --width 8 --epochs 30 "$@" \
    --out "$OUT/$name.safetensors" -q --json > "$OUT/$name.train.json"
  echo "$name: lip train took $(($(date +%s) - start)) s" | tee -a "$OUT/times.txt"
  start=$(date +%s)
  [ -f "$OUT/$name.certify.json" ] || "$LIP" certify "$OUT/$name.safetensors" --radii 36,72,108 \
    --attack --attack-steps "${ATTACK_STEPS:-50}" --attack-restarts 1 --json -q > "$OUT/$name.certify.json"
  echo "$name: lip certify --attack (${ATTACK_STEPS:-50} steps) took $(($(date +%s) - start)) s" | tee -a "$OUT/times.txt"
}
run default --dataset digits
run digits64 --dataset imagefolder:size=64,stats=data --data-dir "$OUT/digits64"
run margin-offset --dataset digits --loss margin-offset
run extra-0.5 --dataset digits --extra-data "$OUT/digits-extra.npz" --extra-ratio 0.5
"$PY" benchmarks/results_table.py "$OUT"
