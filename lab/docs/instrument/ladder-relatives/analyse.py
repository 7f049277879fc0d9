"""The supplement's reading (docs/instrument.md, "Supplement"), from the repository root:

    python docs/instrument/ladder-relatives/analyse.py \
        docs/instrument/ladder-relatives/results.json docs/full/results.json

Checks that its GRPO repeats the final run's, gives every arm's final - base (paired, 95%) and
the ladder on MultiHop with the final run's MPO and PPO rungs (mean held-out success over
training, paired by seed, 95%)."""

import json
import sys
from collections import defaultdict

from mpo_lab.reproduce.stats import paired_diff_ci
from mpo_lab.reproduce.when import ladder_gains, ladder_table

supplement = json.load(open(sys.argv[1]))["runs"]
final = json.load(open(sys.argv[2]))["runs"]


def grpo(rows: list[dict]) -> dict[int, tuple[float, float]]:
    return {r["seed"]: (r["final_success"], r["auc_success"]) for r in rows if r["arm"] == "hop_grpo"}


print("its GRPO repeats the final run's:", grpo(supplement) == grpo(final))
by_arm: dict[str, list[dict]] = defaultdict(list)
for r in supplement:
    by_arm[r["arm"]].append(r)
for arm, rows in by_arm.items():
    p = paired_diff_ci({r["seed"]: r["final_success"] for r in rows}, {r["seed"]: r["base_success"] for r in rows})
    ev = sum(r["final_explained_variance"] for r in rows) / len(rows)
    print(f"{arm}: final - base {p.diff:+.3f} [{p.low:+.3f}, {p.high:+.3f}], explained variance {ev:.2f}")
rows = supplement + [r for r in final if r.get("task") == "multi_hop" and r["arm"] != "hop_grpo"]
print(ladder_table(ladder_gains(rows, "multi_hop", "auc_success")))
