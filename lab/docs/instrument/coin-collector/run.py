"""The instrument's third premise task, Coin Collector (a port of TextWorld's), run after the
final run under a plan of its own (docs/instrument-coin-plan.md, committed before this run):
INSTRUMENT_COIN's arms on its seeds, the base policies' gates from its pilot (iteration 25).
Run from the repository root (resumable: the same command finishes what a stop left):

    python docs/instrument/coin-collector/run.py OUT
"""

import sys

from mpo_lab.reproduce.api import run_config
from mpo_lab.reproduce.presets import INSTRUMENT_COIN

if __name__ == "__main__":
    config = INSTRUMENT_COIN
    print(f"configuration {config.config_hash()}: {len(config.arms)} arms x {config.seeds} seeds", flush=True)
    run_config(
        config,
        sys.argv[1],
        gates_file="docs/instrument/iteration-25/gates.json",
        note=lambda s: print(f"mpo-rs: {s}", flush=True),
    )
