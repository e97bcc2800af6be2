#!/usr/bin/env bash
# Train + certify the README's quick start with the code of any commit, using this checkout's
# .venv (torch etc.) and the commit's lipcli source on PYTHONPATH.
#   bash tools/quickstart_at.sh COMMIT [OUTDIR]
# Two commits whose model files are bit-identical print the same table; the script prints the
# SHA-256 of every tensor file so that two runs can be compared.
set -euo pipefail
commit=${1:?usage: quickstart_at.sh COMMIT [OUTDIR]}
out=${2:-runs/quickstart-at-$commit}
root=$(git rev-parse --show-toplevel)
py=${PYTHON:-$root/.venv/bin/python}
src=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$src" >/dev/null 2>&1 || true' EXIT
git -C "$root" worktree add --detach -q "$src" "$commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$src"
PYTHONPATH="$src" "$py" -m lipcli train --dataset digits --arch lipconvnet-5 --width 8 --epochs 30 \
  --out "$out/model.safetensors" --overwrite >/dev/null
PYTHONPATH="$src" "$py" -m lipcli certify "$out/model.safetensors" --radii 36,72,108
"$py" - "$out/model.safetensors" <<'PY'
import hashlib, sys
from safetensors import safe_open
h = hashlib.sha256()
with safe_open(sys.argv[1], "pt") as f:
    for k in sorted(f.keys()):
        h.update(k.encode()); h.update(f.get_tensor(k).numpy().tobytes())
print("tensors sha256:", h.hexdigest())
PY
