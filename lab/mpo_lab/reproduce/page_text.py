"""The page's wording: numbers and intervals as text, the cells and tallies of comparisons,
and the fixed sections (the controls' earlier run, "Does MPO help on my task?")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .analysis import Comparison
from .budgets import arm_keys, base_config
from .config import ReproduceConfig
from .stats import (
    INCONCLUSIVE,
    NO_VERDICT,
    NOT_REPRODUCED,
    REPRODUCED,
    mean_ci,
)


def fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def ci_text(values: list[float], digits: int = 3) -> str:
    mean, low, high, n = mean_ci(values)
    if n == 0:
        return "—"
    if n < 2:
        return f"{fmt(mean, digits)} (1 seed)"
    return f"{fmt(mean, digits)} [{fmt(low, digits)}, {fmt(high, digits)}]"


def spread(xs: Sequence[float], digits: int = 3) -> str:
    """mean [min, max], or a dash when there is nothing."""
    if not xs:
        return "—"
    return f"{fmt(float(np.mean(xs)), digits)} [{fmt(min(xs), digits)}, {fmt(max(xs), digits)}]"


def cell(c: Comparison | None) -> str:
    """A confirmatory comparison in a table cell: difference ± half-width, Holm p, verdict."""
    if c is None:
        return "—"
    if not math.isfinite(c.diff):
        return "not measured"
    if not math.isfinite(c.half_width):
        return f"{c.diff:+.3f} (no interval), {c.verdict}"
    text = f"{c.diff:+.3f} ± {c.half_width:.3f}, p={fmt(c.p_holm)}, "
    if c.verdict == NO_VERDICT:  # the task does not pass its gates (the Gates section says which)
        return text + NO_VERDICT
    if c.verdict != INCONCLUSIVE:
        return text + f"**{c.verdict}**"
    # Undecided: "equivalent within ±m" only by the plan's TOST on a gated task, else no reading
    # (no difference shown, never "equal").
    reading = c.reading()
    return text + c.verdict + (f", **{reading}**" if reading.startswith("equivalent") else "")


def power_text(comps: list[Comparison]) -> str:
    widths = [c.half_width for c in comps if math.isfinite(c.half_width)]
    if not widths:
        return ""
    n = sorted({c.n for c in comps if math.isfinite(c.half_width)})
    seeds = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    low, high = fmt(min(widths), 3), fmt(max(widths), 3)
    spread = low if low == high else f"{low}-{high}"
    return f"Power achieved: 95% half-widths {spread} on {seeds} paired seed(s)."


def counts(comps: list[Comparison], decided_only: bool = False) -> str:
    """How many comparisons have each verdict ("no verdict" only when some have none)."""
    names = (REPRODUCED, NOT_REPRODUCED) if decided_only else (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
    count = {v: sum(c.verdict == v for c in comps) for v in names}
    text = ", ".join(f"{n} {v}" for v, n in count.items() if n or not decided_only)
    withheld = sum(c.verdict == NO_VERDICT for c in comps)
    if withheld and not decided_only:
        text += f", {withheld} with {NO_VERDICT}"
    return text


def tally(comps: list[Comparison], lead: str) -> str:
    if not comps:
        return ""
    return f"{lead}: {len(comps)}, of which {counts(comps)}."


CONTROLS_SECTION = [
    "## Earlier runs",
    "",
    "[docs/paper/reproduction.md](paper/reproduction.md) is the committed run this page replaced (configuration "
    "`full`, hash ad912b7a54fc, 444 runs: 37 arms x 12 seeds, kept unchanged, its tables under docs/paper/full/; "
    "`mpo-rs reproduce --budget full` runs it again): the paper's five tasks at their first settings. None of its "
    "tasks passes the gates above, so none of its 62 comparisons gets a verdict: on Search every arm ended below "
    "its base policy, FrozenLake did not move, and the outcomes were mostly luck, so no critic could predict them "
    "(docs/instrument.md, iteration 0).",
    "",
    "[docs/control/reproduction.md](control/reproduction.md) is the run before it (configuration 796ef3ad680c, "
    "commit a59c8d2, 90 runs, kept unchanged): KeyDoor and GuessNumber only, "
    "policies and critics from a random initialisation (no base policy, no critic warm-up), 5 seeds, each claim "
    "decided by Welch's unpaired interval without a multiplicity correction, 64 evaluation episodes. Every "
    "Table-1 claim was inconclusive there, and claim 1 was not reproduced (the trained critics' median "
    "between-turn share was 0.09-0.13, the paper's 0.895), which KeyDoor dictates: its decisive tokens are the "
    "policy's own and its observations are noise, so the premise fails by construction (docs/envs.md). Neither "
    "run's runs are pooled with this page's.",
    "",
]
"""The committed page's pointers to the runs it replaced (docs/paper/, docs/control/), which no command rewrites."""


