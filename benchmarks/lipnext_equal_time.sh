#!/usr/bin/env bash
# lipnext (its recipe, depth 8, width 64), liresnet@3 (its recipe, the authors' layer types, width 16, dense
# width 256) and LipConvnet-5 (width 8, lipcli's defaults) on digits at one wall-clock budget: each run trains
# with --time-budget BUDGET on one thread (the three configs side by side on the two cores, one seed at a
# time; the recipes' warm-up keeps its 20/800 share of the planned epochs), then `lip certify --attack`
# (10-step l2 PGD, 1 restart) on all 360 test images.
# usage: benchmarks/lipnext_equal_time.sh OUTDIR [BUDGET=90s] [SEEDS="0 1 2"]
# table: python benchmarks/lipnext_equal_time_table.py OUTDIR RAW.json
set -u
O=${1:?OUTDIR}; B=${2:-90s}; SEEDS=${3:-0 1 2}
L=${LIP:-lip}
mkdir -p "$O"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
one() { # name seed args...
  n=$1; s=$2; shift 2
  $L train --dataset digits "$@" --time-budget "$B" --seed "$s" --out "$O/$n-$s.safetensors" --overwrite --json \
    > "$O/$n-$s.train.json" 2> "$O/$n-$s.train.err"
  $L certify "$O/$n-$s.safetensors" --radii 36,72,108 --attack --attack-steps 10 --attack-restarts 1 --json \
    > "$O/$n-$s.cert.json" 2> "$O/$n-$s.cert.err"
  echo "$n seed $s: rc $?"
}
for s in $SEEDS; do
  one lipnext "$s" --recipe lipnext --arch lipnext:depth=8,width=64,patch=2,beta=0.5,shift_ratio=0.125,pool_eps=1e-06 &
  one liresnet "$s" --recipe liresnet --arch "liresnet:depth=12,width=16,dense=8,gamma=true,depth_scale=true,centering=true,stem_kernel=5,neck=patch,dense_width=256,features=act,layers=cholesky" &
  one lc5 "$s" --arch lipconvnet-5 --width 8 &
  wait
done
