"""The reproduction's report: results tables, figures, claims with verdicts, and the
generated ``docs/reproduction.md``.

Everything here is computed from the runs (:func:`mpo_rs.reproduce.run.run_one` results);
no number or figure is typed by hand. Needs pyarrow for the tables and matplotlib for the
figures.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import ADVANTAGE_SCALE_RULE, BETA_SWEEP, LAMBDA_GRID, ReproduceConfig
from .stats import combine, diff_ci, holm, holm_verdict, mean_ci, paired_diff_ci, verdict

__all__ = ["FAMILY", "FAMILY_ALPHA", "Claim", "Comparison", "claims", "summarize_run", "write_report"]

FAMILY: tuple[tuple[str, str, str], ...] = (
    ("final_success", "mpo", "grpo"),
    ("final_success", "mpo", "gspo"),
    ("final_success", "mpo", "ppo"),
    ("final_success", "mpo", "mpo_token_is"),
)
"""The family of comparisons corrected for multiplicity, fixed in advance: Table 1's, as
(metric, A, B) for the claim "A beats B"; Holm's correction runs over all of them (a
comparison that cannot be made counts as p = 1)."""

FAMILY_ALPHA = 0.05
"""The family-wise error rate of the Holm-corrected comparisons."""

VERDICT_RULE = (
    "Runs share their seeds across arms (same initialisation, tasks and sampler draws), so the "
    'primary analysis is paired by seed: for a claim "A beats B", the per-seed differences A - B '
    "over the seeds run on both arms give a mean and a Student-t 95% interval on n - 1 degrees of "
    "freedom; Welch's unpaired interval of the difference of the seed means is shown beside it. "
    "Table 1's comparisons (MPO against GRPO, GSPO, PPO and MPO w/ token IS, final success) form "
    "one family, fixed in advance, with Holm-Bonferroni adjusted p-values of the two-sided paired "
    f"t-test: such a comparison is **reproduced** when its adjusted p-value is below {FAMILY_ALPHA:g} "
    "and the difference is positive, **not reproduced** when it is below "
    f"{FAMILY_ALPHA:g} and the difference is negative, **inconclusive** otherwise (the intervals shown "
    "for them are the uncorrected 95% ones, so one may exclude 0 while Holm does not reject). Every other "
    "comparison is decided by its paired 95% interval: above 0 **reproduced**, below 0 **not "
    "reproduced**, containing 0 **inconclusive** (uncorrected: read them as exploratory). A claim "
    "made of several comparisons is reproduced when all are, not reproduced when any is reversed."
)
"""The verdict rule as the page states it (the code is :func:`claims`)."""

CURVE_PANELS = (
    ("success", "validation success (held-out, T=1)"),
    ("entropy", "policy entropy (nats/token)"),
    ("explained_variance", "critic explained variance"),
    ("turns", "turns per episode"),
    ("response_length", "response length (tokens)"),
)
"""The panels of the paper's Fig. 4, in its order."""


# --------------------------------------------------------------------------- per run


