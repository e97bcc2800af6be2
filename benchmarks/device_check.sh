#!/usr/bin/env bash
# All GPU checks and benchmarks of one lent GPU machine, most important first (recorded in
# docs/benchmarks.md).  Usage (repository root, torch with CUDA installed):
#   OUT=dir bash benchmarks/device_check.sh            (BUDGET=seconds, default 400)
# Runs from the working tree (PYTHONPATH), no installation (convolution plugins, where present,
# are installed with pip --no-deps --target into a temporary folder).  Every step has its own
# time limit and the whole script a budget: a step that would start with less than its minimum
# left is skipped and says so.  DRY=1 prints the commands without running them (checks the
# script's logic on a machine without a GPU).  Returns one archive, $OUT/device-check.tgz
# (the device tool brings back at most 8 files), plus $OUT/summary.txt.
set -u
FINAL=${OUT:-device-out}
mkdir -p "$FINAL"
FINAL=$(cd "$FINAL" && pwd)
WORK=$(mktemp -d)
# the archive holds the reports, not the model files (the device tool returns files < 16 MiB)
trap 'cp "$WORK/summary.txt" "$FINAL/" 2>/dev/null; tar czf "$FINAL/device-check.tgz" --exclude="*.safetensors" -C "$WORK" . ; ls -l "$FINAL"' EXIT
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
LIP="$PY -m lipcli"
START=$(date +%s)
BUDGET=${BUDGET:-400}

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
log() { echo "$*" | tee -a "$WORK/summary.txt"; }
# step NAME LIMIT MIN COMMAND... : run COMMAND with stdout+stderr to $WORK/NAME.txt, limited
# to min(LIMIT, time left); skipped when less than MIN seconds are left
step() {
  local name=$1 limit=$2 min=$3; shift 3
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  local l; l=$(left)
  if [ "$l" -lt "$min" ]; then log "== $name: SKIPPED ($l s left, needs $min)"; return 0; fi
  [ "$l" -lt "$limit" ] && limit=$l
  local t0; t0=$(date +%s)
  if [ -n "${DRY:-}" ]; then log "== $name (limit $limit s): $*"; return 0; fi
  timeout "$limit" bash -c "$*" > "$WORK/$name.txt" 2>&1
  local rc=$?
  log "== $name: rc $rc in $(( $(date +%s) - t0 )) s (limit $limit)"
  tail -n "${TAIL:-14}" "$WORK/$name.txt" | tee -a "$WORK/summary.txt"
}

{ git rev-parse HEAD 2>/dev/null || echo "no git"; nvidia-smi -L 2>&1;
  $PY -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"; } > "$WORK/env.txt" 2>&1
cat "$WORK/env.txt" | tee -a "$WORK/summary.txt"
J=$WORK   # JSON reports beside the text
TABLE="--archs 5,10,15,20,25,30,35,40 --device cuda --cuda-graphs on"

# 1. the cuda-marked tests (graphed step vs eager, fused filter kernels vs eager, bench on CUDA)
step pytest-cuda 110 40 "$PY -m pytest -q -m cuda -p no:cacheprovider --continue-on-collection-errors tests"
# 2. Table 1 at batch 128 with CUDA graphs for both modes, and the convolution-kernel floor
step table1-b128 130 60 "$LIP bench train $TABLE --steps 6 --warmup 3 --no-memory -o $J/table1-b128.json"
# 3. the digits quick start, 3 epochs, graphs on vs off; certify the graphed model with PGD
step digits 100 50 "set -e; for g in on off; do $LIP train --dataset digits --arch lipconvnet-5 --width 8 --epochs 3 --device cuda --cuda-graphs \$g --out $WORK/q-\$g/model.safetensors -q --json > $WORK/digits-train-\$g.json; done; $LIP certify $WORK/q-on/model.safetensors --radii 36,72,108 --device cuda --attack --attack-steps 50 --attack-restarts 1 --json > $WORK/digits-certify-on.json; $PY benchmarks/device_digits_report.py $WORK"
# 4. certification throughput, LipConvnet-20, LLN and CRC-Lip, 10 and 100 classes
for head in lln mlp; do for c in 10 100; do
  step certify-$head-$c 45 25 "$LIP bench certify --arch 20 --head $head --classes $c --n 4096 --device cuda --lipschitz-iters 5 --fit-head 300 -o $J/certify-$head-$c.json"
done; done
# certification variants (LLN, 10 classes): batch 256 vs 1024, NCHW vs channels-last series
for v in "b1024-cl:1024:1" "b256-cl:256:1" "b1024-nchw:1024:0" "b256-nchw:256:0"; do
  IFS=: read -r tag bs cl <<< "$v"
  step certify-var-$tag 30 12 "LIPCLI_CUDA_CHANNELS_LAST=$cl $LIP bench certify --arch 20 --head lln --n 2048 --batch-size $bs --device cuda --lipschitz-iters 1 -o $J/certify-var-$tag.json"
done
step certify-mlp-100-b256 45 25 "$LIP bench certify --arch 20 --head mlp --classes 100 --n 4096 --batch-size 256 --device cuda --lipschitz-iters 5 --fit-head 300 -o $J/certify-mlp-100-b256.json"
# 5. Table 1 at batch 512 (graphs on for both modes)
step table1-b512 100 60 "$LIP bench train $TABLE --batch-size 512 --steps 5 --warmup 3 --no-memory --no-floor -o $J/table1-b512.json"
# 6. fused filter kernel (torch.compile) A/B, LipConvnet-20, batch 128, graphs on
step fused-ab 80 40 "for f in 0 1 0 1; do LIPCLI_FUSED_FILTER=\$f $LIP bench train --archs 20 --device cuda --cuda-graphs on --steps 8 --warmup 3 --no-memory -o $J/fused-ab-\$f-\$RANDOM.json -q | grep -A4 'Per training'; done"
# 7. certification with cuDNN autotuning (lip certify does not autotune): what it would gain
step certify-lln-10-cudnn-benchmark 45 25 "$LIP bench certify --arch 20 --head lln --classes 10 --n 4096 --device cuda --lipschitz-iters 5 --cudnn-benchmark -o $J/certify-lln-10-cudnnbench.json"
# 8. the convolution plugins, where this checkout has them and lip bench train --conv
if [ -d plugins/lipcli-cayley ] && $LIP bench train --help 2>/dev/null | grep -q -- "--conv"; then
  step plugins 60 20 "$PY -m pip install -q --no-deps --no-build-isolation --target /tmp/lipplug plugins/lipcli-cayley plugins/lipcli-bcop plugins/lipcli-aol"
  step convs 110 40 "PYTHONPATH=$PYTHONPATH:/tmp/lipplug $LIP bench train --conv soc-fast,soc,cayley,bcop,aol --archs 5,20 --batch-size 128 --device cuda --cuda-graphs on --steps 5 --warmup 3 --no-memory -o $J/convs-b128.json"
else
  log "== convs: skipped (no convolution plugins or no lip bench train --conv in this checkout)"
fi
# 9. the older smoke script (forwards bit-identical, no host sync in an eager step)
step smoke 45 20 "$PY benchmarks/cuda_smoke.py"
log "== done in $(( $(date +%s) - START )) s"
