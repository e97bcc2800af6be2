#!/usr/bin/env bash
# Every installed convolution in the comparison study's network (recipe layers-compared) on digits at one
# wall-clock budget per run (--time-budget BUDGET: the step is timed first and fixes the epochs, as the study
# did), one thread per run, two runs side by side; then `lip certify --attack` (10-step l2 PGD, 1 restart) on
# all 360 test images.  Width and batch size are scaled for a CPU (the recipe's are 16 and 256).
# usage: benchmarks/layers_compared_digits.sh OUTDIR [BUDGET=120s] [SEEDS="0 1 2"] [CONVS=every installed]
# table: python benchmarks/results_seeds.py OUTDIR --epochs --raw RAW.json
set -u
O=${1:?OUTDIR}; B=${2:-120s}; SEEDS=${3:-0 1 2}
L=${LIP:-lip}; WIDTH=${WIDTH:-8}; BATCH=${BATCH:-32}
CONVS=${4:-$($L plugins --json | python -c 'import json,sys; print(" ".join(c["name"] for c in json.load(sys.stdin)["components"]["convolutions"]))')}
mkdir -p "$O"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
one() { # conv seed
  n=$1-s$2
  $L train --dataset digits --recipe layers-compared --conv "$1" --width "$WIDTH" --batch-size "$BATCH" \
    --time-budget "$B" --seed "$2" --out "$O/$n.safetensors" --overwrite --json > "$O/$n.train.json" 2> "$O/$n.train.err" &&
  $L certify "$O/$n.safetensors" --radii 36,72,108 --attack --attack-steps 10 --attack-restarts 1 --json \
    > "$O/$n.certify.json" 2> "$O/$n.certify.err"
  echo "$n: rc $?" >> "$O/times.txt"
}
jobs=()
for s in $SEEDS; do for c in $CONVS; do jobs+=("$c $s"); done; done
i=0
for j in "${jobs[@]}"; do
  one $j &
  i=$((i + 1))
  if (( i % 2 == 0 )); then wait; fi
done
wait
