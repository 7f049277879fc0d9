"""The critic-quality ladder's rungs for AReaL's turn-level GAE and RAGEN's bi-level GAE on
MultiHop, which the instrument's final configuration leaves out for time: INSTRUMENT's budget,
model, base policies, warm-up, seeds 1-5 and gates, plus GRPO of the same seeds for pairing.
Descriptive only (docs/instrument.md, "Supplement"). Run from the repository root:

    python docs/instrument/ladder-relatives/run.py OUT
"""

import dataclasses
import sys

from mpo_lab.reproduce.api import run_config
from mpo_lab.reproduce.ladder import ladder_arms
from mpo_lab.reproduce.presets import INSTRUMENT

RELATIVES = ("hop_areal_turn_gae", "hop_ragen_bilevel")
CONFIG = dataclasses.replace(
    INSTRUMENT,
    name="instrument-ladder-relatives",
    tasks=tuple(t for t in INSTRUMENT.tasks if t.name == "multi_hop"),
    arms=(
        *(a for a in INSTRUMENT.arms if a.key == "hop_grpo"),
        *(a for a in ladder_arms("multi_hop") if a.key.split("_ref")[0] in RELATIVES),
    ),
)

if __name__ == "__main__":
    print(f"configuration {CONFIG.config_hash()}: {len(CONFIG.arms)} arms x {CONFIG.seeds} seeds", flush=True)
    run_config(
        CONFIG, sys.argv[1], gates_file="docs/instrument/gates.json", note=lambda s: print(f"mpo-rs: {s}", flush=True)
    )
