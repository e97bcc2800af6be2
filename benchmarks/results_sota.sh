#!/usr/bin/env bash
# Reproduces the "newer layers and losses" digits table in docs/results.md (issue 23): at one
# shared budget (width 8, EPOCHS epochs, otherwise the recipe defaults), LipConvnet-5 with
# soc-fast (= the ce row), bro, sll and lot; LipConvnet-5 soc-fast trained with the la and
# emma losses; the residual network (RESNET, a small liresnet) with bro and soc-fast, trained
# with NAdam (lr 1e-3: SGD at lr 0.1 made its loss NaN within 2 epochs). Every
# (config, seed) for SEEDS is trained with `--seed S`, certified at 36/72/108 on the 360 test
# images and checked by l2 PGD on all of them (ATTACK). The plugins (lipcli-bro, -sll, -lot,
# -liresnet, -logit-annealing) must be installed in the environment.
# Usage: bash benchmarks/results_sota.sh [OUTDIR]   (default runs/sota); ONLY=config runs one
# config; a finished step (its output file) is skipped, so an interrupted run resumes.
# The table (mean ± sd over seeds): python benchmarks/results_seeds.py OUTDIR
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OUT=${1:-runs/sota}
LIP=${LIP:-.venv/bin/lip}
PY=${PY:-.venv/bin/python}
EPOCHS=${EPOCHS:-5}
SEEDS=${SEEDS:-"0 1 2"}
RESNET=${RESNET:-"liresnet:depth=4,dense=2"}  # width: the shared --width 8
ATTACK=${ATTACK-"--attack --attack-steps 5 --attack-restarts 1"}
EXTRA=${EXTRA:-}  # more lip train options for every run (a smoke test: --limit-train 64)
mkdir -p "$OUT"
run() {  # config name, then lip train options
  local config=$1; shift
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$config" ]; then return; fi
  for seed in $SEEDS; do
    local name="$config-s$seed" start=$(date +%s)
    [ -s "$OUT/$name.safetensors" ] || "$LIP" train --dataset digits --width 8 --epochs "$EPOCHS" \
      --seed "$seed" "$@" $EXTRA --out "$OUT/$name.safetensors" -q --json > "$OUT/$name.train.json"
    local mid=$(date +%s)
    [ -s "$OUT/$name.certify.json" ] || "$LIP" certify "$OUT/$name.safetensors" --radii 36,72,108 \
      $ATTACK --json -q > "$OUT/$name.certify.json"
    echo "$name: train $((mid - start)) s, certify $(($(date +%s) - mid)) s" | tee -a "$OUT/times.txt"
  done
}
run lc5-soc-fast --arch lipconvnet-5 --conv soc-fast
run lc5-bro --arch lipconvnet-5 --conv bro
run lc5-sll --arch lipconvnet-5 --conv sll
run lc5-soc-fast-la --arch lipconvnet-5 --conv soc-fast --loss la
run lc5-soc-fast-emma --arch lipconvnet-5 --conv soc-fast --loss emma
run liresnet-soc-fast --arch "$RESNET" --conv soc-fast --optimizer nadam
run liresnet-bro --arch "$RESNET" --conv bro --optimizer nadam
run lc5-lot --arch lipconvnet-5 --conv lot
"$PY" benchmarks/results_seeds.py "$OUT"
