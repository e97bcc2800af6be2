#!/usr/bin/env bash
# Reproduces the digits figures in docs/results.md (embedded offline data set, CPU).
# Usage: bash benchmarks/results_digits.sh [OUTDIR]   (default runs/results)
# Each run: lip train (recipe defaults except the settings shown) then lip certify; the quick
# start's certificates are checked by l2 PGD on all 360 test images (50 steps, 1 restart), the
# other rows' too with CERTIFY_EXTRA="--attack --attack-steps 50 --attack-restarts 1".
# Set ONLY=name to run one of them; a finished step (its output file) is skipped.
set -euo pipefail
# idle OpenMP threads sleep instead of spinning: the same work split (the quick start's model
# is unchanged), but 2-thread epochs took 4 s instead of 15-40 s beside another busy process
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OUT=${1:-runs/results}
LIP=${LIP:-.venv/bin/lip}
PY=${PY:-.venv/bin/python}
ATTACK="--attack --attack-steps 50 --attack-restarts 1"
mkdir -p "$OUT"
run() {  # name, then lip train options
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then return; fi
  local start=$(date +%s)
  [ -f "$OUT/$name.safetensors" ] || "$LIP" train --dataset digits --arch lipconvnet-5 "$@" --out "$OUT/$name.safetensors" -q --json \
    > "$OUT/$name.train.json"
  local end=$(date +%s)
  echo "$name: lip train took $((end - start)) s" | tee -a "$OUT/times.txt"
  start=$(date +%s)
  [ -f "$OUT/$name.certify.json" ] || "$LIP" certify "$OUT/$name.safetensors" --radii 36,72,108 \
    $CERTIFY_EXTRA --json --per-sample "$OUT/$name.per-sample.csv" -q > "$OUT/$name.certify.json"
  echo "$name: lip certify $CERTIFY_EXTRA took $(($(date +%s) - start)) s" | tee -a "$OUT/times.txt"
}
# 1. the README quick start, its certificates checked by l2 PGD
CERTIFY_EXTRA="$ATTACK" run quickstart --width 8 --epochs 30
CERTIFY_EXTRA=${CERTIFY_EXTRA:-}
# 2. the CRC-Lip head (MLP, hidden 1024) with projection pooling, same budget
run mlp-projection --width 8 --epochs 30 --head mlp:hidden=1024 --pool projection
# 3. pooling side by side with the LLN head (max pooling is the quick start run itself)
run pool-projection --width 8 --epochs 30 --pool projection
# the third-party plugin, installed beside (not into) the environment
"$PY" -m pip install -q --upgrade --no-deps --target "$OUT/polygon-site" ./plugins/lipcli-polygon-pool
# the in-tree build leaves an egg-info under src/, which would make the plugin discoverable
# whenever src/ is on sys.path (as in the test suite): remove it
rm -rf plugins/lipcli-polygon-pool/build plugins/lipcli-polygon-pool/src/*.egg-info
PYTHONPATH="$OUT/polygon-site${PYTHONPATH:+:$PYTHONPATH}" run pool-polygon --width 8 --epochs 30 --pool polygon
"$PY" benchmarks/results_table.py "$OUT"
