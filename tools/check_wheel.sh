#!/usr/bin/env bash
# Release check: build lipcli and every plugin distribution under plugins/ (sdist + wheel) with `python -m build`,
# install the wheels into a fresh venv OUTSIDE the source tree, and run what a user runs:
# `lip --version`, `lip plugins`, a short quick start (train, certify, info, export) and the
# test suite's fast subset against the installed package; then every plugin's wheel
# (installed last: some tests check the messages for a model whose plugin is missing).
#
#   bash tools/check_wheel.sh [WORKDIR] [--smoke]
#
# PYTHON (default: .venv/bin/python) builds; it needs the `build` package (pip install build).
# The new venv sees PYTHON's installed packages (torch, ...; not lipcli or its plugins) through
# a .pth line, so nothing is downloaded again; lipcli itself comes only from the wheel. --smoke runs one test file
# instead of the fast subset (what the slow pytest test uses).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
SMOKE="${2:-}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$WORK"
cd "$WORK"
echo "== build ($WORK/dist)"
"$PY" -m build --sdist --wheel --outdir dist "$ROOT" >build.log 2>&1 || { tail -20 build.log; exit 1; }
PLUGINS=()
for plugin in "$ROOT"/plugins/*/; do
  PLUGINS+=("$(basename "$plugin")")
  "$PY" -m build --sdist --wheel --outdir dist "$plugin" >>build.log 2>&1 || { tail -20 build.log; exit 1; }
done
ls dist
version="$("$PY" -c "import ast,sys; t=ast.parse(open(sys.argv[1]).read()); print([n.value.value for n in t.body if isinstance(n, ast.Assign) and n.targets[0].id == '__version__'][0])" "$ROOT/lipcli/version.py")"
test -f "dist/lipcli-$version-py3-none-any.whl" && test -f "dist/lipcli-$version.tar.gz"
"$PY" -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); assert 'lipcli/py.typed' in names, 'no py.typed'" "dist/lipcli-$version-py3-none-any.whl"
echo "== fresh venv ($WORK/venv)"
python3 -m venv venv
site_new="$(venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
site_old="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# the dependencies only: links to PYTHON's packages except lipcli and its plugins
mkdir -p deps
for entry in "$site_old"/*; do
  case "$(basename "$entry")" in lipcli*|__editable__*|*.pth|__pycache__) continue;; esac
  ln -s "$entry" "deps/$(basename "$entry")"
done
echo "$WORK/deps" >"$site_new/_lipcli_check_deps.pth"
venv/bin/python -m pip install -q --no-deps --no-index "dist/lipcli-$version-py3-none-any.whl"
mkdir -p elsewhere && cd elsewhere
where="$(../venv/bin/python -c 'import lipcli; print(lipcli.__file__)')"
case "$where" in "$ROOT"/*) echo "lipcli imported from the source tree: $where"; exit 1;; esac
echo "lipcli from $where"
../venv/bin/lip --version
../venv/bin/lip --version | grep -qx "lipcli $version"
../venv/bin/lip plugins >/dev/null
echo "== quick start (short)"
LIPCLI_RUNS="$PWD/runs" ../venv/bin/lip train --dataset digits --arch lipconvnet-5 --width 4 --epochs 1 \
  --limit-train 64 --limit-test 32 --no-lipschitz-estimate -q >/dev/null
LIPCLI_RUNS="$PWD/runs" ../venv/bin/lip certify --radii 36,72,108 --limit 32 -q
LIPCLI_RUNS="$PWD/runs" ../venv/bin/lip info >/dev/null
LIPCLI_RUNS="$PWD/runs" ../venv/bin/lip export --certify --check 8 -q
echo "== tests against the installed wheel"
cp -r "$ROOT/tests" tests
mkdir -p plugins && cp -r "$ROOT/plugins/lipcli-polygon-pool" plugins/
# no build or install leftovers (an egg-info on the path would register the plugin)
find tests plugins \( -name "*.egg-info" -o -name __pycache__ -o -name build \) -prune -exec rm -rf {} +
cat >pytest.ini <<'INI'
[pytest]
testpaths = tests plugins/lipcli-polygon-pool/tests
pythonpath = tests plugins/lipcli-polygon-pool/src
markers =
    slow: end-to-end or heavy tests
filterwarnings = ignore::DeprecationWarning:torch.*
INI
if [ "$SMOKE" = "--smoke" ]; then
  ../venv/bin/python -m pytest -q -p no:cacheprovider tests/host/test_modelfile.py
else
  ../venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow"
fi
echo "== every plugin's wheel (${PLUGINS[*]})"
for plugin in "${PLUGINS[@]}"; do
  wheel=(../dist/"${plugin//-/_}"-*.whl)
  test -f "${wheel[0]}" || { echo "no wheel for $plugin"; exit 1; }
  test -f ../dist/"${plugin//-/_}"-*.tar.gz || test -f ../dist/"$plugin"-*.tar.gz || { echo "no sdist for $plugin"; exit 1; }
  ../venv/bin/python -m pip install -q --no-deps --no-index "${wheel[0]}"
done
../venv/bin/lip plugins
../venv/bin/lip plugins --json >plugins.json
for plugin in "${PLUGINS[@]}"; do grep -q "\"$plugin\"" plugins.json || { echo "lip plugins does not list $plugin"; exit 1; }; done
echo "wheel check passed"
