"""When does MPO help? Paired gains along the axes the instrument varies (numpy only).

- **critic quality** (:mod:`.ladder`): on one task, each critic arm read the reference critic
  degraded to a fraction k of its explained variance; :func:`ladder_gains` gives, per rung,
  the explained variance the arms' critics measured, each arm's paired gain over GRPO (the
  critic-free arm of the same seeds) and MPO's paired gain over PPO at that rung, beside the
  same for the learned critics;
- **turn length** (Search's ``think_tokens``, one task variant per F): :func:`turn_length_gains`
  gives, per variant, MPO's paired gain over PPO and over GRPO;
- **the premise** (each task's between-turn share on its base, from its gates):
  :func:`task_gains` gives per task the share, the learned critics' explained variance and the
  same two gains.

:func:`when_section` writes them as the page's first screen ("When does MPO help?"), in words
read off the intervals (:func:`~mpo_lab.reproduce.stats.direction_words`): a gain whose interval
holds 0 is "no difference shown", never "equal".

Every gain is paired by seed (:func:`~mpo_lab.reproduce.stats.paired_diff_ci`: mean and 95%
interval) on one metric, uncorrected; where a gain is also one of the analysis plan's
confirmatory comparisons, :func:`when_section` writes its Holm verdict beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .analysis import METRIC_NAMES
from .ladder import LADDER
from .rows import by_seed, nanmean, task_title
from .stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, direction_words, paired_diff_ci
from .tasks import MAIN_TASK, task_prefix

__all__ = [
    "LADDER_METHODS",
    "WHEN_TITLE",
    "ladder_gains",
    "ladder_table",
    "task_gains",
    "turn_length_gains",
    "when_inputs",
    "when_section",
]

WHEN_TITLE = "When does MPO help?"
"""The first screen's heading and its figure's title."""

LADDER_METHODS = {
    "mpo": "MPO",
    "ppo": "PPO",
    "areal_turn_gae": "turn-level GAE (AReaL)",
    "ragen_bilevel": "bi-level GAE (RAGEN)",
}
"""The ladder's critic arms (key suffix -> label), in the ladder's order."""


def _gain(rows: Sequence[dict[str, Any]], a: str, b: str, metric: str) -> dict[str, float]:
    p = paired_diff_ci(by_seed(list(rows), metric, a), by_seed(list(rows), metric, b))
    return {"diff": p.diff, "low": p.low, "high": p.high, "n": float(p.n)}


def ladder_gains(rows: Sequence[dict[str, Any]], task: str, metric: str = "final_success") -> list[dict[str, Any]]:
    """One entry per rung of the ladder on ``task`` (``k`` = 1, 0.75, ..., 0) and one for the
    learned critics (``k`` None) where they ran: ``ev`` (each method's measured explained
    variance at the end, mean over seeds), ``gain_over_grpo`` (method -> paired gain) and
    ``mpo_minus_ppo`` (paired). Methods without runs are left out."""
    p = task_prefix(task)
    present = {str(r["arm"]) for r in rows}
    grpo = f"{p}grpo"
    rungs: list[tuple[float | None, dict[str, str]]] = [
        (k, {m: f"{p}{m}_ref{k:g}" for m in LADDER_METHODS}) for k in LADDER
    ]
    rungs.append((None, {"mpo": f"{p}mpo", "ppo": f"{p}ppo"}))
    out = []
    for k, keys in rungs:
        keys = {m: key for m, key in keys.items() if key in present}
        if not keys:
            continue
        entry: dict[str, Any] = {
            "k": k,
            "critic": "learned" if k is None else ("reference" if k == 1.0 else f"reference x{k:g}"),
            "ev": {
                m: nanmean([float(r["final_explained_variance"]) for r in rows if r["arm"] == key])
                for m, key in keys.items()
            },
            "gain_over_grpo": {m: _gain(rows, key, grpo, metric) for m, key in keys.items()} if grpo in present else {},
            "mpo_minus_ppo": _gain(rows, keys["mpo"], keys["ppo"], metric) if {"mpo", "ppo"} <= set(keys) else None,
        }
        out.append(entry)
    return out


def _ci(g: Mapping[str, float] | None) -> str:
    if g is None or not math.isfinite(g["diff"]):
        return "—"
    if not math.isfinite(g["low"]):
        return f"{g['diff']:+.3f}"
    return f"{g['diff']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]"


def ladder_table(entries: Sequence[Mapping[str, Any]]) -> str:
    """:func:`ladder_gains` as a Markdown table: per rung, the critics' measured explained
    variance (MPO's / PPO's), each method's gain over GRPO and MPO − PPO."""
    methods = [m for m in LADDER_METHODS if any(m in e["gain_over_grpo"] for e in entries)]
    head = "| critic | explained variance (MPO / PPO) | " + " | ".join(f"{LADDER_METHODS[m]} − GRPO" for m in methods)
    lines = [head + " | MPO − PPO |", "|---|---|" + "---|" * len(methods) + "---|"]
    for e in entries:
        ev = " / ".join(
            f"{e['ev'][m]:.2f}" if m in e["ev"] and math.isfinite(e["ev"][m]) else "—" for m in ("mpo", "ppo")
        )
        cells = [_ci(e["gain_over_grpo"].get(m)) for m in methods]
        lines.append(f"| {e['critic']} | {ev} | " + " | ".join(cells) + f" | {_ci(e['mpo_minus_ppo'])} |")
    return "\n".join(lines)


