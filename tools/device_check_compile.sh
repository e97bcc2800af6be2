#!/usr/bin/env bash
# Issue 47's GPU figures in one call of a lent machine, written to ONE JSON report
# ($OUT/compile-report.json, every step's raw JSON inside it, and the log $OUT/compile-check.txt):
#   1. LipConvnet-20, width 32, batch 128: training step ÷ its convolution kernels (torch.profiler,
#      `lip bench train --floor`), eager with CUDA graphs, and with --compile (default; reduce-overhead);
#   2. compiled ÷ eager training step, LipConvnet-5 and -20, width 32, batch 128
#      (benchmarks/compile_cpu.py --device cuda);
#   3. lipcli ÷ the paper's code, the whole training step at depths 5 and 20 (eager and compiled,
#      benchmarks/compare_authors.py --soc-networks 5,20 --compile MODE);
#   4. certification inputs/s, LipConvnet-20: LLN (10 classes) and CRC-Lip (100 classes, head fitted),
#      with the compiled feature path beside series and lowered (`lip bench certify --compile`);
#   5. the BRO row of the authors' table (benchmarks/compare_authors.py --bro).
# Targets (issue 47): step ÷ conv kernels <= 1.3; lipcli ÷ authors <= 0.7 at depths 5 and 20;
# LLN >= 10,000 inputs/s, CRC-Lip (100 classes) >= 1,000 inputs/s; the report states each.
#
# Usage (repository root; wheels of lipcli and its plugins in WHEELS as for tools/device_check.sh,
# else the lipcli importable by PY): the authors' checkouts in AUTHORS/{soc,bro} (each with a COMMIT file;
# github.com/singlasahil14/improved_l2_robustness, github.com/ntuaislab/BRONet), einops beside
# them in AUTHORS/_deps (`pip install --target AUTHORS/_deps einops`):
#   OUT=DIR [AUTHORS=.authors] [MODE=reduce-overhead] [PY=python3] bash tools/device_check_compile.sh
# SMOKE=1: a dry run on the CPU at tiny sizes (checks the script and the report; with
# LIPCLI_COMPILE_BACKEND=aot_eager it compiles in seconds instead of minutes).
set -u
OUT=${OUT:-runs/device-compile}
PY=${PY:-python3}
AUTHORS=${AUTHORS:-.authors}
MODE=${MODE:-reduce-overhead}
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
R="$OUT/raw"
mkdir -p "$OUT" "$R"
log="$OUT/compile-check.txt"
if [ -n "${SMOKE:-}" ]; then
  DEV=cpu; W=8; B=8; STEPS="--steps 1 --warmup 2"; N=32; BS=16; FIT=2; ROUNDS=1; NETS=5; GRAPHS=off; MODE=default
  LIMIT=900; TH=1; CERT="--dense-max-mib 0 --path-rounds 1"; DEEP=5; NETLIST=lc5
else
  DEV=cuda; W=32; B=128; STEPS="--steps 10 --warmup 3"; N=8192; BS=1024; FIT=300; ROUNDS=5; NETS=5,20; GRAPHS=on
  LIMIT=200; TH=8; CERT=""; DEEP=20; NETLIST=lc5,lc20
fi
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
  "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
} >> "$log" 2>&1
# lipcli and its plugins from wheels where given (as tools/device_check.sh: WHEELS, built beforehand)
WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ]; then
  step install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/lipsite "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/lipsite${PYTHONPATH:+:$PYTHONPATH}"
fi
LIP="$PY -m lipcli"

# 1. step / convolution kernels (the floor is profiled on CUDA only)
step floor-eager $LIMIT $LIP bench train --archs $DEEP --width $W --batch-size $B --device $DEV --cuda-graphs $GRAPHS \
  $STEPS --no-memory -o "$R/floor-eager.json"
step floor-compiled $LIMIT $LIP bench train --archs $DEEP --width $W --batch-size $B --device $DEV --cuda-graphs $GRAPHS \
  --compile --compile-mode default $STEPS --no-memory -o "$R/floor-compiled.json"