def _nanmean(xs: Sequence[float]) -> float:
    a = np.asarray(xs, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def summarize_run(run: dict[str, Any]) -> dict[str, Any]:
    """One row of the results table: the run's final numbers."""
    curve, evals = run["curve"], run["evals"]
    tail = curve[-max(1, len(curve) // 10) :]
    last = evals[-1]
    row: dict[str, Any] = {
        "arm": run["arm"],
        "seed": run["seed"],
        "final_success": last["success"],
        "auc_success": _nanmean([e["success"] for e in evals]),
        "final_eval_turns": last["turns"],
        "final_train_success": _nanmean([c["success"] for c in tail]),
        "final_explained_variance": _nanmean([c["explained_variance"] for c in tail]),
        "initial_entropy": curve[0]["entropy"] if curve else math.nan,
        "final_entropy": _nanmean([c["entropy"] for c in tail]),
        "final_turns": _nanmean([c["turns"] for c in tail]),
        "final_response_length": _nanmean([c["response_length"] for c in tail]),
        "sample_s_per_update": _nanmean([c["sample_s"] for c in curve]),
        "step_s_per_update": _nanmean([c["step_s"] for c in curve]),
        "wall_s": run["wall_s"],
        "critic_trained": bool(run.get("critic_trained", True)),
    }
    row["entropy_drop"] = row["initial_entropy"] - row["final_entropy"]
    for key, value in last.items():
        if key.startswith("pass@"):
            row["final_" + key] = value
    diag = run.get("diagnosis") or {}
    row["between_share"] = diag.get("median_between_share", math.nan)
    row["between_gt_within"] = diag.get("fraction_between_gt_within", math.nan)
    for key in list(row):
        if row[key] is None:
            row[key] = math.nan
    return row


def _by_arm(rows: list[dict[str, Any]], metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in rows:
        out.setdefault(row["arm"], []).append(float(row.get(metric, math.nan)))
    return out


# --------------------------------------------------------------------------- claims


@dataclass
class Comparison:
    """A - B for one metric over seeds: the paired analysis (``diff``, ``low``, ``high``: the
    mean per-seed difference and its 95% interval over ``n`` seeds run on both arms; ``p``:
    the paired t-test's two-sided p-value), Welch's unpaired interval beside it, and for a
    comparison in :data:`FAMILY` its Holm-adjusted p-value. One-sample comparisons (``b``
    empty) test A - offset and have no Welch interval."""

    what: str
    metric: str
    a: str
    b: str
    diff: float
    low: float
    high: float
    verdict: str
    n: int = 0
    p: float = math.nan
    welch_low: float = math.nan
    welch_high: float = math.nan
    p_holm: float = math.nan
    half_width: float = math.nan

    def text(self) -> str:
        if not math.isfinite(self.diff):
            return f"{self.what}: not measured"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{self.what}: {self.diff:+.3f} (no CI, {self.n} paired seed(s))"
        out = f"{self.what}: {self.diff:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (±{self.half_width:.3f}, n={self.n}"
        if math.isfinite(self.p_holm):
            out += f", Holm p={self.p_holm:.3g}"
        out += ")"
        if math.isfinite(self.welch_low) and math.isfinite(self.welch_high):
            out += f"; Welch [{self.welch_low:+.3f}, {self.welch_high:+.3f}]"
        return out


@dataclass
class Claim:
    number: int
    paper: str
    comparisons: list[Comparison]
    verdict: str
    note: str = ""


def _by_seed(rows: list[dict[str, Any]], metric: str, arm: str) -> dict[int, float]:
    return {int(r["seed"]): float(r.get(metric, math.nan)) for r in rows if r["arm"] == arm}


def _compare(rows: list[dict[str, Any]], metric: str, a: str, b: str, what: str, offset: float = 0.0) -> Comparison:
    mine = _by_seed(rows, metric, a)
    if b == "":  # one-sample: A - offset
        paired = paired_diff_ci(mine, dict.fromkeys(mine, offset))
        welch = (math.nan, math.nan)
    else:
        theirs = _by_seed(rows, metric, b)
        paired = paired_diff_ci(mine, theirs)
        welch = diff_ci(mine.values(), theirs.values())[1:]
    return Comparison(
        what,
        metric,
        a,
        b,
        paired.diff,
        paired.low,
        paired.high,
        verdict(paired.low, paired.high),
        n=paired.n,
        p=paired.p,
        welch_low=welch[0],
        welch_high=welch[1],
        half_width=(paired.high - paired.low) / 2,
    )


def _family_holm(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """Holm-adjusted p-values of :data:`FAMILY`'s paired tests, keyed like FAMILY."""
    ps = [_compare(rows, metric, a, b, "").p for metric, a, b in FAMILY]
    return dict(zip(FAMILY, holm(ps), strict=True))


def claims(rows: list[dict[str, Any]], config: ReproduceConfig) -> list[Claim]:
    """The paper's claims, each measured on the runs: final held-out success unless said."""
    present = {r["arm"] for r in rows}
    label = {arm.key: arm.label for arm in config.arms}
    out: list[Claim] = []
    adjusted = _family_holm(rows)

    def claim(number: int, paper: str, comps: list[Comparison], note: str = "") -> None:
        comps = [c for c in comps if c.a in present and (c.b == "" or c.b in present)]
        for c in comps:
            key = (c.metric, c.a, c.b)
            if key in adjusted:
                c.p_holm = adjusted[key]
                c.verdict = holm_verdict(c.diff, c.p_holm, FAMILY_ALPHA)
        out.append(Claim(number, paper, comps, combine([c.verdict for c in comps]), note))

    claim(
        1,
        "Value structure lives on turns: between-turn differences are a median 89.5% of the "
        "within-trajectory value variance (Fig. 2).",
        [
            _compare(rows, "between_share", key, "", f"{label[key]} critic: median between-turn share - 0.5", 0.5)
            for key in ("mpo", "ppo")
        ],
        "Measured with `mpo-rs diagnose` on held-out rollouts of each trained critic (KeyDoor). "
        "Reproduced when the share is above one half with 95% confidence.",
    )
    claim(
        2,
        "MPO beats GRPO, GSPO and PPO (Table 1).",
        [_compare(rows, "final_success", "mpo", b, f"MPO - {label[b]}") for b in ("grpo", "gspo", "ppo")],
    )
    claim(
        3,
        "Turn-level IS matters: MPO w/ token IS loses to MPO, yet still beats PPO (Table 1).",
        [
            _compare(rows, "final_success", "mpo", "mpo_token_is", "MPO - MPO w/ token IS"),
            _compare(rows, "final_success", "mpo_token_is", "ppo", "MPO w/ token IS - PPO"),
        ],
    )
    beta_keys = {b: k for b, k in BETA_SWEEP.items()}
    claim(
        4,
        "β has an inverted U with its best at 1.0; β = 0 already beats PPO (Table 3).",
        [
            _compare(rows, "final_success", beta_keys[1.0], beta_keys[b], f"β=1 - β={b:g}")
            for b in sorted(beta_keys)
            if b != 1.0
        ]
        + [_compare(rows, "final_success", beta_keys[0.0], "ppo", "β=0 - PPO")],
    )
    claim(
        5,
        "(λ, λ_intra) = (0.80, 0.95) is best (Table 2).",
        [
            _compare(rows, "final_success", LAMBDA_GRID[(0.80, 0.95)], key, f"(0.80, 0.95) - ({lam:.2f}, {intra:.2f})")
            for (lam, intra), key in LAMBDA_GRID.items()
            if (lam, intra) != (0.80, 0.95)
        ],
    )
    claim(
        6,
        "Training dynamics (Fig. 4): MPO's validation success leads throughout; its critic's "
        "explained variance ends higher than PPO's; its entropy falls faster than GRPO's; it "
        "learns to use more turns.",
        [
            _compare(rows, "auc_success", "mpo", "grpo", "mean validation success over training, MPO - GRPO"),
            _compare(rows, "auc_success", "mpo", "ppo", "mean validation success over training, MPO - PPO"),
            _compare(rows, "final_explained_variance", "mpo", "ppo", "final critic EV, MPO - PPO"),
            _compare(rows, "entropy_drop", "mpo", "grpo", "entropy drop, MPO - GRPO"),
            _compare(rows, "final_turns", "guess_mpo", "guess_grpo", "GuessNumber turns per episode, MPO - GRPO"),
            _compare(rows, "final_turns", "guess_mpo", "guess_ppo", "GuessNumber turns per episode, MPO - PPO"),
        ],
        "Success and entropy on KeyDoor, whose episodes always last max_turns turns; turns on GuessNumber, "
        "where the episode ends at the right guess, so more turns there means searching longer, not more "
        "tool calls (training batches, mean over the last tenth of the updates).",
    )
    ks = sorted({int(k[len("final_pass@") :]) for r in rows for k in r if k.startswith("final_pass@")})
    claim(
        7,
        "Test-time scaling: MPO leads GRPO and PPO at every k of pass@k.",
        [
            _compare(rows, f"final_pass@{k}", "mpo", b, f"pass@{k}, MPO - {label[b]}")
            for k in ks
            for b in ("grpo", "ppo")
        ],
        "pass@k on held-out tasks, unbiased estimator from the evaluation samples.",
    )
    claim(
        8,
        "Not a claim of the paper; the question this harness was asked: on a sparse terminal reward, "
        "advantages in reward units beat advantages whitened over the batch (verl's default for GAE) "
        "for the critic-based arms.",
        [
            _compare(rows, "final_success", "ppo", "ppo_whiten", "PPO - PPO, whitened"),
            _compare(rows, "final_success", "mpo", "mpo_whiten", "MPO - MPO, whitened"),
        ],
        "The pilot that fixed the advantage-scale rule (seed 0) found it; these are the final seeds.",
    )
    return out


# --------------------------------------------------------------------------- tables and figures


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


def _band(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cols = [mean_ci(m[:, j]) for j in range(m.shape[1])]
    mean = np.array([c[0] for c in cols])
    low = np.array([c[1] if math.isfinite(c[1]) else c[0] for c in cols])
    high = np.array([c[2] if math.isfinite(c[2]) else c[0] for c in cols])
    return mean, low, high


def _plot_curves(runs: list[dict[str, Any]], arms: list[tuple[str, str]], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(4.0 * len(CURVE_PANELS), 3.4))
    for ax, (metric, name) in zip(axes, CURVE_PANELS, strict=True):
        source = "evals" if metric == "success" else "curve"
        for key, arm_label in arms:
            x, m = _curve_matrix(runs, key, source, metric)
            if m.size == 0 or not np.isfinite(m).any():
                continue
            mean, low, high = _band(m)
            (line,) = ax.plot(x, mean, label=arm_label)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title} (mean and 95% CI over seeds)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_bars(
    rows: list[dict[str, Any]], groups: list[tuple[str, list[tuple[str, str]]]], chance: dict[str, float], path: Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_arm = _by_arm(rows, "final_success")
    fig, axes = plt.subplots(1, len(groups), figsize=(4.4 * len(groups), 3.8), squeeze=False)
    for ax, (title, arms) in zip(axes[0], groups, strict=True):
        labels, means, errs = [], [], []
        for key, arm_label in arms:
            mean, low, high, _ = mean_ci(by_arm.get(key, []))
            labels.append(arm_label)
            means.append(mean if math.isfinite(mean) else 0.0)
            errs.append([mean - low, high - mean] if math.isfinite(low) else [0.0, 0.0])
        ax.bar(range(len(labels)), means, yerr=np.asarray(errs).T, capsize=4, color="#4c78a8")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        if title in chance:
            ax.axhline(chance[title], color="grey", linestyle="--", linewidth=1, label="chance")
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("final held-out success")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Final success, mean and 95% CI over seeds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _write_tables(
    runs: list[dict[str, Any]], rows: list[dict[str, Any]], config: ReproduceConfig, out: Path
) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    chash = config.config_hash()
    paths = []
    table = pa.Table.from_pylist([{**r, "config": config.name, "config_hash": chash} for r in rows])
    pq.write_table(table, out / "runs.parquet")
    paths.append(out / "runs.parquet")
    for source in ("curve", "evals"):
        records = [{"arm": r["arm"], "seed": r["seed"], **row} for r in runs for row in r[source]]
        if records:
            keys = sorted({k for rec in records for k in rec})
            cols = {k: [rec.get(k, math.nan) for rec in records] for k in keys}
            pq.write_table(pa.table(cols), out / f"{source}s.parquet" if source == "curve" else out / "evals.parquet")
            paths.append(out / ("curves.parquet" if source == "curve" else "evals.parquet"))
    return paths


# --------------------------------------------------------------------------- markdown


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "—"


def _ci_text(values: list[float], digits: int = 3) -> str:
    mean, low, high, n = mean_ci(values)
    if n == 0:
        return "—"
    if n < 2:
        return f"{_fmt(mean, digits)} (1 seed)"
    return f"{_fmt(mean, digits)} [{_fmt(low, digits)}, {_fmt(high, digits)}]"


def _family_of(found: list[Claim]) -> list[Comparison]:
    """The comparisons of :data:`FAMILY` among the claims, in FAMILY's order."""
    seen = {(x.metric, x.a, x.b): x for c in found for x in c.comparisons}
    return [seen[key] for key in FAMILY if key in seen]


def _markdown(
    config: ReproduceConfig,
    rows: list[dict[str, Any]],
    found: list[Claim],
    meta: dict[str, Any],
    figures: dict[str, str],
) -> str:
    budget = config.budget
    lines = [
        "# Reproduction of the MPO paper's claims at toy scale",
        "",
        f"<!-- generated by `mpo-rs reproduce` ({config.name} configuration, hash {config.config_hash()}); "
        "do not edit by hand: `make reproduce` rewrites this page and its figures -->",
        "",
        f"Configuration **{config.name}** (hash `{config.config_hash()}`), {config.seeds} seed(s) per arm "
        f"(seeds {config.seed_list[0]}-{config.seed_list[-1]}), "
        f"device `{config.device}`, {meta['workers']} worker process(es); wall time "
        f"**{meta['wall_s'] / 60:.1f} min** for {len(rows)} runs ({meta['started']}).",
        "",
        "The toy runs compare *orderings*, not the paper's values. Each claim is decided by a rule in "
        "`mpo_rs/reproduce/report.py` and `stats.py`. " + VERDICT_RULE + " Unless said otherwise the metric "
        f"is the success rate on {budget.eval_tasks} held-out tasks x {budget.eval_samples} samples at "
        "temperature 1 after the last update.",
        "",
        "## Claims",
        "",
        "| # | the paper | what the toy runs show (paired difference, 95% CI, half-width, seeds; Welch's CI) "
        "| verdict |",
        "|---|---|---|---|",
    ]
    for c in found:
        shown = "<br>".join(x.text() + f" → {x.verdict}" for x in c.comparisons) or "not measured"
        if c.note:
            shown += f"<br>*{c.note}*"
        lines.append(f"| {c.number} | {c.paper} | {shown} | **{c.verdict}** |")
    lines += [
        "",
        "## Power achieved",
        "",
        f"The Holm-corrected family (alpha = {FAMILY_ALPHA:g}): the paired 95% half-width each comparison achieved.",
        "",
        "| comparison | metric | paired seeds | half-width | paired p | Holm p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for comp in _family_of(found):
        lines.append(
            f"| {comp.what} | {comp.metric} | {comp.n} | {_fmt(comp.half_width)} | {_fmt(comp.p)} | "
            f"{_fmt(comp.p_holm)} | {comp.verdict} |"
        )
    lines += ["", "## Results per arm", ""]
    ks = sorted({int(k[len("final_pass@") :]) for r in rows for k in r if k.startswith("final_pass@")})
    header = ["arm", "task", "estimator", "ratio", "advantage scale", "final success"] + [f"pass@{k}" for k in ks]
    header += ["critic EV (end)", "entropy (end)", "turns (end)", "between-turn share", "seeds"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm in config.arms:
        mine = [r for r in rows if r["arm"] == arm.key]
        if not mine:
            continue
        knobs = arm.estimator if arm.estimator == "grpo" else f"{arm.estimator} λ={arm.lam:g}"
        if arm.estimator == "mae":
            knobs += f" λ_intra={arm.lam_intra:g} β={arm.beta:g}"
        cells = [arm.label, arm.task, knobs, arm.ratio, arm.advantage_scale]
        cells.append(_ci_text([r["final_success"] for r in mine]))
        cells += [_ci_text([r.get(f"final_pass@{k}", math.nan) for r in mine]) for k in ks]
        for metric in ("final_explained_variance", "final_entropy", "final_turns", "between_share"):
            cells.append(_ci_text([r[metric] for r in mine], 2))
        cells.append(str(len(mine)))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Figures", ""]
    for title, rel in figures.items():
        lines += [f"### {title}", "", f"![{title}]({rel})", ""]
    lines += [
        "## Configuration",
        "",
        "Every arm gets the same budget and model; an arm sets only its estimator, its ratio and its "
        "advantage scale (`group-std`: GRPO's (score - group mean) / group std; `whiten`: over the "
        "batch's policy tokens, as verl does for GAE; `none`: as estimated, in reward units).",
        "",
        f"**Advantage scale.** {ADVANTAGE_SCALE_RULE}",
        "",
        "Every arm trains a critic on Monte-Carlo returns "
        "(λ_critic = 1); GRPO and GSPO do not use its values. Entropy is -mean log π of the sampled "
        "tokens (an unbiased estimate); explained variance is 1 - Var(G - V) / Var(G) over the policy "
        "tokens of each update's fresh batch (before the update), undefined when every return is equal.",
        "",
        "```json",
        json.dumps({k: v for k, v in config.to_dict().items() if k != "arms"}, indent=2, default=str),
        "```",
        "",
        "## Every run",
        "",
        "| arm | seed | final success | mean validation success | critic EV (end) | entropy (end) | turns (end) | "
        "between-turn share | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {_fmt(r['final_success'])} | {_fmt(r['auc_success'])} | "
            f"{_fmt(r['final_explained_variance'], 2)} | {_fmt(r['final_entropy'], 2)} | "
            f"{_fmt(r['final_turns'], 2)} | {_fmt(r['between_share'], 2)} | {_fmt(r['wall_s'], 0)} |"
        )
    lines += [
        "",
        "Regenerate: `make reproduce` (this configuration); `mpo-rs reproduce --quick --out DIR` is the "
        "smoke test. Tables: `runs.parquet`, `curves.parquet`, `evals.parquet` and `results.json` in the "
        "output directory.",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- entry point


def diagnose_runs(runs: list[dict[str, Any]], out: Path, figures_for: Sequence[str] = ("mpo", "ppo")) -> None:
    """Runs the diagnosis on each run's rollout log; sets ``run["diagnosis"]`` to the
    summary of all its usable trajectories, and writes the full report (summary.json and
    figures) of seed 0's logs for the arms in ``figures_for``."""
    from ..diagnose import diagnose_logs
    from ..diagnose import write_report as write_diagnosis

    for run in runs:
        path = run.get("rollout_log")
        if not path or not run.get("critic_trained", True):
            run["diagnosis"] = None
            continue
        diag = diagnose_logs(path)
        run["diagnosis"] = diag.summary()["all"]
        if run["arm"] in figures_for and run["seed"] == min(r["seed"] for r in runs if r["arm"] == run["arm"]):
            # Inside an --out that reproduce has claimed: its own subdirectory, replaced freely.
            write_diagnosis(diag, out / "diagnosis" / run["arm"], figures=True, overwrite=True)


def write_report(
    runs: list[dict[str, Any]],
    config: ReproduceConfig,
    out_dir: str | os.PathLike[str],
    meta: dict[str, Any],
    *,
    docs_dir: str | os.PathLike[str] | None = None,
    note: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Writes results.json, the Parquet tables, the figures and reproduction.md under
    ``out_dir``; with ``docs_dir``, also ``docs_dir/reproduction.md`` and its figures under
    ``docs_dir/img/reproduction/``. Returns the results dictionary."""
    from ..envs import chance_success

    out = Path(out_dir)
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    diagnose_runs(runs, out)
    rows = [summarize_run(r) for r in runs]
    found = claims(rows, config)
    _write_tables(runs, rows, config, out)

    label = {a.key: a.label for a in config.arms}

    def fam(family: str) -> list[tuple[str, str]]:
        return [(a.key, a.label) for a in config.arms if a.family == family]

    figures: dict[str, Path] = {}
    figures["Learning curves, KeyDoor (Table 1 arms; Fig. 4 layout)"] = _plot_curves(
        runs, fam("table1"), "KeyDoor, Table 1 arms", img / "curves_key_door.png"
    )
    figures["Learning curves, KeyDoor: advantage scale (reward units vs whitened over the batch)"] = _plot_curves(
        runs,
        [("ppo", "PPO"), ("ppo_whiten", "PPO, whitened"), ("mpo", "MPO"), ("mpo_whiten", "MPO, whitened")],
        "KeyDoor, advantage scale",
        img / "curves_scale.png",
    )
    figures["Learning curves, GuessNumber (turns per episode)"] = _plot_curves(
        runs, fam("turns"), "GuessNumber", img / "curves_guess_number.png"
    )
    beta_arms = [(k, f"β={b:g}") for b, k in sorted(BETA_SWEEP.items())]
    lambda_arms = [(k, f"({lam:.2f}, {i:.2f})") for (lam, i), k in LAMBDA_GRID.items()]
    chance = {
        "Table 1 (KeyDoor)": chance_success("key_door", **config.task("key_door").kwargs()),
        "Advantage scale (KeyDoor)": chance_success("key_door", **config.task("key_door").kwargs()),
        "GuessNumber": chance_success("guess_number", **config.task("guess_number").kwargs()),
    }
    figures["Final success with 95% CIs"] = _plot_bars(
        rows,
        [
            ("Table 1 (KeyDoor)", fam("table1")),
            ("β (KeyDoor)", beta_arms),
            ("(λ, λ_intra) (KeyDoor)", lambda_arms),
            ("Advantage scale (KeyDoor)", [("ppo", "PPO"), ("mpo", "MPO"), *fam("scale")]),
            ("GuessNumber", fam("turns")),
        ],
        chance,
        img / "final_success.png",
    )
    for arm in ("mpo", "ppo"):
        src = out / "diagnosis" / arm
        for png in sorted(src.glob("*.png")) if src.is_dir() else []:
            figures[f"Value structure of the {label[arm]} critic ({png.stem.replace('_', ' ')})"] = png

    results = {
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "meta": meta,
        "chance": chance,
        "runs": rows,
        "claims": [
            {
                "number": c.number,
                "paper": c.paper,
                "verdict": c.verdict,
                "note": c.note,
                "comparisons": [vars(x) for x in c.comparisons],
            }
            for c in found
        ],
    }
    family = _family_of(found)
    results["family"] = {
        "alpha": FAMILY_ALPHA,
        "correction": "holm",
        "comparisons": [{"metric": m, "a": a, "b": b} for m, a, b in FAMILY],
    }
    for comp in family:
        note(
            f"{comp.what} ({comp.metric}): paired 95% half-width {_fmt(comp.half_width)} over {comp.n} seeds, "
            f"Holm p={_fmt(comp.p_holm)} -> {comp.verdict}"
        )
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_json_default, allow_nan=True))
    (out / "reproduction.md").write_text(
        _markdown(config, rows, found, meta, {t: str(p.relative_to(out)) for t, p in figures.items()})
    )
    note(f"wrote {out / 'reproduction.md'} and {out / 'results.json'}")
    if docs_dir is not None:
        docs = Path(docs_dir)
        dest = docs / "img" / "reproduction"
        dest.mkdir(parents=True, exist_ok=True)
        rel: dict[str, str] = {}
        for title, path in figures.items():
            name = path.name if path.parent == img else f"{path.parent.name}_{path.name}"
            (dest / name).write_bytes(path.read_bytes())
            rel[title] = f"img/reproduction/{name}"
        (docs / "reproduction.md").write_text(_markdown(config, rows, found, meta, rel))
        note(f"wrote {docs / 'reproduction.md'} and {len(rel)} figures under {dest}")
    return results


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)
