#!/usr/bin/env bash
# Creates the benchmark environment: the tools mpo_rs is compared with, kept apart from the
# test environment (.venv) so that `make test` installs none of them.
#
#   benches/setup_env.sh [VENV]        default VENV: .venv-bench; PYTHON picks the interpreter
#
# Idempotent: a stamp file in VENV records a finished install; editing this script makes
# the next run install again. mpo_rs itself is the release build that `make build` leaves
# in python/mpo_rs (the Makefile's bench targets depend on it): VENV gets a .pth pointing
# at python/, so both environments run the very same extension.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-bench}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.bench-stamp"

if [ -f "$STAMP" ] && [ "$STAMP" -nt benches/setup_env.sh ]; then
    echo "$VENV: peers already installed"
else
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip install -q)
    "${PIP[@]}" --upgrade pip
    # The harness (numpy, scipy, matplotlib), the Parquet suite (pyarrow) and the peers that
    # install as usual.
    "${PIP[@]}" numpy scipy matplotlib pyarrow torch torchrl stateset-rl-core rlox
    # verl without its training runtime: only what `verl.trainer.ppo.core_algos` imports
    # (found by importing it until it stopped failing). transformers is kept inside verl's
    # declared range; tensordict stays at the version torchrl needs, newer than verl
    # declares, which core_algos does not notice.
    "${PIP[@]}" ray omegaconf codetiming "transformers>=5.5.3,<5.11,!=5.6.0"
    "${PIP[@]}" --no-deps "verl==0.9.1"
    "$VENV/bin/python" -c "from verl.trainer.ppo import core_algos"
    touch "$STAMP"
fi

SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$PWD/python" > "$SITE/mpo_rs.pth"
"$VENV/bin/python" -c "import mpo_rs" || { echo "mpo_rs is not built: run \`make build\` first" >&2; exit 1; }