def task_gains(
    rows: Sequence[dict[str, Any]],
    tasks: Sequence[str],
    shares: Mapping[str, float] | None = None,
    metric: str = "final_success",
) -> list[dict[str, Any]]:
    """Per task (or variant: ``search``, ``search@think16``, ...): its ``think_tokens`` (from
    the rows; None where they differ), its between-turn ``share`` (from ``shares``, NaN where
    not given), ``ev`` (the learned MPO's and PPO's explained variance at the end, mean over
    seeds), MPO − PPO and MPO − GRPO, paired by seed."""
    out = []
    for task in tasks:
        p = task_prefix(task)
        mine = [r for r in rows if str(r["arm"]).startswith(p) and r.get("task", task) == task]
        think = {int(r.get("think_tokens", 0)) for r in mine}
        out.append(
            {
                "task": task,
                "think_tokens": think.pop() if len(think) == 1 else None,
                "share": float((shares or {}).get(task, math.nan)),
                "ev": {
                    m: nanmean([float(r["final_explained_variance"]) for r in mine if r["arm"] == f"{p}{m}"])
                    for m in ("mpo", "ppo")
                },
                "mpo_minus_ppo": _gain(rows, f"{p}mpo", f"{p}ppo", metric),
                "mpo_minus_grpo": _gain(rows, f"{p}mpo", f"{p}grpo", metric),
            }
        )
    return out


def turn_length_gains(
    rows: Sequence[dict[str, Any]], tasks: Sequence[str], metric: str = "final_success"
) -> list[dict[str, Any]]:
    """:func:`task_gains` of the variants ``tasks`` of one environment that differ in turn length."""
    return task_gains(rows, tasks, metric=metric)


def _words(a: str, b: str, g: Mapping[str, float] | None) -> str:
    """A paired gain in words: ahead or behind where its 95% interval excludes 0."""
    if g is None or not math.isfinite(g["diff"]):
        return f"{a} − {b}: not measured"
    half = (g["high"] - g["low"]) / 2 if math.isfinite(g["low"]) else math.nan
    decided = INCONCLUSIVE
    if math.isfinite(g["low"]) and g["low"] > 0:
        decided = REPRODUCED
    elif math.isfinite(g["high"]) and g["high"] < 0:
        decided = NOT_REPRODUCED
    return direction_words(a, b, g["diff"], half, decided)