# The docs test (tests/test_docs.py) skips a block marked so, showing the reason.
NOT_RUN_HERE = (
    "<!-- not run: trains three arms (minutes); lab/tests/test_reproduce_custom.py runs the same on a tiny budget -->"
)


def my_task_section(config: ReproduceConfig) -> list[str]:
    """'Does MPO help on my task?': the command on a tiny user env, and how to read it."""

    quick, small, full = (base_config(name, "cpu").budget for name in ("quick", "small", "full"))
    keys = arm_keys("user")
    base = base_config("full", "cpu")
    table1 = [k for k in keys if base.arm(k).study == base.arm("mpo").study]
    return [
        "## Does MPO help on my task?",
        "",
        "The same protocol runs on any environment that implements `MultiTurnEnv` (docs/envs.md): name a "
        "callable that returns a fresh env as `module:factory`. From the repository root, on the tiny example "
        "`examples/my_env.py` (a vault whose secret arrives only in noisy hints):",
        "",
        NOT_RUN_HERE,
        "```bash",
        "mpo-rs reproduce --env examples.my_env:make --arms mpo,ppo,grpo --budget small --out my-run",
        "```",
        "",
        "or from Python (the command calls the same function):",
        "",
        NOT_RUN_HERE,
        "```python",
        "from mpo_lab.reproduce import compare",
        "",
        'result = compare("examples.my_env:make", arms=("mpo", "ppo", "grpo"), seeds=5, budget="small", out="my-run")',
        "for c in result.confirmatory:  # MPO - PPO, MPO - GRPO: paired by seed, Holm-corrected",
        "    print(c.what, round(c.diff, 3), round(c.half_width, 3), c.verdict)",
        "```",
        "",
        f"- `--arms`: any of {', '.join(keys)} (default: {', '.join(table1)}); `--env-param KEY=VALUE` passes "
        "a keyword argument to the factory; `--seeds N` and `--first-seed S` choose the seeds.",
        f"- `--budget`: `quick` (the default: {quick.updates} updates of {quick.episodes_per_update} episodes, a smoke test that "
        f"says nothing about MPO), `small` ({small.updates} updates of {small.episodes_per_update}: a first look) or "
        f"`full` ({full.updates} updates of {full.episodes_per_update}, the reported run's).",
        "- The page it writes opens with the same summary: per comparison MPO - X, the paired difference, its "
        "95% half-width and the Holm verdict. *Inconclusive* with a half-width larger than the gain that matters "
        "to you asks for more seeds, not for the conclusion that MPO does nothing. A verdict needs a task that "
        "passes its gates (docs/instrument.md): on your environment the learning gate (GRPO and PPO beat their "
        "base) and the exploration gate (the base's entropy and varied groups). Without a base policy the arms "
        "start from a random initialisation, with no base whose gates the run could measure, and every "
        "comparison is shown with **no verdict**; give one with `--demonstrator module:callable` (cloned as the "
        "built-in tasks' bases are) or `--base-policy FILE` "
        "([docs/envs.md](envs.md#where-the-arms-start-a-base-policy-of-your-own)).",
        "- Whether MPO should help: its premise is that value changes at turn boundaries, where observations "
        "bring information. `mpo-rs diagnose OUT/rollouts/mpo-seed1.parquet` measures the between-turn share "
        "of the trained critic's value variance; docs/envs.md measures it before training for the built-in "
        "tasks, on KeyDoor (where the premise fails) and on the tasks where it holds.",
        "- An output directory holds one configuration: its hash covers the env's `module:factory` and "
        "parameters, the arms, the seeds and the budget. The same command resumes the finished runs; another "
        "env or parameter is refused there.",
        "",
    ]
