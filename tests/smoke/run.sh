#!/usr/bin/env bash
# `make test-wheel`: the built wheel as a user gets it. Usage: run.sh PYTHON DIST BUILD_VENV
#
# 1. A bare virtual environment (.venv-wheel) gets the wheel in DIST, numpy and pyarrow
#    (and pytest, to run the tests), with no Rust toolchain on PATH: nothing is compiled.
# 2. tests/smoke/test_wheel_smoke.py runs in a temporary directory outside the checkout,
#    so what it imports is the installed wheel, never the source tree.
# 3. The sdist in DIST is built into a wheel offline (the checkout's build tools and
#    target/ cache; BUILD_VENV holds maturin), which shows it carries everything the build needs.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
python=$(command -v "$1")
dist=$(cd "$2" && pwd)
build_venv=$(cd "$3" && pwd)
shopt -s nullglob
wheels=("$dist"/mpo_rs-*.whl)
sdists=("$dist"/mpo_rs-*.tar.gz)
if [ ${#wheels[@]} -ne 1 ] || [ ${#sdists[@]} -ne 1 ]; then
    echo "run.sh: expected one wheel and one sdist in $dist, found: ${wheels[*]} ${sdists[*]}" >&2
    exit 1
fi
wheel=${wheels[0]}
sdist=${sdists[0]}
echo "wheel: $(basename "$wheel")"

# PATH without any directory holding cargo or rustc.
bare_path=""
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do
    if [ -z "$d" ] || [ -x "$d/cargo" ] || [ -x "$d/rustc" ]; then continue; fi
    bare_path="${bare_path:+$bare_path:}$d"
done

venv="$root/.venv-wheel"
rm -rf "$venv"
"$python" -m venv "$venv"
PATH="$bare_path" "$venv/bin/python" -m pip install -q --only-binary=:all: "$wheel" numpy pyarrow pytest

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$root/tests/smoke/test_wheel_smoke.py" "$tmp/"
(cd "$tmp" && PATH="$venv/bin:$bare_path" MPO_RS_WHEEL="$wheel" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -W error test_wheel_smoke.py)

# The sdist builds: the same files as the wheel, from the sdist alone.
CARGO_TARGET_DIR="$root/target" "$build_venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation \
    -w "$tmp/from-sdist" "$sdist"
rebuilt=("$tmp"/from-sdist/mpo_rs-*.whl)
"$venv/bin/python" - "$wheel" "${rebuilt[0]}" <<'PY'
import sys, zipfile
a, b = (sorted(zipfile.ZipFile(p).namelist()) for p in sys.argv[1:])
if a != b:
    sys.exit(f"the wheel built from the sdist differs: {sorted(set(a) ^ set(b))}")
print(f"sdist: builds a wheel of the same {len(a)} files")
PY
