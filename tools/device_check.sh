#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md (its H200 rows and tables) in one call of a lent machine: the
# cuda-marked tests, Table 1 at batch 128 (with the convolution-kernel floor: step ÷ conv
# kernel time) and 512, the newer convolutions and the residual network beside soc-fast,
# a profile of one LipConvnet-20 step, and `lip bench certify` on LipConvnet-20 (series vs
# the eval lowering; LLN 10/100 classes, CRC-Lip 10/100 classes; LLN 10 classes again with
# cuDNN's autotuner); `benchmarks/compare_authors.py` against the authors' checkouts on the GPU;
# `lip bench train --recipe` for every recipe's network; and, with the time left before DEADLINE_S
# (seconds after the start), the digits evidence of every recipe against lipcli's defaults
# over 3 seeds (`benchmarks/results_recipes_seeds.py`, JOBS runs at a time on the one GPU).
#
# Usage (repository root; wheels of lipcli and its plugins in WHEELS, built beforehand with
#   python -m pip wheel -q --no-deps --no-build-isolation -w .whl . plugins/lipcli-{bro,sll,lot,liresnet,logit-annealing}
# so that the plugins' entry points register without network; the authors' checkouts, for the
# `authors` step, in AUTHORS/{soc,bro,lot,sll}, each with a COMMIT file):
#   OUT=DIR [ONLY=tests,table1,table512,convs,profile,certify,authors,recipes,digits] [ARCHS=5,20]
#   [DEADLINE_S=560] [JOBS=8] bash tools/device_check.sh
# Every step has its own time limit and its own line "== NAME: rc R in S s" in
# $OUT/device-check.txt; the JSON reports go to REPORTS (default /tmp/device-reports) and are
# packed into $OUT/reports.tar.gz at the end.  SMOKE=1: tiny sizes on the CPU (checks the script).
set -u
OUT=${OUT:-runs/device}
WHEELS=${WHEELS:-.whl}
PY=${PY:-python3}
ONLY=${ONLY:-tests,table1,table512,convs,profile,certify}
AUTHORS=${AUTHORS:-.authors}
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# the reports are packed into $OUT/reports.tar.gz at the end (a lent machine returns few files)
R=${REPORTS:-/tmp/device-reports}
mkdir -p "$OUT" "$R"
log="$OUT/device-check.txt"

if [ -n "${SMOKE:-}" ]; then
  DEV=cpu; ARCHS=5; BIG=5; N=64; BS=16; STEPS="--steps 1 --warmup 0"; W="--width 8"
  LIRES="liresnet:depth=2,dense=1"; LW="--width 8"; FIT=2; GRAPHS=off; TESTS="tests/bench/test_bench_cuda.py"
  AUTH="--batch 4 --width 4 --rounds 1 --reps 1"; RECIPES="--recipe lipconvnet,sll-small --steps 1 --warmup 0 --width 8"
  DIGITS="--smoke --seeds 0 --only lc5@defaults,lot@recipe"
else
  DEV=cuda; ARCHS=${ARCHS:-5,10,15,20,25,30,35,40}; BIG=20; N=4096; BS=256; STEPS="--steps 6 --warmup 3"; W=""
  LIRES="liresnet:depth=12"; LW="--width 128"; FIT=300; GRAPHS=on; TESTS="tests plugins"
  AUTH="--batch 128 --width 32 --rounds 5 --reps 3"
  RECIPES="--recipe lipconvnet,liresnet,bronet,bronet-lipconvnet,sll-small,lot,lot-residual --steps 6 --warmup 3"
  DIGITS="--epochs 30 --seeds 0,1,2"
fi
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }

want() { case ",$ONLY," in *",$1,"*) return 0;; *) return 1;; esac; }
step() {  # NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name: $* (limit $limit s)" >> "$log"
  local start=$(date +%s)
  timeout "$limit" "$@" >> "$log" 2>&1
  echo "== $name: rc $? in $(( $(date +%s) - start )) s" >> "$log"
}

{
  git rev-parse HEAD 2>/dev/null || echo "(no git)"
  nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
  "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.is_available())'
} >> "$log" 2>&1

