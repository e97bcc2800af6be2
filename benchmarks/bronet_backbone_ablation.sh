#!/bin/bash
# The BRONet backbone's two training pieces at CPU scale on digits: recipe bronet with
# quasi_residual and centering each off, on or both (seed 0, 20 epochs, width 16, dense width 256),
# every model certified at 36/72/108 on the 360 test images.
# Usage: bash benchmarks/bronet_backbone_ablation.sh OUTDIR [RAW.json]
#   RAW.json (default OUTDIR/ablation.json): {variant: {"arch": ..., "certify": lip certify --json}}
set -euo pipefail
out=${1:?OUTDIR}; raw=${2:-$out/ablation.json}
mkdir -p "$out"
lip=${LIP:-lip}
base="bronet:depth=12,width=16,stem_kernel=5,neck_patch=4,dense=8,dense_width=256"
declare -A arch=([neither]="$base,quasi_residual=false,centering=false" [quasi_residual]="$base,quasi_residual=true,centering=false"
                 [centering]="$base,quasi_residual=false,centering=true" [both]="$base,quasi_residual=true,centering=true")
run() {
  OMP_WAIT_POLICY=PASSIVE $lip train --dataset digits --recipe bronet --epochs 20 --warmup-epochs 0.5 --seed 0 \
    --arch "${arch[$1]}" --out "$out/$1.safetensors" --overwrite > "$out/$1.train.log" 2>&1
  $lip certify "$out/$1.safetensors" --radii 36,72,108 --json > "$out/$1.certify.json" 2> "$out/$1.certify.log"
}
run neither & run quasi_residual & wait
run centering & run both & wait
python3 - "$out" "$raw" "$base" <<'PY'
import json, sys
out, raw, base = sys.argv[1:4]
names = {"neither": "false,false", "quasi_residual": "true,false", "centering": "false,true", "both": "true,true"}
report = {}
for name, flags in names.items():
    q, c = flags.split(",")
    report[name] = {"arch": f"{base},quasi_residual={q},centering={c}",
                    "certify": json.load(open(f"{out}/{name}.certify.json"))}
open(raw, "w").write(json.dumps(report, indent=1) + "\n")
PY
