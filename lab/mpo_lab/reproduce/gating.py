"""The gates in a run's results and on its page (numpy only; measuring needs torch).

A comparison of arms counts -- gets a verdict, and an undecided one an equivalence reading --
only on a task that passes every gate of its role (the analysis plan's rule, :mod:`.plan`;
the gates themselves: :mod:`.gates`). Here:

- where a run's measurements of its base policies come from: a gates file of a pilot
  (:func:`read_gates_file`, what ``mpo-lab gates --json`` writes; given to
  a run as ``mpo-rs reproduce --gates FILE``), else the run's own base policies
  (:func:`measure_own`, on its first two seeds: "measured on this run's own seeds, not a
  pilot's"). The quick budget measures its one seed on a handful of rollouts
  (:func:`own_measurement_size`), so that the smoke test runs the path in seconds; its numbers
  say nothing. A run without base policies (a user's environment, trained from a random
  initialisation) has no base-policy gates measured;
- ``results.json``'s ``gates`` section (:func:`gates_section`): per task its role, the base
  policy's measurements per seed, the learning measurement from the run's rows and the judged
  gates, and whether the task's comparisons count; a results.json written before runs
  carried gates has none, and reads "not measured" (no verdict on any task);
- which tasks' comparisons get no verdict, and why (:func:`withheld`);
- the page's "Gates" section (:func:`gates_markdown`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mpo_rs.exceptions import InvalidOptionError

from .budgets import budget_name
from .config import ReproduceConfig
from .gate_rules import GATES, GateResult, base_measurement, judge, learning_measurement
from .rows import task_title
from .tasks import ROLES, task_prefix, task_role

__all__ = [
    "OWN_SEEDS",
    "gates_markdown",
    "gates_section",
    "measure_own",
    "own_measurement_size",
    "read_gates_file",
    "withheld",
]

OWN_SEEDS = 2
"""The seeds whose base policies a run measures itself when no gates file is given (its first)."""

ROLE_WORDS = {
    "premise": "premise task",
    "control": "negative control",
    "chance": "control at chance",
    "user": "user environment",
}


def own_measurement_size(config: ReproduceConfig) -> tuple[int, int, int]:
    """(seeds, tasks, rollouts per task) a run measures its own base policies with: the gates
    command's 64 tasks x 16 rollouts on the first :data:`OWN_SEEDS` seeds; the quick budget's
    smoke test, its evaluation's tasks x one GRPO group on its first seed (seconds)."""
    if budget_name(config) == "quick":
        return 1, config.budget.eval_tasks, config.budget.group_size
    return min(OWN_SEEDS, config.seeds), 64, 16


