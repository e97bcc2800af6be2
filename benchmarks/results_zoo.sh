#!/usr/bin/env bash
# Reproduces the "layer zoo" digits grid in docs/results.md (issue 15): LipConvnet-5 at the
# quick-start budget (width 8, 30 epochs, otherwise the recipe defaults) for every convolution
# x {maxmin, householder} with the LLN head, the ortho head + margin certificate, and a second
# seed of the baseline (run-to-run noise). Every model is certified at 36/72/108 on the 360
# test images, and its certificates are checked by PGD (--attack) on the first ATTACK_LIMIT
# (default 50) of them (the CPU is shared: the attack costs ~2 training epochs). The plugin distributions under plugins/ are pip-installed into OUT/site
# (beside, not into, the environment) and put on PYTHONPATH; a convolution whose plugin is
# not in plugins/ is skipped and reported. The table: python benchmarks/results_zoo_table.py OUT
# Usage: bash benchmarks/results_zoo.sh [OUTDIR]   (default runs/zoo); ONLY=name runs one row;
# the plugins are installed once per OUTDIR (REINSTALL=1 installs them again).
set -euo pipefail
OUT=${1:-runs/zoo}
LIP=${LIP:-.venv/bin/lip}
PY=${PY:-.venv/bin/python}
ATTACK=${ATTACK:-"--attack --attack-steps 10 --attack-restarts 1"}
ATTACK_LIMIT=${ATTACK_LIMIT:-50}
# one thread: on a loaded machine two OpenMP threads per run were 2.5x slower (measured)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
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
    --limit "$ATTACK_LIMIT" $ATTACK --no-write --json -q > "$OUT/$name.attack.json"
  echo "$name: done $(date -u +%H:%M:%S)" | tee -a "$OUT/log.txt"
}
# order of importance (the CPU is shared; what finishes first is in the table first): the
# SOC rows, then every other convolution with maxmin, the second seed, then householder
row() {  # conv, activation
  if [ -n "${ONLY:-}" ] && [ "$ONLY" != "$1-$2" ]; then return; fi
  if ! have_conv "$1"; then echo "$1-$2: no plugin provides $1, skipped" | tee -a "$OUT/log.txt"; return; fi
  run "$1-$2" --conv "$1" --activation "$2"
}
row soc-fast maxmin
row soc-fast householder
run soc-fast-maxmin-ortho --conv soc-fast --activation maxmin --head ortho
for conv in aol cayley bcop; do row "$conv" maxmin; done
run soc-fast-maxmin-seed1 --conv soc-fast --activation maxmin --seed 1
for conv in aol cayley bcop; do row "$conv" householder; done