def when_section(
    rows: Sequence[dict[str, Any]],
    tasks: Sequence[str],
    main_task: str,
    *,
    shares: Mapping[str, float] | None = None,
    figure: str | None = None,
    metric: str = "final_success",
    withheld: Mapping[str, str] | None = None,
    holm: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """The page's first screen, "When does MPO help?": MPO's paired gains over PPO and GRPO
    per task against its turn length and between-turn share (:func:`task_gains`), then along
    the critic-quality ladder on ``main_task`` where it ran (:func:`ladder_gains`), each in
    words read off its interval; ``figure``: the figure's path on the page, drawn by
    :func:`~mpo_lab.reproduce.figures.plot_when`. Gains are paired by seed, per comparison, with
    no Holm adjustment (a map, not a verdict); ``holm`` ((arm, arm) -> verdict on ``metric``):
    the plan's confirmatory comparisons among them, whose Holm verdict is written beside the
    uncorrected reading. A task in ``withheld`` (task -> why, :func:`~mpo_lab.reproduce.gating.withheld`) fails its gates: its
    gains are shown as numbers, never read in words."""
    per_task = task_gains(rows, tasks, shares, metric)
    ladder = ladder_gains(rows, main_task, metric)
    if all(e["k"] is None for e in ladder):  # the learned critics alone: no ladder ran
        ladder = []
    withheld, holm = withheld or {}, holm or {}
    # Per task, the Holm verdict of MPO against each baseline where that gain is confirmatory.
    verdicts = {
        t["task"]: {
            b: holm.get((f"{task_prefix(t['task'])}mpo", f"{task_prefix(t['task'])}{b}")) for b in ("ppo", "grpo")
        }
        for t in per_task
    }
    reading = (
        "Each cell reads its own interval, uncorrected (a map, not a verdict); where it is also one of the plan's "
        "confirmatory comparisons, its Holm-corrected verdict follows it (the Summary's table)."
        if any(v is not None for task in verdicts.values() for v in task.values())
        else "Each row is one comparison, exploratory (none of the plan's confirmatory comparisons): where the "
        "interval holds 0 the words say so."
    )
    lines = [
        f"## {WHEN_TITLE}",
        "",
        f"MPO's paired gain ({METRIC_NAMES.get(metric, metric)}, mean and 95% interval over seeds) over PPO, "
        f"which reads the same critic token by token, and over GRPO, which has none. {reading} A log of your own "
        "sits on this map through `mpo-rs diagnose`: its between-turn share and its critic's explained variance "
        "are the two columns to compare.",
        "",
    ]
    if figure:
        lines += [f"![{WHEN_TITLE}]({figure})", ""]
    lines += [
        "| task | thinking tokens per turn | between-turn share | critic explained variance (MPO / PPO) "
        "| MPO − PPO | MPO − GRPO |",
        "|---|---|---|---|---|---|",
    ]
    for t in per_task:
        ev = " / ".join(f"{t['ev'][m]:.2f}" if math.isfinite(t["ev"][m]) else "—" for m in ("mpo", "ppo"))
        share = f"{t['share']:.2f}" if math.isfinite(t["share"]) else "—"
        think = "—" if t["think_tokens"] is None else str(t["think_tokens"])
        if withheld.get(t["task"]):  # a task that fails its gates is shown, never read
            gains = f"{_ci(t['mpo_minus_ppo'])} | {_ci(t['mpo_minus_grpo'])}"
            name = f"{task_title(t['task'])} (no reading: {withheld[t['task']]})"
        else:
            verdict = verdicts[t["task"]]
            gains = " | ".join(
                _words("MPO", label, t[f"mpo_minus_{b}"])
                + (f" (uncorrected; Holm: {verdict[b]})" if verdict[b] is not None else "")
                for b, label in (("ppo", "PPO"), ("grpo", "GRPO"))
            )
            name = task_title(t["task"])
        lines.append(f"| {name} | {think} | {share} | {ev} | {gains} |")
    if ladder:
        lines += [
            "",
            f"Along the critic-quality ladder on {task_title(main_task)} (the reference critic kept at a fraction of "
            "its explained variance; GRPO is the same seeds' critic-free arm):",
            "",
            ladder_table(ladder),
        ]
    return [*lines, ""]


def when_inputs(
    config: Any, rows: Sequence[Mapping[str, Any]], gates: Mapping[str, Any]
) -> tuple[list[str], str, dict[str, float]]:
    """What the first screen reads of a run: the tasks with an MPO and a PPO arm among the
    ``rows``, the task the ladder ran on (else the main task, or the first) and each task's
    between-turn share on its base (the mean over the seeds of ``gates``, results.json's
    section; tasks not measured are left out)."""
    present = {str(r["arm"]) for r in rows}
    tasks = [
        spec.name
        for spec in config.tasks
        if {f"{task_prefix(spec.name)}mpo", f"{task_prefix(spec.name)}ppo"} <= present
    ]
    shares = {}
    for task, entry in gates.get("tasks", {}).items():
        values = [float(b["between_share"]) for b in entry.get("base") or [] if b.get("between_share") is not None]
        if values:
            shares[task] = sum(values) / len(values)
    laddered = [a.task for a in config.arms if a.study == "ladder" and a.key in present]
    if laddered:
        return tasks, laddered[0], shares
    return tasks, (MAIN_TASK if MAIN_TASK in tasks or not tasks else tasks[0]), shares