def measure_own(
    config: ReproduceConfig, out_dir: str | os.PathLike[str], note: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """The base-policy measurements of a run's own base policies (cached under ``out_dir/base``
    by the run), per task on the first seeds (:func:`own_measurement_size`); without a base
    policy (a configuration with ``base=None``: a user environment without a demonstrator or a
    policy of its own) nothing is measured, and a user environment's base is measured for its
    exploration only (it has no belief model for the critic ceiling and the premise)."""
    seeds, tasks, group = own_measurement_size(config)
    measured: dict[str, Any] = {}
    for spec in config.tasks:
        if config.base is None:
            continue
        base = []
        for seed in config.seed_list[:seeds]:
            base.append(base_measurement(config, spec.name, seed, tasks=tasks, group=group, cache=Path(out_dir)))
            shown = ("entropy", "distinct_groups", "critic_ceiling", "between_share")
            note(f"gates, {spec.name} seed {seed}: " + ", ".join(f"{k} {_num(base[-1].get(k))}" for k in shown))
        measured[spec.name] = {"base": base}
    size = {"seeds": list(config.seed_list[:seeds]), "tasks": tasks, "group": group}
    return {"source": "run", "size": size, "tasks": measured}


def _num(x: Any) -> str:
    """A measurement in a progress line (None or NaN where too few rollouts left it undefined)."""
    return f"{x:.3f}" if isinstance(x, (int, float)) else str(x)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON writes them (a tuple read back is a list)."""
    return bool(json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str))


def read_gates_file(path: str | os.PathLike[str], config: ReproduceConfig) -> dict[str, Any]:
    """The base-policy measurements of ``config``'s tasks in a gates file (the gates command's
    ``--json``, :func:`~mpo_lab.reproduce.gates.gates_payload`), by task name; a task the file
    has not measured stays not measured. Raises InvalidOptionError when the file cannot be read
    or measured a task of the same name with other parameters (another task)."""
    try:
        payload = json.loads(Path(path).read_text())
        entries = list(payload["tasks"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidOptionError(f"--gates {path}: not a gates file ({e})") from None
    specs = {spec.name: spec for spec in config.tasks}
    measured: dict[str, Any] = {}
    for entry in entries:
        spec = specs.get(str(entry.get("task")))
        if spec is None:
            continue
        if not _same(entry.get("params", {}), dict(spec.params)):
            raise InvalidOptionError(
                f"--gates {path}: {spec.name} was measured with {entry.get('params')}, this configuration "
                f"runs it with {dict(spec.params)}"
            )
        measured[spec.name] = {"base": list(entry.get("base") or []), "pilot_learned": entry.get("learned")}
    return {"source": "file", "file": Path(path).name, "file_config": str(payload.get("config", "")), "tasks": measured}


def _reason(judged: Sequence[GateResult]) -> str:
    """Why a task's comparisons get no verdict ('' when it passes every gate)."""
    failed = [r.gate for r in judged if r.passed is False]
    missing = [r.gate for r in judged if r.passed is None]
    parts = []
    if failed:
        parts.append(f"the task fails the {_and(failed)} gate{'s' if len(failed) > 1 else ''}")
    if missing:
        parts.append(f"its {_and(missing)} gate{'s were' if len(missing) > 1 else ' was'} not measured")
    return ", and ".join(parts)


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def gates_section(
    config: ReproduceConfig, rows: Sequence[Mapping[str, Any]], measured: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``results.json``'s ``gates``: per task that ran, its ``role``, ``base`` (the base policy's
    measurements per seed, from ``measured``: :func:`measure_own`, :func:`read_gates_file` or
    an earlier section; None: not measured), ``learned`` (from the run's ``rows``),
    ``judged`` (:func:`~mpo_lab.reproduce.gate_rules.judge` with the plan's thresholds),
    ``counts`` (every gate passed) and ``withheld`` (why not, else '')."""
    measured = measured or {"source": "none", "tasks": {}}
    present = {str(r["arm"]) for r in rows}
    tasks: dict[str, Any] = {}
    for spec in config.tasks:
        if not any(a.task == spec.name and a.key in present for a in config.arms):
            continue
        role = task_role(spec.name)
        entry = dict(measured.get("tasks", {}).get(spec.name, {}))
        base = list(entry.get("base") or [])
        learned = learning_measurement(rows, task_prefix(spec.name))
        judged = judge(role, base, learned)
        reason = _reason(judged)
        tasks[spec.name] = {
            "role": role,
            "base": base,
            "learned": learned,
            "judged": [dataclasses.asdict(r) for r in judged],
            "counts": not reason,
            "withheld": reason,
        }
        if entry.get("pilot_learned") is not None:
            tasks[spec.name]["pilot_learned"] = entry["pilot_learned"]
    keep = {k: v for k, v in measured.items() if k not in ("tasks", "thresholds")}
    thresholds = json.loads(json.dumps(dataclasses.asdict(GATES)))  # as results.json keeps them
    return {**keep, "thresholds": thresholds, "tasks": tasks}


def withheld(section: Mapping[str, Any] | None, config: ReproduceConfig) -> dict[str, str]:
    """Task -> why its comparisons get no verdict ('' for a task that passes every gate), for
    every task of ``config``; a task the section does not hold was not measured."""
    tasks = (section or {}).get("tasks", {})
    return {
        spec.name: str(tasks[spec.name]["withheld"]) if spec.name in tasks else "its gates were not measured"
        for spec in config.tasks
    }


def _source_text(section: Mapping[str, Any]) -> str:
    source = section.get("source", "none")
    if source == "file":
        return (
            f"The base policy's gates are read from the gates file `{section.get('file', '')}` (the gates "
            f"command's measurement of the configuration `{section.get('file_config', '')}`, on a pilot's seeds); "
            "the learning and learned-critic gates are this run's."
        )
    if source == "run":
        size = section.get("size", {})
        seeds = ", ".join(str(s) for s in size.get("seeds", []))
        return (
            f"The base policy's gates were measured on this run's own seeds, not a pilot's (seed(s) {seeds}, "
            f"{size.get('tasks')} tasks x {size.get('group')} rollouts each at temperature 1); the learning and "
            "learned-critic gates are this run's."
        )
    return (
        "This run's results carry no measurement of its base policies: the exploration, predictability and "
        "premise gates were not measured for it. The learning gate is read from the run's own rows (each "
        "arm's final held-out success against its base policy's, paired by seed)."
    )


def gates_markdown(section: Mapping[str, Any], plan_hash: str, record: str = "docs/analysis-plan.md") -> list[str]:
    """The page's "Gates" section: the rule and where the measurements come from (the plan
    ``plan_hash``, committed as ``record``), then per task its role, whether its comparisons
    count, and its gates as a table."""
    tasks = section.get("tasks", {})
    if not tasks:
        return []
    counted = [t for t, v in tasks.items() if v["counts"]]
    lines = [
        "## Gates",
        "",
        "A comparison counts -- gets a verdict, and an undecided one an equivalence reading -- only on a task "
        f"that passes every gate of its role (the analysis plan `{plan_hash}`, {record}; what each "
        "gate measures: docs/instrument.md). "
        + _source_text(section)
        + " "
        + (
            f"Gated: {', '.join(task_title(t) for t in counted)}."
            if counted
            else "No task passes every gate, so no comparison on this page gets a verdict."
        ),
        "",
    ]
    order = sorted(tasks, key=lambda t: ROLES.index(tasks[t]["role"]) if tasks[t]["role"] in ROLES else len(ROLES))
    for task in order:
        entry = tasks[task]
        role = ROLE_WORDS.get(entry["role"], entry["role"])
        verdict = "its comparisons count" if entry["counts"] else f"no verdict: {entry['withheld']}"
        lines += [
            f"### {task_title(task)} ({role})",
            "",
            f"{verdict[0].upper()}{verdict[1:]}.",
            "",
            "| gate | measured | threshold | passes |",
            "|---|---|---|---|",
        ]
        for r in entry["judged"]:
            passed = "—" if r["passed"] is None else ("yes" if r["passed"] else "**no**")
            lines.append(f"| {r['gate']} | {r['measured']} | {r['threshold']} | {passed} |")
        lines.append("")
    return lines