[ -z "${SMOKE:-}" ] && step floor-$MODE $LIMIT $LIP bench train --archs $DEEP --width $W --batch-size $B --device $DEV \
  --compile --compile-mode $MODE $STEPS --no-memory -o "$R/floor-$MODE.json"
# 2. compiled / eager
step compiled-vs-eager $LIMIT bash -c "$PY benchmarks/compile_cpu.py --device $DEV --nets $NETLIST --width $W \
  --batch $B --rounds $((ROUNDS * 2)) --mode $MODE --json > $R/compiled-vs-eager.json"
# 3. and 5. the authors' code
shim=""; [ "$DEV" = cpu ] && shim="--shim-soc"
for m in soc bro; do echo "authors' $m at $(cat "$AUTHORS/$m/COMMIT" 2>/dev/null || echo unknown)" >> "$log"; done
step authors-networks $LIMIT bash -c "PYTHONPATH=$AUTHORS/_deps $PY benchmarks/compare_authors.py --soc $AUTHORS/soc \
  $shim --soc-networks $NETS --networks-only --net-width $W --net-batch $B --device $DEV --threads $TH \
  --rounds $ROUNDS --reps 1 --compile $MODE --json > $R/authors-networks.json"
step authors-bro $LIMIT bash -c "PYTHONPATH=$AUTHORS/_deps $PY benchmarks/compare_authors.py --bro $AUTHORS/bro \
  --device $DEV --threads $TH --batch $B --width $W --rounds $ROUNDS --reps 1 --json > $R/authors-bro.json"
# 4. certification
step certify-lln-10 $LIMIT $LIP bench certify --arch $DEEP --width $W --head lln --classes 10 --n $N --batch-size $BS \
  --device $DEV --lipschitz-iters 5 --compile --compile-mode default $CERT -o "$R/certify-lln-10.json"
step certify-mlp-100 $LIMIT $LIP bench certify --arch $DEEP --width $W --head mlp --classes 100 --n $N --batch-size $BS \
  --device $DEV --lipschitz-iters 5 --fit-head $FIT --compile --compile-mode default $CERT -o "$R/certify-mlp-100.json"

"$PY" - "$R" "$OUT/compile-report.json" "$DEV" >> "$log" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
raw, out, dev = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
reports = {p.stem: json.loads(p.read_text()) for p in sorted(raw.glob("*.json")) if p.stat().st_size}
summary = {"device": dev}
for name in ("floor-eager", "floor-compiled", "floor-reduce-overhead", "floor-max-autotune"):
    for row in reports.get(name, {}).get("results", []):
        for key in ("fast",):
            m = row[key]
            summary[f"{name} {row['arch']} {m['conv']}"] = {
                "median_step_s": m["median_step_s"], "compile_s": m.get("compile_s"),
                "step_over_conv_kernel": (m.get("kernel_floor") or {}).get("step_over_conv_kernel"),
                "target_step_over_conv_kernel": 1.3}
for r in reports.get("compiled-vs-eager", {}).get("rows", []):
    summary[f"compiled/eager {r['network']}"] = {k: r[k] for k in ("ratio_of_medians", "ratio_paired_median",
                                                                   "compile_s", "max_abs_logit_diff_same_weights")}
for r in reports.get("authors-networks", {}).get("rows", []):
    summary[f"lipcli/authors {r['what']} {r['lipcli']}"] = {"train": r["train"], "target": 0.7}
for r in reports.get("authors-bro", {}).get("rows", []):
    summary[f"bro {r['what']} threads {r['threads']}"] = {"agree": r["agree"], "train": r["train"], "eval": r.get("eval")}
for name, target in (("certify-lln-10", 10_000), ("certify-mlp-100", 1_000)):
    rep = reports.get(name)
    if rep:
        summary[name] = {"certificates_inputs_per_s": [c["inputs_per_s"] for c in rep["certificates"]],
                         "features_inputs_per_s": rep["features"]["inputs_per_s"],
                         "feature_paths_inputs_per_s": {p["path"]: p["inputs_per_s"] for p in rep["feature_paths"]},
                         "target_inputs_per_s": target}
out.write_text(json.dumps({"summary": summary, "reports": reports}, indent=1))
print(json.dumps(summary, indent=1))
EOF
echo "== done" >> "$log"
