"""The page's first screen: the confirmatory comparisons' tally and the decided ones, the
arms' point estimates per task, the confirmatory comparisons' verdicts per task and the
caveats (:meth:`Summary.summary`, also ``results.json``'s ``summary``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .analysis import ALPHA, CRITIC_EV_FLOOR, METRIC_NAMES, Claim, Comparison, ppo_critic_share
from .config import Arm, ReproduceConfig
from .page_text import cell, counts, fmt, power_text, tally
from .plan import AnalysisPlan, plan_for
from .rows import nanmean, task_title
from .stats import (
    INCONCLUSIVE,
    NO_VERDICT,
    mean_ci,
)


@dataclass
class Summary:
    """What the page is made from, and its first screen."""

    config: ReproduceConfig
    rows: list[dict[str, Any]]
    found: list[Claim]
    confirmatory_comps: list[Comparison]
    chance: dict[str, tuple[float, str]]
    meta: dict[str, Any]
    captions: dict[str, str]
    design: dict[str, Any] = field(default_factory=dict)
    """What the design section reads beside the runs: ``premise`` (the premise measurement's
    results, docs/premise.json) and ``sizing`` (:func:`mpo_lab.reproduce.plan.sizing` of the
    pilot's results, docs/pilot/results.json); either may be absent."""
    gates: dict[str, Any] = field(default_factory=dict)
    """``results.json``'s ``gates`` (:func:`mpo_lab.reproduce.gating.gates_section`)."""
    plan_hash: str = ""
    """The hash of the analysis plan the run followed ('': today's)."""

    def summary(self) -> str:
        """The bottom line: the confirmatory comparisons' tally and the decided ones, a table of the
        arms' point estimates per task, a table of their paired verdicts per task, the caveats."""
        ran = [spec.name for spec in self.config.tasks if self._task_arms(spec.name)]
        if not ran:
            return ""
        # The plan's order (the main task first, the controls last), then the rest.
        tasks = list(dict.fromkeys([*(self._task_of(c) for c in self.confirmatory_comps), *ran]))
        tasks = [t for t in tasks if t in ran]
        lines = [self._bottom_line(), "", *self._estimates_table(tasks), ""]
        if self.confirmatory_comps:
            lines += [*self._confirmatory_table(), ""]
        caveats = []
        for task in tasks:
            found = self._caveats(self._task_arms(task), self.chance.get(task, (math.nan, ""))[0])
            if found:
                caveats.append(f"- **{task_title(task)}**: " + "; ".join(found) + ".")
        if caveats:
            lines += ["Caveats:", "", *caveats, ""]
        return "\n".join(lines).rstrip()

    def _task_arms(self, task: str) -> list[Arm]:
        present = {r["arm"] for r in self.rows}
        return [a for a in self.config.arms if a.task == task and a.key in present]

    def _values(self, key: str, metric: str) -> list[float]:
        return [float(r.get(metric, math.nan)) for r in self.rows if r["arm"] == key]

    def _bottom_line(self) -> str:
        comps = self.confirmatory_comps
        others = self._other_comparisons()
        if not comps:
            return (
                "**Bottom line.** None of the analysis plan's confirmatory comparisons is among these arms. "
                + tally(others, "The comparisons of the claims (uncorrected, exploratory)")
            )
        pairs = len({(c.a, c.b) for c in comps})
        metrics = " and ".join(METRIC_NAMES.get(m, m) for m in dict.fromkeys(c.metric for c in comps))
        seeds = sorted({c.n for c in comps if c.n})
        n = "no" if not seeds else f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        text = (
            f"**Bottom line.** {len(comps)} comparisons were fixed in advance by the analysis plan "
            f"`{self.run_plan()}` ({pairs} pair(s) of arms, each on {metrics}), paired by seed over {n} seed(s) and "
            f"Holm-corrected at alpha = {ALPHA:g}"
        )
        if self.run_plan() != self.plan.plan_hash():
            text += (
                f" (read here by the current plan `{self.plan.plan_hash()}`, whose gates and equivalence margins apply)"
            )
        if all(c.verdict == NO_VERDICT for c in comps):
            text += (
                ": **none gets a verdict**, because no task of this run passes its gates (see Gates: "
                + self._withheld_text(comps)
                + "). Their differences, intervals and Holm-adjusted p-values are shown below for the record; "
                "none is read as a verdict or as equivalence. " + power_text(comps)
            )
            if others:
                text += " " + tally(
                    others, "The other comparisons of the claims (uncorrected, exploratory; see Claims)"
                )
            return text
        text += ": " + counts(comps) + ". " + power_text(comps)
        decided = [c for c in comps if c.verdict not in (INCONCLUSIVE, NO_VERDICT)]
        if len(decided) > 6:  # too many for a sentence: per task, the table has them in bold
            tasks = dict.fromkeys(self._task_of(c) for c in decided)
            text += (
                " Decided (in bold in the confirmatory comparisons' table below): "
                + "; ".join(
                    f"{task_title(t)} {counts([c for c in decided if self._task_of(c) == t], decided_only=True)}"
                    for t in tasks
                )
                + "."
            )
        elif decided:
            text += (
                " Decided: "
                + "; ".join(
                    f"{task_title(self._task_of(c))}, {c.what} ({METRIC_NAMES.get(c.metric, c.metric)}) "
                    f"{c.diff:+.3f} ± {c.half_width:.3f} → **{c.verdict}**"
                    for c in decided
                )
                + "."
            )
        else:
            text += " None is decided."
        text += self._bounded(comps)
        if any(c.verdict == NO_VERDICT for c in comps):
            text += (
                f" {sum(c.verdict == NO_VERDICT for c in comps)} get no verdict because their task does not pass "
                f"its gates ({self._withheld_text(comps)})."
            )
        if others:
            text += " " + tally(others, "The other comparisons of the claims (uncorrected, exploratory; see Claims)")
        return text

    @property
    def plan(self) -> AnalysisPlan:
        """The analysis plan of the run's configuration."""
        return plan_for(self.config)

    def run_plan(self) -> str:
        """The hash of the analysis plan the run followed."""
        return self.plan_hash or self.plan.plan_hash()

    def _withheld_text(self, comps: list[Comparison]) -> str:
        """The tasks whose comparisons get no verdict, grouped by why."""
        why: dict[str, list[str]] = {}
        for c in comps:
            if c.verdict == NO_VERDICT:
                tasks = why.setdefault(c.withheld, [])
                if task_title(self._task_of(c)) not in tasks:
                    tasks.append(task_title(self._task_of(c)))
        return "; ".join(f"{', '.join(tasks)}: {reason}" for reason, tasks in why.items())

    def _bounded(self, comps: list[Comparison]) -> str:
        """What an undecided comparison on a gated task says: equivalent within the plan's margin
        (both one-sided tests reject) or no difference shown; never "equal" otherwise."""
        open_ = [c for c in comps if c.verdict == INCONCLUSIVE and math.isfinite(c.low) and math.isfinite(c.high)]
        if not open_:
            return ""
        same = [c for c in open_ if c.reading().startswith("equivalent")]
        margins = " and ".join(f"±{m:g} on {METRIC_NAMES.get(k, k)}" for k, m in self.plan.equivalence_margins)
        if not same:
            return (
                f" The {len(open_)} undecided show no difference; none is read as equivalence, which needs both "
                f"one-sided paired tests to reject at {ALPHA:g} within the plan's margin ({margins}) on a "
                "task that passes its gates."
            )
        return (
            f" Of the {len(open_)} undecided, {len(same)} are equivalent within the plan's margin ({margins}; "
            f"both one-sided paired tests reject at {ALPHA:g}) and {len(open_) - len(same)} show no "
            "difference (not equivalence)."
        )

    def _other_comparisons(self) -> list[Comparison]:
        confirmatory = {(c.metric, c.a, c.b) for c in self.confirmatory_comps}
        return [
            c for claim in self.found for c in claim.comparisons if c.b and (c.metric, c.a, c.b) not in confirmatory
        ]

    def _task_of(self, comp: Comparison) -> str:
        arms = {a.key: a for a in self.config.arms}
        arm = arms.get(comp.a)
        return arm.task if arm is not None else ""

    def _estimates_table(self, tasks: list[str]) -> list[str]:
        """Tasks x arms: each arm's mean over seeds on the plan's metrics, beside the base
        policy's held-out success every arm starts from ("scratch" where the arms start from a
        random initialisation). The columns are the arms every task runs (Table 1's); a task's
        other arms are in the confirmatory comparisons' table and in "Results per arm"."""
        by_task = {t: self._task_arms(t) for t in tasks}
        labels = list(dict.fromkeys(a.label for a in by_task[tasks[0]]))
        if len(tasks) > 1:
            labels = [x for x in labels if all(any(a.label == x for a in arms) for arms in by_task.values())]
        metrics = self.plan.metrics
        names = " / ".join(METRIC_NAMES.get(m, m) for m in metrics)
        lines = [
            f"Mean over seeds of each arm's {names}:",
            "",
            "| task | chance | seeds | base policy | PPO critic's between-turn share | " + " | ".join(labels) + " |",
            "|---|---:|---:|---:|---:|" + "---:|" * len(labels),
        ]
        for task in tasks:
            arms = {a.label: a for a in by_task[task]}
            mine = [r for r in self.rows if r["arm"] in {a.key for a in by_task[task]}]
            seeds = len({int(r["seed"]) for r in mine})
            # Where every arm of a seed starts: its held-out success, the same for each arm of the seed.
            base = nanmean(list({int(r["seed"]): float(r.get("base_success", math.nan)) for r in mine}.values()))
            share = ppo_critic_share(self.rows, task)
            chance = fmt(self.chance.get(task, (math.nan, ""))[0])
            cells = [
                task_title(task),
                chance,
                str(seeds),
                fmt(base, 2) if math.isfinite(base) else "scratch",
                fmt(share, 2),
            ]
            for label in labels:
                arm = arms.get(label)
                cells.append(
                    "—" if arm is None else " / ".join(fmt(nanmean(self._values(arm.key, m)), 2) for m in metrics)
                )
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def _confirmatory_table(self) -> list[str]:
        """The confirmatory comparisons, one row per task and pair of arms, one column per metric:
        paired difference ± half-width, Holm-adjusted p, verdict (bold when decided)."""
        metrics = list(dict.fromkeys(c.metric for c in self.confirmatory_comps))
        rows: dict[tuple[str, str], dict[str, Comparison]] = {}
        for c in self.confirmatory_comps:
            rows.setdefault((self._task_of(c), c.what), {})[c.metric] = c
        lines = [
            "The confirmatory comparisons, paired by seed (difference of means ± 95% half-width, Holm-adjusted p, "
            "verdict or reading):",
            "",
            "| task | comparison | " + " | ".join(METRIC_NAMES.get(m, m) for m in metrics) + " |",
            "|---|---|" + "---|" * len(metrics),
        ]
        for (task, what), by_metric in rows.items():
            cells = [task_title(task), what] + [cell(by_metric.get(m)) for m in metrics]
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def _caveats(self, arms: list[Arm], chance: float) -> list[str]:
        out = []
        counts = [len([x for x in self._values(a.key, "final_success") if math.isfinite(x)]) for a in arms]
        if counts and min(counts) < 2:
            out.append("one seed per arm, so there are no intervals and nothing is decided")
        critics = [a for a in arms if a.trains_critic]
        ev = {a.label: nanmean(self._values(a.key, "final_explained_variance")) for a in critics}
        low = {name: v for name, v in ev.items() if math.isfinite(v) and v < CRITIC_EV_FLOOR}
        if critics and len(low) == len(critics):
            out.append(
                f"the critics never learned: every critic's explained variance at the end is below "
                f"{CRITIC_EV_FLOOR:g} (at most {max(low.values()):.2f}), so GAE and MAE ran on near-constant values"
            )
        elif low:
            names = ", ".join(f"{name} ({v:.2f})" for name, v in low.items())
            out.append(
                f"the critic never learned for {names} (explained variance at the end below {CRITIC_EV_FLOOR:g})"
            )
        if math.isfinite(chance) and arms:
            near = []
            for a in arms:
                mean, lo, _, _ = mean_ci(self._values(a.key, "final_success"))
                near.append((lo if math.isfinite(lo) else mean) <= chance)
            if all(near):
                out.append(f"no arm's final success is distinguishable from chance ({fmt(chance)})")
        return out
