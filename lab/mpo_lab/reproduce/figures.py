"""The report's figures: learning curves, final-success bars, the confirmatory comparisons at a glance and the
critics' value-structure diagnosis (matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpo_rs.outputs import figure_bytes, output_subdir, write_file

from .analysis import METRIC_NAMES, Comparison
from .config import BETA_SWEEP, LAMBDA_GRID, ReproduceConfig
from .page_text import fmt
from .rows import by_arm, nanmean, task_title
from .stats import (
    INCONCLUSIVE,
    NO_VERDICT,
    NOT_REPRODUCED,
    REPRODUCED,
    mean_ci,
)

CURVE_PANELS = (
    ("success", "validation success (held-out, T=1)"),
    ("entropy", "policy entropy (nats/token)"),
    ("explained_variance", "critic explained variance"),
    ("turns", "turns per episode"),
    ("response_length", "response length (tokens)"),
)
"""The panels of the paper's Fig. 4, in its order."""


def _curve_matrix(runs: list[dict[str, Any]], arm: str, source: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, values[seed, point]) of one arm's curve; NaN-padded to the longest run."""
    series = [[row.get(metric, math.nan) for row in r[source]] for r in runs if r["arm"] == arm]
    xs = [[row["update"] for row in r[source]] for r in runs if r["arm"] == arm]
    if not series:
        return np.zeros(0), np.zeros((0, 0))
    width = max(len(s) for s in series)
    m = np.full((len(series), width), np.nan)
    for i, s in enumerate(series):
        m[i, : len(s)] = s
    return np.asarray(max(xs, key=len), dtype=np.float64), m


CLIP = {"success": (0.0, 1.0), "turns": (0.0, math.inf), "response_length": (0.0, math.inf)}
"""Where a curve's interval is clipped: a rate to [0, 1], a count to >= 0."""


STUDY_TITLES = {
    "table1": "Table 1",
    "beta": "β",
    "lambda": "(λ, λ_intra)",
    "scale": "Advantage scale",
    "turns": "Table 1 arms",
}
"""How a study's arms are titled in figures (another study by its name)."""


SWEEPS = {
    "beta": [(k, f"β={b:g}") for b, k in sorted(BETA_SWEEP.items())],
    "lambda": [(k, f"({lam:.2f}, {i:.2f})") for (lam, i), k in LAMBDA_GRID.items()],
}
"""Studies shown as a sweep that includes the MPO arm, as bars only (no curves)."""


ANCHORS = {"scale": ("ppo", "mpo")}
"""Arms a study's figures show beside its own (the arms it ablates)."""


@dataclass
class FigureGroup:
    """The arms of one study on one task, as one set of curves and one panel of bars."""

    task: str
    study: str
    title: str
    arms: list[tuple[str, str]]


def figure_groups(config: ReproduceConfig, present: set[str]) -> list[FigureGroup]:
    """Per task (in the configuration's order), per study of arms run on it: the arms to
    draw, with a sweep's MPO arm and a study's anchors."""
    groups = []
    for spec in config.tasks:
        mine = [a for a in config.arms if a.task == spec.name and a.key in present]
        for study in dict.fromkeys(a.study for a in mine):
            if study in SWEEPS:
                arms = SWEEPS[study]
            else:
                anchors = [a for a in mine if a.key in ANCHORS.get(study, ()) and a.study != study]
                arms = [(a.key, a.label) for a in (*anchors, *(a for a in mine if a.study == study))]
            arms = [(k, name) for k, name in arms if k in present and k in {a.key for a in mine}]
            if arms:
                title = f"{STUDY_TITLES.get(study, study)} ({task_title(spec.name).strip('`')})"
                groups.append(FigureGroup(spec.name, study, title, arms))
    return groups