if [ -d "$WHEELS" ]; then
  step install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/lipsite "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/lipsite${PYTHONPATH:+:$PYTHONPATH}"
fi
LIP="$PY -m lipcli"
step plugins 60 bash -c "$LIP plugins --json > $R/plugins.json"

want tests && step tests 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider $TESTS
want table1 && step table1-b128 140 $LIP bench train --archs $ARCHS --device $DEV --cuda-graphs $GRAPHS \
  $STEPS --no-memory $W -o "$R/table1-b128.json"
want table512 && step table1-b512 140 $LIP bench train --archs $ARCHS --device $DEV --cuda-graphs $GRAPHS \
  --batch-size 512 $STEPS --no-memory --no-floor $W -o "$R/table1-b512.json"

want profile && step profile-lc20 60 $LIP bench profile --arch $BIG --batch-size 128 --device $DEV $W \
  -o "$R/profile-lc20-b128.json"
want convs && step convs-lc5-lc20 150 $LIP bench train --archs 5,$BIG --conv soc-fast,bro:factor=qr,bro,sll,lot \
  --device $DEV --cuda-graphs $GRAPHS $STEPS --no-memory --no-floor $W -o "$R/convs-lc5-lc20-b128.json"
want convs && step liresnet 90 $LIP bench train --archs "$LIRES" --conv soc-fast,bro:factor=qr,bro --device $DEV \
  --cuda-graphs $GRAPHS $STEPS --no-memory --no-floor $LW -o "$R/liresnet-b128.json"
if want certify; then
  IFS=, read -ra cases <<< "${CERTIFY_CASES:-lln 10,lln 100,mlp 10,mlp 100}"
  for case in "${cases[@]}"; do
    set -- $case
    fit=""; [ "$1" = mlp ] && fit="--fit-head $FIT"
    step "certify-$1-$2" 90 $LIP bench certify --arch $BIG --head $1 --classes $2 --n $N --batch-size $BS \
      --device $DEV --lipschitz-iters 5 $fit $W -o "$R/certify-lc20-$1-$2.json"
  done
  # cuDNN's autotuner may pick float32 algorithms with fewer multiplications (Winograd, FFT)
  # for the literal 32x32/16x16 blocks, which the lowering leaves as they are
  step "certify-lln-10-cudnn-benchmark" 90 $LIP bench certify --arch $BIG --head lln --classes 10 --n $N \
    --batch-size $BS --device $DEV --lipschitz-iters 5 --cudnn-benchmark $W -o "$R/certify-lc20-lln-10-cudnn.json"
fi
if want authors; then
  for m in soc bro lot sll; do echo "authors' $m at $(cat "$AUTHORS/$m/COMMIT" 2>/dev/null || echo unknown)" >> "$log"; done
  # rows on stderr (the log) as they finish; the JSON report on stdout
  step authors 150 bash -c "$PY benchmarks/compare_authors.py --soc $AUTHORS/soc --bro $AUTHORS/bro \
    --lot $AUTHORS/lot --sll $AUTHORS/sll --shim-soc --device $DEV --threads 8 $AUTH --json > $R/compare-authors.json"
fi
want recipes && step recipes 120 $LIP bench train $RECIPES --device $DEV --no-memory --no-floor \
  -o "$R/recipes.json"
if want digits; then
  budget=$(( $(left) - 25 ))
  echo "== digits: $budget s left for the runs" >> "$log"
  [ "$budget" -gt 30 ] && step digits $(( budget + 20 )) "$PY" benchmarks/results_recipes_seeds.py "$R/digits" \
    $DIGITS --device $DEV --jobs ${JOBS:-8} --deadline-s $budget
  "$PY" benchmarks/results_seeds.py "$R/digits" --raw "$R/digits-raw.json" >> "$log" 2>&1
  cp "$R/digits/times.txt" "$R/digits-times.txt" 2>/dev/null
  rm -rf "$R/digits"
fi
tar -czf "$OUT/reports.tar.gz" -C "$(dirname "$R")" "$(basename "$R")"
echo "== done" >> "$log"
