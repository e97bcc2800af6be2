#!/usr/bin/env bash
# Reproduces the "layer zoo" digits grid in docs/results.md (issue 15): LipConvnet-5 at the
# quick-start budget (width 8, 30 epochs, otherwise the recipe defaults) for every convolution
# x {maxmin, householder} with the LLN head, the ortho head + margin certificate, and a second
# seed of the baseline (run-to-run noise). Every model is certified at 36/72/108 on the 360
# test images, and its certificates are checked by l2 PGD (ATTACK, default 50 steps, 1 restart)
# on all of them (ATTACK_LIMIT=N: the first N only). Torch's default thread count (2 on the
# development machine), so that the soc-fast-maxmin row trains the README quick start's model
# (same command: soc-fast and maxmin are the defaults). The plugin distributions under
# plugins/ are pip-installed into OUT/site
# (beside, not into, the environment) and put on PYTHONPATH; a convolution whose plugin is
# not in plugins/ is skipped and reported. The table: python benchmarks/results_table.py OUT
# Usage: bash benchmarks/results_zoo.sh [OUTDIR]   (default runs/zoo); ONLY=name runs one row;
# the plugins are installed once per OUTDIR (REINSTALL=1 installs them again).
set -euo pipefail
# idle OpenMP threads sleep instead of spinning: the same work split (the quick start's model
# is unchanged), but 2-thread epochs took 4 s instead of 15-40 s beside another busy process
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
OUT=${1:-runs/zoo}
LIP=${LIP:-.venv/bin/lip}
PY=${PY:-.venv/bin/python}
ATTACK=${ATTACK:-"--attack --attack-steps 50 --attack-restarts 1"}
LIMIT=${ATTACK_LIMIT:+--limit $ATTACK_LIMIT}
mkdir -p "$OUT"
dists=()
for d in lipcli-householder lipcli-ortho-head lipcli-cayley lipcli-bcop lipcli-aol; do
  [ -d "plugins/$d" ] && dists+=("./plugins/$d")
done
if [ ! -f "$OUT/site/.installed" ] || [ -n "${REINSTALL:-}" ]; then  # once per OUTDIR
  "$PY" -m pip install -q --upgrade --no-deps --target "$OUT/site" "${dists[@]}"
  rm -rf plugins/*/build plugins/*/src/*.egg-info  # keep the source trees clean (see results_digits.sh)
  printf '%s\n' "${dists[@]}" > "$OUT/site/.installed"
fi
export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
have_conv() { "$LIP" plugins --json | "$PY" -c "import json,sys; sys.exit(0 if any('$1' in p['components'].get('conv', []) for p in json.load(sys.stdin)['plugins']) else 1)"; }
run() {  # name, then lip train options
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ]; then return; fi
  if [ ! -f "$OUT/$name.safetensors" ]; then
    "$LIP" train --dataset digits --arch lipconvnet-5 --width 8 --epochs 30 "$@" \
      --out "$OUT/$name.safetensors" -q --json > "$OUT/$name.train.json"
  fi
  [ -f "$OUT/$name.certify.json" ] || "$LIP" certify "$OUT/$name.safetensors" --radii 36,72,108 \
    --json -q > "$OUT/$name.certify.json"
  [ -f "$OUT/$name.attack.json" ] || "$LIP" certify "$OUT/$name.safetensors" --radii 36,72,108 \
    $LIMIT $ATTACK --no-write --json -q > "$OUT/$name.attack.json"
  echo "$name: done $(date -u +%H:%M:%S)" | tee -a "$OUT/log.txt"
}
# order of importance (the CPU is shared; what finishes first is in the table first): the
# baseline, the ortho head, the other convolutions with maxmin, the second seed, householder
row() {  # conv, activation
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$1-$2" ]; then return; fi
  if ! have_conv "$1"; then echo "$1-$2: no plugin provides $1, skipped" | tee -a "$OUT/log.txt"; return; fi
  run "$1-$2" --conv "$1" --activation "$2"
}
row soc-fast maxmin
run soc-fast-maxmin-ortho --conv soc-fast --activation maxmin --head ortho
for conv in cayley bcop aol; do row "$conv" maxmin; done
run soc-fast-maxmin-seed1 --conv soc-fast --activation maxmin --seed 1
for conv in soc-fast aol cayley bcop; do row "$conv" householder; done