def _band(m: np.ndarray, clip: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cols = [mean_ci(m[:, j]) for j in range(m.shape[1])]
    mean = np.array([c[0] for c in cols])
    low = np.array([c[1] if math.isfinite(c[1]) else c[0] for c in cols])
    high = np.array([c[2] if math.isfinite(c[2]) else c[0] for c in cols])
    if clip is not None:  # a rate's interval ends where the rate does
        low, high = np.clip(low, *clip), np.clip(high, *clip)
    return mean, low, high


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, n: int, cell: tuple[float, float]) -> tuple[Any, list[Any]]:
    """A grid of n panels, 2 columns up to 4 panels and 3 beyond; unused cells hidden."""
    ncols = 1 if n == 1 else 2 if n <= 4 else 3
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell[0] * ncols, cell[1] * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def curve_panels(runs: list[dict[str, Any]], arms: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """(panels to draw, why the others are left out): a panel whose metric takes one value
    on every run and update of these arms (KeyDoor's turns: always max_turns) or none at all
    (explained variance with no critic) is constant by construction and left out."""
    keep, dropped = [], []
    for metric, name in CURVE_PANELS:
        source = "evals" if metric == "success" else "curve"
        values = np.concatenate([_curve_matrix(runs, key, source, metric)[1].ravel() for key, _ in arms])
        values = values[np.isfinite(values)]
        if values.size == 0:
            dropped.append(f"{name} (not defined for these arms)")
        elif metric != "success" and float(values.max()) == float(values.min()):
            dropped.append(f"{name} ({fmt(float(values[0]), 2)} on every run)")
        else:
            keep.append((metric, name))
    return keep, dropped


def plot_curves(
    runs: list[dict[str, Any]],
    arms: list[tuple[str, str]],
    title: str,
    path: Path,
    chance: float | None = None,
) -> tuple[Path, str]:
    """Saves :func:`curves_figure` at ``path``; returns the path and its caption."""
    plt = _pyplot()
    fig, caption = curves_figure(runs, arms, title, chance)
    write_file(path, figure_bytes(fig, dpi=110))
    plt.close(fig)
    return path, caption


def _base_success(runs: list[dict[str, Any]], keys: list[str]) -> float:
    """The mean held-out success of the base policies the runs of ``keys`` start from (one per
    seed); NaN where they start from a random initialisation."""
    per_seed = {
        int(r["seed"]): float((r.get("base") or {}).get("held_out_success", math.nan)) for r in runs if r["arm"] in keys
    }
    finite = [v for v in per_seed.values() if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def curves_figure(
    runs: list[dict[str, Any]], arms: list[tuple[str, str]], title: str, chance: float | None = None
) -> tuple[Any, str]:
    """The learning curves of ``arms`` as a grid of the non-constant panels of
    :data:`CURVE_PANELS` (a matplotlib figure) and a caption naming the panels left out."""
    plt = _pyplot()
    panels, dropped = curve_panels(runs, arms)
    fig, axes = _grid(plt, len(panels), (4.6, 3.1))
    for ax, (metric, name) in zip(axes, panels, strict=True):
        source = "evals" if metric == "success" else "curve"
        lowest = math.inf
        for key, arm_label in arms:
            x, m = _curve_matrix(runs, key, source, metric)
            if m.size == 0 or not np.isfinite(m).any():
                continue
            mean, low, high = _band(m, CLIP.get(metric))
            (line,) = ax.plot(x, mean, label=arm_label)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            lowest = min(lowest, float(np.nanmin(low)))
        if metric == "success":
            ax.set_ylim(-0.02, 1.02)
            if chance is not None:
                ax.axhline(chance, color="grey", linestyle="--", linewidth=1, label="chance")
            base = _base_success(runs, [key for key, _ in arms])
            if math.isfinite(base):  # where every arm starts (its update-0 evaluation is the base's draw)
                ax.axhline(base, color="black", linestyle=":", linewidth=1, label="base policy")
        elif metric == "explained_variance":
            # 1 - Var(G - V) / Var(G) is at most 1; an untrained critic's first updates go far below -1.
            bottom = max(-1.0, min(0.0, lowest) - 0.05)
            ax.set_ylim(bottom, 1.0)
            ax.axhline(0.0, color="grey", linewidth=0.8)
            if lowest < -1.0:
                name += " (axis cut at -1)"
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels() if axes else ([], [])
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: mean and 95% CI over seeds", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    caption = f"Left out, constant by construction: {'; '.join(dropped)}." if dropped else ""
    return fig, caption


def plot_bars(
    rows: list[dict[str, Any]], groups: list[FigureGroup], chance: dict[str, tuple[float, str]], path: Path
) -> Path:
    plt = _pyplot()
    finals = by_arm(rows, "final_success")
    fig, axes = _grid(plt, len(groups), (4.4, 3.6))
    for ax, group in zip(axes, groups, strict=True):
        labels, means, errs = [], [], []
        for key, arm_label in group.arms:
            mean, low, high, _ = mean_ci(finals.get(key, []))
            mean = mean if math.isfinite(mean) else 0.0
            low, high = (max(0.0, low), min(1.0, high)) if math.isfinite(low) else (mean, mean)
            labels.append(arm_label)
            means.append(mean)
            errs.append([mean - low, high - mean])
        ax.bar(range(len(labels)), means, yerr=np.asarray(errs).T, capsize=4, color="#4c78a8")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        if group.task in chance:
            ax.axhline(chance[group.task][0], color="grey", linestyle="--", linewidth=1, label="chance")
            ax.legend(fontsize=8)
        ax.set_title(group.title, fontsize=10)
        ax.set_ylabel("final held-out success")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Final success, mean and 95% CI over seeds (clipped to [0, 1])", fontsize=11)
    fig.tight_layout()
    write_file(path, figure_bytes(fig, dpi=110))
    plt.close(fig)
    return path


VERDICT_COLORS = {REPRODUCED: "#2e7d32", NOT_REPRODUCED: "#c62828", INCONCLUSIVE: "#757575", NO_VERDICT: "#bdbdbd"}


def plot_confirmatory(comps: list[Comparison], task_of: Callable[[Comparison], str], path: Path) -> Path:
    """The confirmatory comparisons at a glance: one panel per metric, one row per task and pair of arms, the
    paired difference and its 95% interval, coloured by the Holm verdict (light grey: no verdict, the task is not gated), 0 marked."""
    plt = _pyplot()
    metrics = list(dict.fromkeys(c.metric for c in comps))
    names = list(dict.fromkeys(f"{task_title(task_of(c)).strip('`')}: {c.what}" for c in comps))
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(4.6 * len(metrics) + 2.6, 0.26 * len(names) + 1.4), squeeze=False, sharey=True
    )
    for ax, metric in zip(axes.flat, metrics, strict=True):
        for c in comps:
            if c.metric != metric or not math.isfinite(c.diff):
                continue
            y = names.index(f"{task_title(task_of(c)).strip('`')}: {c.what}")
            color = VERDICT_COLORS.get(c.verdict, "black")
            if math.isfinite(c.low) and math.isfinite(c.high):
                ax.plot([c.low, c.high], [y, y], color=color, linewidth=1.6)
            ax.plot([c.diff], [y], "o", color=color, markersize=4)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_title(METRIC_NAMES.get(metric, metric), fontsize=10)
        ax.set_xlabel("paired difference A - B (95% CI)")
        ax.grid(axis="x", alpha=0.3)
    first = axes.flat[0]
    first.set_yticks(range(len(names)), names, fontsize=7)
    first.set_ylim(len(names) - 0.5, -0.5)
    handles = [plt.Line2D([], [], color=col, marker="o", linewidth=1.6, label=v) for v, col in VERDICT_COLORS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("The confirmatory comparisons: paired differences by seed, coloured by the Holm verdict", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    write_file(path, figure_bytes(fig, dpi=110))
    plt.close(fig)
    return path


def _gain_points(
    ax: Any, xs: Sequence[float], gains: Sequence[Any], label: str, color: str, shift: float, marks: Sequence[str]
) -> None:
    """Paired gains (``diff``, ``low``, ``high``) at ``xs``, with their 95% intervals."""
    for x, g, mark in zip(xs, gains, marks, strict=True):
        if g is None or not math.isfinite(g["diff"]) or not math.isfinite(x):
            continue
        err = [[g["diff"] - g["low"]], [g["high"] - g["diff"]]] if math.isfinite(g["low"]) else None
        ax.errorbar([x + shift], [g["diff"]], yerr=err, fmt=mark, color=color, capsize=3, markersize=4, label=label)
        label = "_nolegend_"


def plot_when(per_task: Sequence[dict[str, Any]], ladder: Sequence[dict[str, Any]], path: Path) -> Path:
    """The first screen's figure: MPO − PPO and MPO − GRPO (paired, 95% intervals) against the
    critic's explained variance (the ladder), the thinking tokens per turn and the between-turn
    share (per task); a panel with no points is left out."""
    plt = _pyplot()
    panels: list[tuple[str, list[float], list[Any], list[Any], float, list[str]]] = []
    if any(e["k"] is not None for e in ladder):
        ev = [nanmean([e["ev"].get(m, math.nan) for m in ("mpo", "ppo")]) for e in ladder]
        over_grpo = [e["gain_over_grpo"].get("mpo") for e in ladder]
        marks = ["s" if e["k"] is None else "o" for e in ladder]
        title = "critic explained variance (ladder; square: learned)"
        panels.append((title, ev, [e["mpo_minus_ppo"] for e in ladder], over_grpo, 0.01, marks))

    def by_task(title: str, tasks: list[dict[str, Any]], xs: list[float], shift: float) -> None:
        gains = ([t["mpo_minus_ppo"] for t in tasks], [t["mpo_minus_grpo"] for t in tasks])
        panels.append((title, xs, *gains, shift, ["o"] * len(tasks)))

    think = [t for t in per_task if t["think_tokens"] is not None]
    if len({t["think_tokens"] for t in think}) > 1:
        by_task("thinking tokens per turn", think, [float(t["think_tokens"]) for t in think], 0.6)
    shared = [t for t in per_task if math.isfinite(t["share"])]
    if shared:
        by_task("between-turn share on the base", shared, [t["share"] for t in shared], 0.005)
    fig, axes = _grid(plt, max(len(panels), 1), (4.2, 3.4))
    for ax, (xlabel, xs, vs_ppo, vs_grpo, shift, marks) in zip(axes, panels, strict=False):
        _gain_points(ax, xs, vs_ppo, "MPO − PPO", "#4c78a8", -shift, marks)
        _gain_points(ax, xs, vs_grpo, "MPO − GRPO", "#f58518", shift, marks)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("paired gain (95% CI)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a panel whose gains are all unmeasured has none
            ax.legend(fontsize=8)
    fig.suptitle("When does MPO help? Paired gains by seed", fontsize=11)
    fig.tight_layout()
    write_file(path, figure_bytes(fig, dpi=110))
    plt.close(fig)
    return path


def diagnose_runs(runs: list[dict[str, Any]], out: Path, figures_for: Sequence[str] = ("mpo", "ppo")) -> None:
    """Runs the diagnosis on each run's rollout log; sets ``run["diagnosis"]`` to the
    summary of all its usable trajectories, and writes the full report (summary.json and
    figures) of seed 0's logs for the arms in ``figures_for``."""
    from mpo_rs.diagnose import diagnose_logs
    from mpo_rs.diagnose import write_report as write_diagnosis

    for run in runs:
        path = run.get("rollout_log")
        if not path or not run.get("critic_trained", True):
            run["diagnosis"] = None
            continue
        diag = diagnose_logs(path)
        run["diagnosis"] = diag.summary()["all"]
        if run["arm"] in figures_for and run["seed"] == min(r["seed"] for r in runs if r["arm"] == run["arm"]):
            # Inside an --out that reproduce has claimed: its own subdirectory, replaced freely.
            report = output_subdir(out, Path("diagnosis") / run["arm"])  # no link followed
            write_diagnosis(diag, report, figures=True, overwrite=True, inputs=[path])
