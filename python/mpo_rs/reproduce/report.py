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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._outputs import figure_bytes, output_subdir, table_bytes, write_file
from ..diagnose.summary import ON_TURNS_SHARE, WITHIN_TURNS_SHARE
from .config import ADVANTAGE_SCALE_RULE, ARMS, BASE_BAND, BETA_SWEEP, LAMBDA_GRID, TASK_PREFIX, Arm, ReproduceConfig
from .plan import PLAN
from .stats import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Paired,
    combine,
    diff_ci,
    difference_of_group_means,
    direction_words,
    holm,
    holm_verdict,
    mean_ci,
    paired_diff_ci,
    verdict,
)

__all__ = [
    "CRITIC_EV_FLOOR",
    "FAMILY",
    "FAMILY_ALPHA",
    "Claim",
    "Comparison",
    "Page",
    "claims",
    "curves_figure",
    "family",
    "family_comparisons",
    "figure_groups",
    "summarize_run",
    "task_title",
    "verdict_rule",
    "write_report",
]

FAMILY: tuple[tuple[str, str, str], ...] = tuple(PLAN.family())
"""The family of comparisons corrected for multiplicity, fixed in advance by the committed
analysis plan (:data:`mpo_rs.reproduce.plan.PLAN`: Table 1 on every task, MPO against its
public relatives, the β and (λ, λ_intra) claims on the main task, each on both metrics), as
(metric, A, B) for the claim "A beats B"; Holm's correction runs over all of them (a
comparison that cannot be made counts as p = 1)."""

FAMILY_ALPHA = PLAN.alpha
"""The family-wise error rate of the Holm-corrected comparisons."""


def family(config: ReproduceConfig) -> tuple[tuple[str, str, str], ...]:
    """The family of comparisons of ``config``, corrected for multiplicity: those of
    :data:`FAMILY` whose two arms it runs (a chosen subset of arms fixes a smaller family
    with it). Every use of the family in this module goes through here."""
    keys = {arm.key for arm in config.arms}
    return tuple(c for c in FAMILY if c[1] in keys and c[2] in keys)


CRITIC_EV_FLOOR = 0.1
"""A critic whose explained variance at the end of training (mean over seeds) stays below
this has not learned; the summary says so (GAE and MAE then run on near-constant values)."""


def verdict_rule(config: ReproduceConfig) -> str:
    """The verdict rule as the page states it (the code is :func:`claims`)."""
    fam = family(config)
    pairs = len({(a, b) for _, a, b in fam})
    metrics = " and ".join(METRIC_NAMES.get(m, m) for m in dict.fromkeys(m for m, _, _ in fam))
    text = (
        "Runs share their seeds across arms (same initialisation, tasks and sampler draws), so the "
        'primary analysis is paired by seed: for a claim "A beats B", the per-seed differences A - B '
        "over the seeds run on both arms give a mean and a Student-t 95% interval on n - 1 degrees of "
        "freedom; Welch's unpaired interval of the difference of the seed means is shown beside it. "
    )
    if fam:
        text += (
            f'The {len(fam)} comparisons listed under "Power achieved" ({pairs} pair(s) of arms, each on {metrics}) '
            f"form one family, fixed in advance by the analysis plan "
            f"`{PLAN.plan_hash()}` (docs/analysis-plan.md), with Holm-Bonferroni "
            "adjusted p-values of the two-sided paired t-test: such a comparison is **reproduced** when its "
            f"adjusted p-value is below {FAMILY_ALPHA:g} and the difference is positive, **not reproduced** when "
            f"it is below {FAMILY_ALPHA:g} and the difference is negative, **inconclusive** otherwise (the "
            "intervals shown for them are the uncorrected 95% ones, so one may exclude 0 while Holm does not "
            "reject). Every other comparison"
        )
    else:
        text += "Every comparison"
    return text + (
        " is decided by its paired 95% interval: above 0 **reproduced**, below 0 **not "
        "reproduced**, containing 0 **inconclusive** (uncorrected: read them as exploratory). A claim "
        "made of several comparisons is reproduced when all are, not reproduced when any is reversed."
    )


def _labels(config: ReproduceConfig) -> dict[str, str]:
    """Arm key -> label, for the configuration's arms and every committed one."""
    return {arm.key: arm.label for arm in (*ARMS, *config.arms)}


def task_title(name: str) -> str:
    """A task's name on the page: the class of a registry name (KeyDoor), else the user's
    ``module:factory``."""
    from ..envs import ENVIRONMENTS

    cls = ENVIRONMENTS.get(name)
    return cls.__name__ if cls is not None else f"`{name}`"


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
    base, warmup = run.get("base") or {}, run.get("warmup") or {}
    row["base_success"] = base.get("held_out_success", math.nan)
    row["warmup_explained_variance"] = warmup.get("explained_variance", math.nan)
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


def _family_holm(
    rows: list[dict[str, Any]], fam: tuple[tuple[str, str, str], ...]
) -> dict[tuple[str, str, str], float]:
    """Holm-adjusted p-values of the family's paired tests, keyed like the family."""
    ps = [_compare(rows, metric, a, b, "").p for metric, a, b in fam]
    return dict(zip(fam, holm(ps), strict=True))


def claims(rows: list[dict[str, Any]], config: ReproduceConfig) -> list[Claim]:
    """The paper's claims, each measured on the runs: final held-out success unless said."""
    present = {r["arm"] for r in rows}
    label = _labels(config)
    keys = {arm.key for arm in config.arms}
    main = task_title(config.arm("mpo").task) if "mpo" in keys else "KeyDoor"
    out: list[Claim] = []
    adjusted = _family_holm(rows, family(config))

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
        f"Measured with `mpo-rs diagnose` on held-out rollouts of each trained critic ({main}). "
        "Reproduced when the share is above one half with 95% confidence.",
    )
    claim(
        2,
        "MPO beats GRPO, GSPO and PPO (Table 1).",
        [c for b in ("grpo", "gspo", "ppo") for c in _on_plan_metrics(rows, "mpo", b, f"MPO - {label[b]}")],
    )
    claim(
        3,
        "Turn-level IS matters: MPO w/ token IS loses to MPO, yet still beats PPO (Table 1).",
        [
            *_on_plan_metrics(rows, "mpo", "mpo_token_is", "MPO - MPO w/ token IS"),
            *_on_plan_metrics(rows, "mpo_token_is", "ppo", "MPO w/ token IS - PPO"),
        ],
    )
    beta_keys = {b: k for b, k in BETA_SWEEP.items()}
    claim(
        4,
        "β has an inverted U with its best at 1.0; β = 0 already beats PPO (Table 3).",
        [
            c
            for b in sorted(beta_keys)
            if b != 1.0
            for c in _on_plan_metrics(rows, beta_keys[1.0], beta_keys[b], f"β=1 - β={b:g}")
        ]
        + _on_plan_metrics(rows, beta_keys[0.0], "ppo", "β=0 - PPO"),
    )
    claim(
        5,
        "(λ, λ_intra) = (0.80, 0.95) is best (Table 2).",
        [
            c
            for (lam, intra), key in LAMBDA_GRID.items()
            if (lam, intra) != (0.80, 0.95)
            for c in _on_plan_metrics(rows, LAMBDA_GRID[(0.80, 0.95)], key, f"(0.80, 0.95) - ({lam:.2f}, {intra:.2f})")
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
        f"Success and entropy on {main}"
        + (", whose episodes always last max_turns turns" if main == "KeyDoor" else "")
        + (
            "; turns on GuessNumber, where the episode ends at the right guess, so more turns there means "
            "searching longer, not more tool calls"
            if "guess_mpo" in keys
            else ""
        )
        + " (training batches, mean over the last tenth of the updates).",
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
        "The pilot that fixed the advantage-scale rule (seed 0) found it; "
        + (
            "these runs include seed 0, so they do not test it independently."
            if 0 in config.seed_list
            else "these runs do not reuse its seed."
        ),
    )
    out.append(_prediction_claim(rows, config, adjusted))
    return out


def _on_plan_metrics(rows: list[dict[str, Any]], a: str, b: str, what: str) -> list[Comparison]:
    """A - B on each of the plan's metrics, the primary first."""
    return [_compare(rows, m, a, b, f"{what} ({METRIC_NAMES.get(m, m)})") for m in PLAN.metrics]


def ppo_critic_share(rows: list[dict[str, Any]], task: str) -> float:
    """The median over seeds of the between-turn share of ``task``'s trained PPO critic (NaN
    when there is none): what claim 9, the estimates table and the design section read."""
    ppo = f"{TASK_PREFIX.get(task, '')}ppo"
    return _nanmedian([float(r.get("between_share", math.nan)) for r in rows if r["arm"] == ppo])


PREDICTION_BASELINES = ("ppo", "grpo")
"""The arms MPO's gain is measured against in the diagnose-predicts-benefit question."""


def _prediction_claim(
    rows: list[dict[str, Any]], config: ReproduceConfig, adjusted: dict[tuple[str, str, str], float]
) -> Claim:
    """Claim 9, the question no anchor answers: does ``mpo-rs diagnose`` predict where MPO
    helps? Per task, MPO's paired gain over PPO and over GRPO on the primary metric beside
    the median between-turn share of that task's trained PPO critic (its diagnosis; PPO's
    critic is not shaped by MAE); then, per baseline, the mean gain on the tasks whose share
    reads "on turns" (>= ON_TURNS_SHARE) minus that on the tasks whose share reads "within
    turns" (< WITHIN_TURNS_SHARE), with its interval (:func:`difference_of_group_means`).
    Reproduced ("it predicts") when that difference is positive with 95% confidence."""
    label = _labels(config)
    present = {r["arm"] for r in rows}
    metric = PLAN.metrics[0]
    comps: list[Comparison] = []
    groups: dict[str, dict[str, list[Paired]]] = {b: {"on": [], "off": []} for b in PREDICTION_BASELINES}
    for spec in config.tasks:
        prefix = TASK_PREFIX.get(spec.name, "")
        mpo = f"{prefix}mpo"
        share = ppo_critic_share(rows, spec.name)
        if mpo not in present or not math.isfinite(share):
            continue
        side = "on" if share >= ON_TURNS_SHARE else "off" if share < WITHIN_TURNS_SHARE else None
        for b in PREDICTION_BASELINES:
            other = f"{prefix}{b}"
            if other not in present:
                continue
            what = f"{task_title(spec.name)} (PPO critic's median share {share:.2f}): MPO - {label.get(other, other)}"
            c = _compare(rows, metric, mpo, other, what)
            if (metric, mpo, other) in adjusted:  # a Table 1 comparison: the family's correction
                c.p_holm = adjusted[(metric, mpo, other)]
                c.verdict = holm_verdict(c.diff, c.p_holm, FAMILY_ALPHA)
            comps.append(c)
            if side is not None:
                groups[b][side].append(Paired(c.diff, c.low, c.high, c.n, c.p))
    contrasts = []
    for b in PREDICTION_BASELINES:
        on, off = groups[b]["on"], groups[b]["off"]
        diff, low, high = difference_of_group_means(on, off)
        contrasts.append(
            Comparison(
                f"MPO - {b.upper()} gain where the share is >= {ON_TURNS_SHARE:g} ({len(on)} task(s)) "
                f"minus where it is < {WITHIN_TURNS_SHARE:g} ({len(off)} task(s))",
                metric,
                "",
                "",
                diff,
                low,
                high,
                verdict(low, high),
                n=len(on) + len(off),
                half_width=(high - low) / 2,
            )
        )
    return Claim(
        9,
        "Not a claim of the paper; the advice a user needs before switching estimators: does "
        "`mpo-rs diagnose` predict where MPO helps? MPO's paired gain over PPO and over GRPO "
        f"({METRIC_NAMES.get(metric, metric)}) is larger on tasks whose critic's value lives on turns "
        f"(median between-turn share >= {ON_TURNS_SHARE:g}, diagnose's reading) than on tasks where it "
        f"moves within turns (< {WITHIN_TURNS_SHARE:g}).",
        comps + contrasts,
        combine([c.verdict for c in contrasts]),
        "The share is the trained PPO critic's, measured by `mpo-rs diagnose` on held-out rollouts "
        "(median over seeds). The tasks are few, so this contrast is a coarse check: read the per-task "
        "gains beside it.",
    )


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


CLIP = {"success": (0.0, 1.0), "turns": (0.0, math.inf), "response_length": (0.0, math.inf)}
"""Where a curve's interval is clipped: a rate to [0, 1], a count to >= 0."""

FAMILY_TITLES = {
    "table1": "Table 1",
    "beta": "β",
    "lambda": "(λ, λ_intra)",
    "scale": "Advantage scale",
    "turns": "Table 1 arms",
}
"""How a family of arms is titled in figures (another family by its name)."""

SWEEPS = {
    "beta": [(k, f"β={b:g}") for b, k in sorted(BETA_SWEEP.items())],
    "lambda": [(k, f"({lam:.2f}, {i:.2f})") for (lam, i), k in LAMBDA_GRID.items()],
}
"""Families shown as a sweep that includes the MPO arm, as bars only (no curves)."""

ANCHORS = {"scale": ("ppo", "mpo")}
"""Arms a family's figures show beside its own (the arms it ablates)."""


@dataclass
class FigureGroup:
    """The arms of one family on one task, as one set of curves and one panel of bars."""

    task: str
    family: str
    title: str
    arms: list[tuple[str, str]]


def figure_groups(config: ReproduceConfig, present: set[str]) -> list[FigureGroup]:
    """Per task (in the configuration's order), per family of arms run on it: the arms to
    draw, with a sweep's MPO arm and a family's anchors."""
    groups = []
    for spec in config.tasks:
        mine = [a for a in config.arms if a.task == spec.name and a.key in present]
        for fam in dict.fromkeys(a.family for a in mine):
            if fam in SWEEPS:
                arms = SWEEPS[fam]
            else:
                anchors = [a for a in mine if a.key in ANCHORS.get(fam, ()) and a.family != fam]
                arms = [(a.key, a.label) for a in (*anchors, *(a for a in mine if a.family == fam))]
            arms = [(k, name) for k, name in arms if k in present and k in {a.key for a in mine}]
            if arms:
                title = f"{FAMILY_TITLES.get(fam, fam)} ({task_title(spec.name).strip('`')})"
                groups.append(FigureGroup(spec.name, fam, title, arms))
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
            dropped.append(f"{name} ({_fmt(float(values[0]), 2)} on every run)")
        else:
            keep.append((metric, name))
    return keep, dropped


def _plot_curves(
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


def _plot_bars(
    rows: list[dict[str, Any]], groups: list[FigureGroup], chance: dict[str, tuple[float, str]], path: Path
) -> Path:
    plt = _pyplot()
    by_arm = _by_arm(rows, "final_success")
    fig, axes = _grid(plt, len(groups), (4.4, 3.6))
    for ax, group in zip(axes, groups, strict=True):
        labels, means, errs = [], [], []
        for key, arm_label in group.arms:
            mean, low, high, _ = mean_ci(by_arm.get(key, []))
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


VERDICT_COLORS = {REPRODUCED: "#2e7d32", NOT_REPRODUCED: "#c62828", INCONCLUSIVE: "#757575"}


def _plot_family(comps: list[Comparison], task_of: Callable[[Comparison], str], path: Path) -> Path:
    """The family at a glance: one panel per metric, one row per task and pair of arms, the
    paired difference and its 95% interval, coloured by the Holm verdict, 0 marked."""
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
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("The pre-registered family: paired differences by seed, coloured by the Holm verdict", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    write_file(path, figure_bytes(fig, dpi=110))
    plt.close(fig)
    return path


def _write_tables(
    runs: list[dict[str, Any]], rows: list[dict[str, Any]], config: ReproduceConfig, out: Path
) -> list[Path]:
    import pyarrow as pa

    chash = config.config_hash()
    paths = []
    table = pa.Table.from_pylist([{**r, "config": config.name, "config_hash": chash} for r in rows])
    write_file(out / "runs.parquet", table_bytes(table))
    paths.append(out / "runs.parquet")
    for source in ("curve", "evals"):
        records = [{"arm": r["arm"], "seed": r["seed"], **row} for r in runs for row in r[source]]
        if records:
            keys = sorted({k for rec in records for k in rec})
            cols = {k: [rec.get(k, math.nan) for rec in records] for k in keys}
            write_file(out / ("curves.parquet" if source == "curve" else "evals.parquet"), table_bytes(pa.table(cols)))
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


def family_comparisons(rows: list[dict[str, Any]], found: list[Claim], config: ReproduceConfig) -> list[Comparison]:
    """The comparisons of the family, in its order, Holm-adjusted (the same numbers a claim
    that shows one of them has; a family may compare arms no claim of the paper names, e.g.
    on a task of its own). ``found`` is accepted for the callers' symmetry and not read."""
    fam = family(config)
    adjusted = _family_holm(rows, fam)
    label = _labels(config)
    out = []
    for key in fam:
        # Named here, the same way whichever claim (if any) also shows it.
        metric, a, b = key
        comp = _compare(rows, metric, a, b, f"{label.get(a, a)} - {label.get(b, b)}")
        comp.p_holm = adjusted[key]
        comp.verdict = holm_verdict(comp.diff, comp.p_holm, FAMILY_ALPHA)
        out.append(comp)
    return out


METRIC_NAMES = {
    "final_success": "final held-out success",
    "auc_success": "mean held-out success over training",
}
"""How a metric of the family is named in the summary (another by its key)."""


@dataclass
class Page:
    """The generated page: a summary at the top, then claims, power, tables and figures."""

    config: ReproduceConfig
    rows: list[dict[str, Any]]
    found: list[Claim]
    family_comps: list[Comparison]
    chance: dict[str, tuple[float, str]]
    meta: dict[str, Any]
    captions: dict[str, str]
    design: dict[str, Any] = field(default_factory=dict)
    """What the design section reads beside the runs: ``premise`` (the premise measurement's
    results, docs/premise.json) and ``sizing`` (:func:`mpo_rs.reproduce.plan.sizing` of the
    pilot's results, docs/pilot/results.json); either may be absent."""

    # ------------------------------------------------------------------ what the page is

    def kind(self) -> list[str]:
        """What this run is, when it is not the committed full run: a smoke test, a user's
        environment, another configuration. Nothing said here holds only for the full run."""
        from .api import budget_name, command_line, is_committed

        config, out = self.config, []
        budget = config.budget
        if budget_name(config) == "quick":
            out.append(
                f"**This is a smoke test** (`--quick`: {budget.updates} updates of {budget.episodes_per_update} "
                f"episodes, {config.seeds} seed(s)). It checks that every arm runs and every file is written; "
                "its numbers decide nothing about MPO."
            )
        user = [t for t in config.tasks if ":" in t.name]
        if user:
            params = ", ".join(f"{k}={v!r}" for k, v in user[0].params) or "its defaults"
            out.append(
                f"**A run on a user environment**, `{user[0].name}` ({params}): the reproduction's protocol "
                "(equal budgets, seeds shared by the arms, the paired analysis) on this task, not the "
                "reproduction of the paper. The paper's claims below are measured on this task, as far as the "
                "chosen arms go."
            )
        elif not is_committed(config) and budget_name(config) != "quick":
            cmd = command_line(config) or "the Python API (`mpo_rs.reproduce.compare`) with a budget of its own"
            out.append(
                f"**Not the committed configuration**: this page is `{cmd}`'s; the reported run is `make reproduce`'s."
            )
        return out

    def summary(self) -> str:
        """The bottom line: the family's tally and decided comparisons, a table of the arms'
        point estimates per task, a table of the family's paired verdicts per task, the caveats."""
        ran = [spec.name for spec in self.config.tasks if self._task_arms(spec.name)]
        if not ran:
            return ""
        # The family's order (the main task first, the controls last), then the rest.
        tasks = list(dict.fromkeys([*(self._task_of(c) for c in self.family_comps), *ran]))
        tasks = [t for t in tasks if t in ran]
        lines = [self._bottom_line(), "", *self._estimates_table(tasks), ""]
        if self.family_comps:
            lines += [*self._family_table(), ""]
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
        comps = self.family_comps
        others = self._other_comparisons()
        if not comps:
            return "**Bottom line.** No comparison of the analysis plan's family is among these arms. " + _tally(
                others, "The comparisons of the claims (uncorrected, exploratory)"
            )
        pairs = len({(c.a, c.b) for c in comps})
        metrics = " and ".join(METRIC_NAMES.get(m, m) for m in dict.fromkeys(c.metric for c in comps))
        seeds = sorted({c.n for c in comps if c.n})
        n = "no" if not seeds else f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        text = (
            f"**Bottom line.** {len(comps)} comparisons were fixed in advance by the analysis plan "
            f"`{PLAN.plan_hash()}` ({pairs} pair(s) of arms, each on {metrics}), paired by seed over {n} seed(s) and "
            f"Holm-corrected at alpha = {FAMILY_ALPHA:g}: " + _counts(comps) + ". " + _power(comps)
        )
        decided = [c for c in comps if c.verdict != INCONCLUSIVE]
        if len(decided) > 6:  # too many for a sentence: per task, the table has them in bold
            tasks = dict.fromkeys(self._task_of(c) for c in decided)
            text += (
                " Decided (in bold in the family's table below): "
                + "; ".join(
                    f"{task_title(t)} {_counts([c for c in decided if self._task_of(c) == t], decided_only=True)}"
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
        if others:
            text += " " + _tally(others, "The other comparisons of the claims (uncorrected, exploratory; see Claims)")
        return text

    def _bounded(self, comps: list[Comparison]) -> str:
        """How many undecided comparisons still bound the effect: their paired 95% interval
        lies inside +-the plan's target half-width, so a difference that large either way
        is excluded (uncorrected; a reading of the intervals, not a test of the plan)."""
        margin = PLAN.target_half_width
        open_ = [c for c in comps if c.verdict == INCONCLUSIVE and math.isfinite(c.low) and math.isfinite(c.high)]
        inside = [c for c in open_ if -margin < c.low and c.high < margin]
        if not open_:
            return ""
        primary = PLAN.metrics[0]
        on_primary = [c for c in inside if c.metric == primary]
        return (
            f" Of the {len(open_)} undecided, {len(inside)} ({len(on_primary)} on "
            f"{METRIC_NAMES.get(primary, primary)}) have their whole 95% interval inside ±{margin:g} (uncorrected): "
            f'there a difference of {margin:g} in success either way is excluded (marked "within ±{margin:g}" in the '
            "family's table)."
        )

    def _other_comparisons(self) -> list[Comparison]:
        family_keys = {(c.metric, c.a, c.b) for c in self.family_comps}
        return [c for claim in self.found for c in claim.comparisons if c.b and (c.metric, c.a, c.b) not in family_keys]

    def _task_of(self, comp: Comparison) -> str:
        arms = {a.key: a for a in self.config.arms}
        arm = arms.get(comp.a)
        return arm.task if arm is not None else ""

    def _estimates_table(self, tasks: list[str]) -> list[str]:
        """Tasks x arms: each arm's mean over seeds on the plan's metrics. The columns are the
        arms every task runs (Table 1's); a task's other arms are in the family's table and in
        "Results per arm"."""
        by_task = {t: self._task_arms(t) for t in tasks}
        labels = list(dict.fromkeys(a.label for a in by_task[tasks[0]]))
        if len(tasks) > 1:
            labels = [x for x in labels if all(any(a.label == x for a in arms) for arms in by_task.values())]
        metrics = PLAN.metrics
        names = " / ".join(METRIC_NAMES.get(m, m) for m in metrics)
        lines = [
            f"Mean over seeds of each arm's {names}:",
            "",
            "| task | chance | seeds | PPO critic's between-turn share | " + " | ".join(labels) + " |",
            "|---|---:|---:|---:|" + "---:|" * len(labels),
        ]
        for task in tasks:
            arms = {a.label: a for a in by_task[task]}
            seeds = len({int(r["seed"]) for r in self.rows if r["arm"] in {a.key for a in by_task[task]}})
            share = ppo_critic_share(self.rows, task)
            cells = [task_title(task), _fmt(self.chance.get(task, (math.nan, ""))[0]), str(seeds), _fmt(share, 2)]
            for label in labels:
                arm = arms.get(label)
                cells.append(
                    "—" if arm is None else " / ".join(_fmt(_nanmean(self._values(arm.key, m)), 2) for m in metrics)
                )
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def _family_table(self) -> list[str]:
        """The family's comparisons, one row per task and pair of arms, one column per metric:
        paired difference ± half-width, Holm-adjusted p, verdict (bold when decided)."""
        metrics = list(dict.fromkeys(c.metric for c in self.family_comps))
        rows: dict[tuple[str, str], dict[str, Comparison]] = {}
        for c in self.family_comps:
            rows.setdefault((self._task_of(c), c.what), {})[c.metric] = c
        lines = [
            "The family, paired by seed (difference of means ± 95% half-width, Holm-adjusted p, verdict):",
            "",
            "| task | comparison | " + " | ".join(METRIC_NAMES.get(m, m) for m in metrics) + " |",
            "|---|---|" + "---|" * len(metrics),
        ]
        for (task, what), by_metric in rows.items():
            cells = [task_title(task), what] + [_cell(by_metric.get(m)) for m in metrics]
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def _caveats(self, arms: list[Arm], chance: float) -> list[str]:
        out = []
        counts = [len([x for x in self._values(a.key, "final_success") if math.isfinite(x)]) for a in arms]
        if counts and min(counts) < 2:
            out.append("one seed per arm, so there are no intervals and nothing is decided")
        critics = [a for a in arms if a.estimator != "grpo"]
        ev = {a.label: _nanmean(self._values(a.key, "final_explained_variance")) for a in critics}
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
                out.append(f"no arm's final success is distinguishable from chance ({_fmt(chance)})")
        return out

    # ------------------------------------------------------------------ the page

    def markdown(self, figures: dict[str, str]) -> str:
        from .api import budget_name, command_line, is_committed

        config, meta, budget = self.config, self.meta, self.config.budget
        if is_committed(config):
            origin = "do not edit by hand: `make reproduce` rewrites this page and its figures"
        else:
            origin = f"by `{command_line(config) or 'mpo_rs.reproduce.compare'}`; not the committed page"
        user = [t.name for t in config.tasks if ":" in t.name]
        if user:
            title = f"# Does MPO help on `{user[0]}`? The reproduction's protocol on a user environment"
        else:
            title = "# Reproduction of the MPO paper's claims at toy scale"
        if budget_name(config) == "quick":
            title += " (smoke test)"
        lines = [
            title,
            "",
            f"<!-- generated by `mpo-rs reproduce` ({config.name} configuration, hash {config.config_hash()}); "
            f"{origin} -->",
            "",
            *(x for k in self.kind() for x in (k, "")),
            "## Summary",
            "",
            self.summary() or "No run finished.",
            "",
            f"Configuration **{config.name}** (hash `{config.config_hash()}`), {config.seeds} seed(s) per arm "
            f"(seeds {config.seed_list[0]}-{config.seed_list[-1]}), "
            f"device `{config.device}`, {meta['workers']} worker process(es); wall time "
            f"**{meta['wall_s'] / 60:.1f} min** for {len(self.rows)} runs ({meta['started']})" + self._resumed() + ".",
            "",
            "The toy runs compare *orderings*, not the paper's values. Each claim is decided by a rule in "
            "`mpo_rs/reproduce/report.py` and `stats.py`. " + verdict_rule(config) + " Unless said otherwise the "
            f"metric is the success rate on {budget.eval_tasks} held-out tasks x {budget.eval_samples} samples at "
            "temperature 1 after the last update.",
            "",
        ]
        lines += self._claims_section()
        lines += self._design()
        lines += self._starting_point()
        lines += self._tables(figures)
        lines += my_task_section(config)
        if is_committed(config):
            lines += CONTROLS_SECTION
        lines += self._configuration()
        return "\n".join(lines)

    def _design(self) -> list[str]:
        """How the tasks and the seeds were chosen: the premise measured before training, the
        pilot's sizing, and the half-widths this run achieved on the sizing metric."""
        from ..envs.premise import premise_verdict
        from .config import CONTROL_TASKS, MAIN_TASK, PREMISE_TASKS

        premise = {str(r["task"]): r for r in self.design.get("premise", [])}
        sizing = self.design.get("sizing")
        if not premise and sizing is None:
            return []
        lines = ["", "## Design: tasks, pilot and seeds", ""]
        ran = [spec.name for spec in self.config.tasks if self._task_arms(spec.name)]
        if premise:
            lines += [
                "The tasks were chosen by MPO's premise, measured before any training "
                '(`python -m mpo_rs.envs.premise`, docs/envs.md, "Does a task meet MPO\'s premise?"; its '
                "results are docs/premise.json): the median between-turn share of the value variance of the "
                "task's exact reference critic under a base-level policy. The trained PPO critic's share is this "
                "run's, for comparison (claim 9 reads it).",
                "",
                "| task | role | reference critic's median between-turn share | premise | trained PPO critic's "
                "share (median over seeds) |",
                "|---|---|---:|---|---:|",
            ]
            for task in ran:
                role = (
                    "main"
                    if task == MAIN_TASK
                    else "premise"
                    if task in PREMISE_TASKS
                    else "control"
                    if task in CONTROL_TASKS
                    else "user"
                )
                share = premise.get(task, {}).get("median_between_share")
                trained = ppo_critic_share(self.rows, task)
                verdict = premise_verdict(share) if task in premise else "not measured"
                lines.append(f"| {task_title(task)} | {role} | {_fmt(share)} | {verdict} | {_fmt(trained, 2)} |")
            lines.append("")
        if sizing is not None:
            per = [p for p in sizing.per_comparison if math.isfinite(p["sd"])]
            driver = max(per, key=lambda p: p["sd"])
            cap = f", capped at the plan's {PLAN.max_seeds} (the time budget)" if sizing.capped else ""
            lines.append(
                f"**Seeds.** The pilot (docs/pilot/reproduction.md: this protocol on seeds "
                f"{PLAN.pilot_seeds[0]}-{PLAN.pilot_seeds[-1]}, every run reported, its seeds never reused) gave "
                f"the paired standard deviation of each Table-1 comparison on "
                f"{METRIC_NAMES.get(PLAN.sizing_metric, PLAN.sizing_metric)}; the plan's rule (the smallest n with "
                f"t_(0.975, n-1) sd / sqrt(n) <= {PLAN.target_half_width:g}) asks for {sizing.needed} seeds "
                f"(driven by {driver['what']}, sd {driver['sd']:.3f}){cap}: {sizing.seeds} seeds, and this run "
                f"has {self.config.seeds}."
            )
            lines.append("")
        table1 = [c for c in self.family_comps if c.metric == PLAN.sizing_metric and self._is_table1(c)]
        if table1:
            widths = []
            for task in ran:
                mine = [c.half_width for c in table1 if self._task_of(c) == task and math.isfinite(c.half_width)]
                if mine:
                    widths.append(f"{task_title(task)} {_fmt(min(mine))}-{_fmt(max(mine))}")
            met = sum(
                all(c.half_width <= PLAN.target_half_width for c in table1 if self._task_of(c) == task)
                for task in ran
                if any(self._task_of(c) == task for c in table1)
            )
            lines.append(
                f"Achieved Table-1 half-widths on {METRIC_NAMES.get(PLAN.sizing_metric, PLAN.sizing_metric)}: "
                + "; ".join(widths)
                + f" (the target {PLAN.target_half_width:g} is met on {met} of {len(widths)} tasks)."
            )
        return lines

    def _is_table1(self, comp: Comparison) -> bool:
        return any(c.claim == "table1" and (c.a, c.b) == (comp.a, comp.b) for c in PLAN.comparisons)

    def _starting_point(self) -> list[str]:
        """Where the arms started, per task: the base policies' held-out success against the
        band, and the warmed-up critics' held-out explained variance (one per task and seed,
        shared by the seed's arms), with the settings that made them."""
        config = self.config
        if config.base is None and config.warmup is None:
            return []
        low, high = BASE_BAND
        lines = ["", "## Starting point: base policies and critic warm-up", ""]
        if config.base is not None:
            b = config.base
            lines.append(
                f"Every arm of a seed starts from the same base policy: behaviour cloning ({b.steps} steps of "
                f"{b.batch_size}, lr {b.lr:g}) on {b.episodes} demonstrations of a noisy oracle whose turns are "
                f'replaced at random with probability eps (docs/envs.md, "Base policies"), eps set per task '
                f"before any RL run so that held-out success lands in the paper's band {low:g}-{high:g}."
            )
            lines.append("")
        if config.warmup is not None:
            w = config.warmup
            lines.append(
                f"Every arm that trains a critic starts from the same warmed-up critic: {w.steps} steps of "
                f"{w.batch_size} on the Monte-Carlo returns of {w.episodes} base-policy rollouts, at the critic's "
                f"learning rate {config.budget.critic_learning_rate:g} (VAPO's value pretraining)."
            )
            lines.append("")
        lines += [
            "| task | eps | base held-out success: mean [min, max] over seeds | seeds in the band | "
            "warmed-up critic's held-out explained variance: mean [min, max] |",
            "|---|---:|---|---:|---|",
        ]
        for spec in config.tasks:
            keys = {a.key for a in self._task_arms(spec.name)}
            per_seed: dict[int, tuple[float, float]] = {}
            for r in self.rows:
                if r["arm"] in keys:
                    old = per_seed.get(int(r["seed"]), (math.nan, math.nan))
                    base = r.get("base_success", math.nan)
                    ev = r.get("warmup_explained_variance", math.nan)
                    per_seed[int(r["seed"])] = (
                        base if math.isfinite(base) else old[0],
                        ev if math.isfinite(ev) else old[1],
                    )
            if not per_seed:
                continue
            bases = [v[0] for v in per_seed.values() if math.isfinite(v[0])]
            evs = [v[1] for v in per_seed.values() if math.isfinite(v[1])]
            band = sum(low <= x <= high for x in bases)
            eps = _fmt(dict(config.base.noise).get(spec.name, math.nan), 2) if config.base is not None else "—"
            lines.append(
                f"| {task_title(spec.name)} | {eps} | {_spread(bases)} | {band} of {len(bases)} | {_spread(evs, 2)} |"
            )
        return lines

    def _resumed(self) -> str:
        """What the wall time leaves out: the runs an earlier start finished (a resume)."""
        resumed = int(self.meta.get("resumed", 0))
        if not resumed:
            return ""
        own = sum(float(r.get("wall_s", math.nan)) for r in self.rows) / 60
        return (
            f", of which {resumed} were finished by an earlier start and resumed, so their time is not in it "
            f"(the runs' own wall times sum to {own:.1f} min over {self.meta['workers']} worker(s))"
        )

    def _claims_section(self) -> list[str]:
        lines = [
            "## Claims",
            "",
            "| # | the paper | what the toy runs show (paired difference, 95% CI, half-width, seeds; Welch's CI) "
            "| verdict |",
            "|---|---|---|---|",
        ]
        shown = [c for c in self.found if c.comparisons]
        for c in shown:
            text = "<br>".join(x.text() + f" → {x.verdict}" for x in c.comparisons)
            if c.note:
                text += f"<br>*{c.note}*"
            lines.append(f"| {c.number} | {c.paper} | {text} | **{c.verdict}** |")
        if len(shown) < len(self.found):
            missing = ", ".join(str(c.number) for c in self.found if not c.comparisons)
            lines += ["", f"Claims {missing}: not measured (their arms were not run)."]
        lines += [
            "",
            "## Power achieved",
            "",
            f"The Holm-corrected family (alpha = {FAMILY_ALPHA:g}): the paired 95% half-width each comparison "
            "achieved.",
            "",
            "| task | comparison | metric | paired seeds | half-width | paired p | Holm p | verdict |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for comp in self.family_comps:
            lines.append(
                f"| {task_title(self._task_of(comp))} | {comp.what} | {METRIC_NAMES.get(comp.metric, comp.metric)} | "
                f"{comp.n} | {_fmt(comp.half_width)} | {_fmt(comp.p)} | "
                f"{_fmt(comp.p_holm)} | {comp.verdict} |"
            )
        return lines

    def _tables(self, figures: dict[str, str]) -> list[str]:
        rows, config = self.rows, self.config
        lines = ["", "## Results per arm", ""]
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
            cells = [arm.label, task_title(arm.task), knobs, arm.ratio, arm.advantage_scale]
            cells.append(_ci_text([r["final_success"] for r in mine]))
            cells += [_ci_text([r.get(f"final_pass@{k}", math.nan) for r in mine]) for k in ks]
            for metric in ("final_explained_variance", "final_entropy", "final_turns", "between_share"):
                cells.append(_ci_text([r[metric] for r in mine], 2))
            cells.append(str(len(mine)))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "## Figures", ""]
        for title, rel in figures.items():
            lines += [f"### {title}", "", f"![{title}]({rel})", ""]
            if self.captions.get(title):
                lines += [self.captions[title], ""]
        return lines

    def _configuration(self) -> list[str]:
        from .api import command_line, is_committed

        config = self.config
        lines = [
            "## Configuration",
            "",
            "Every arm gets the same budget and model; an arm sets only its estimator, its ratio and its "
            "advantage scale (`group-std`: GRPO's (score - group mean) / group std; `whiten`: over the "
            "batch's policy tokens, as verl does for GAE; `none`: as estimated, in reward units).",
            "",
            f"**Advantage scale.** {ADVANTAGE_SCALE_RULE}",
            "",
            "The arms whose estimator reads values (PPO, MPO and its variants, the relatives) train a critic "
            "on Monte-Carlo returns (λ_critic = 1), after the warm-up; GRPO and GSPO train none and compute "
            "no values (their explained variance is not defined). Entropy is -mean log π of the sampled "
            "tokens (an unbiased estimate); explained variance is 1 - Var(G - V) / Var(G) over the policy "
            "tokens of each update's fresh batch (before the update), undefined when every return is equal. "
            f"The summary calls a critic untrained when its explained variance at the end stays below {CRITIC_EV_FLOOR:g}.",
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
        for r in self.rows:
            lines.append(
                f"| {r['arm']} | {r['seed']} | {_fmt(r['final_success'])} | {_fmt(r['auc_success'])} | "
                f"{_fmt(r['final_explained_variance'], 2)} | {_fmt(r['final_entropy'], 2)} | "
                f"{_fmt(r['final_turns'], 2)} | {_fmt(r['between_share'], 2)} | {_fmt(r['wall_s'], 0)} |"
            )
        if is_committed(config):
            again = (
                "Regenerate: `make reproduce` (this configuration); `mpo-rs reproduce --quick --out DIR` is the "
                "smoke test."
            )
        else:
            cmd = command_line(config)
            again = f"Rerun: `{cmd} --out DIR`." if cmd else "Rerun: `mpo_rs.reproduce.compare` with the same budget."
        lines += [
            "",
            again + " Tables: `runs.parquet`, `curves.parquet`, `evals.parquet` and `results.json` in the "
            "output directory.",
            "",
        ]
        return lines


CONTROLS_SECTION = [
    "## Controls: the earlier run",
    "",
    "[docs/control/reproduction.md](control/reproduction.md) is the committed run this page replaced "
    "(configuration 796ef3ad680c, commit a59c8d2, 90 runs, kept unchanged): KeyDoor and GuessNumber only, "
    "policies and critics from a random initialisation (no base policy, no critic warm-up), 5 seeds, each claim "
    "decided by Welch's unpaired interval without a multiplicity correction, 64 evaluation episodes. Every "
    "Table-1 claim was inconclusive there, and claim 1 was not reproduced (the trained critics' median "
    "between-turn share was 0.09-0.13, the paper's 0.895), which KeyDoor dictates: its decisive tokens are the "
    "policy's own and its observations are noise, so the premise fails by construction (docs/envs.md). It "
    "stays as the negative control of the premise; its runs are not pooled with this page's.",
    "",
]
"""The committed page's pointer to the run it replaced (docs/control/), which no command rewrites."""


def _spread(xs: Sequence[float], digits: int = 3) -> str:
    """mean [min, max], or a dash when there is nothing."""
    if not xs:
        return "—"
    return f"{_fmt(float(np.mean(xs)), digits)} [{_fmt(min(xs), digits)}, {_fmt(max(xs), digits)}]"


def _nanmedian(xs: Sequence[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return float(np.median(finite)) if finite else math.nan


def _cell(c: Comparison | None) -> str:
    """A family comparison in a table cell: difference ± half-width, Holm p, verdict."""
    if c is None:
        return "—"
    if not math.isfinite(c.diff):
        return "not measured"
    if not math.isfinite(c.half_width):
        return f"{c.diff:+.3f} (no interval), {c.verdict}"
    text = f"{c.diff:+.3f} ± {c.half_width:.3f}, p={_fmt(c.p_holm)}, "
    if c.verdict != INCONCLUSIVE:
        return text + f"**{c.verdict}**"
    margin = PLAN.target_half_width
    return text + c.verdict + (f", within ±{margin:g}" if -margin < c.low and c.high < margin else "")


def _power(comps: list[Comparison]) -> str:
    widths = [c.half_width for c in comps if math.isfinite(c.half_width)]
    if not widths:
        return ""
    n = sorted({c.n for c in comps if math.isfinite(c.half_width)})
    seeds = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    low, high = _fmt(min(widths), 3), _fmt(max(widths), 3)
    spread = low if low == high else f"{low}-{high}"
    return f"Power achieved: 95% half-widths {spread} on {seeds} paired seed(s)."


def _counts(comps: list[Comparison], decided_only: bool = False) -> str:
    names = (REPRODUCED, NOT_REPRODUCED) if decided_only else (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
    count = {v: sum(c.verdict == v for c in comps) for v in names}
    return ", ".join(f"{n} {v}" for v, n in count.items() if n or not decided_only)


def _tally(comps: list[Comparison], lead: str) -> str:
    if not comps:
        return ""
    return f"{lead}: {len(comps)}, of which {_counts(comps)}."


# The docs test (tests/test_docs.py) skips a block marked so, showing the reason.
NOT_RUN_HERE = (
    "<!-- not run: trains three arms (minutes); tests/test_reproduce_custom.py runs the same on a tiny budget -->"
)


def my_task_section(config: ReproduceConfig) -> list[str]:
    """'Does MPO help on my task?': the command on a tiny user env, and how to read it."""
    from .api import _base, arm_keys

    quick, small, full = (_base(name, "cpu").budget for name in ("quick", "small", "full"))
    keys = arm_keys("user")
    base = _base("full", "cpu")
    table1 = [k for k in keys if base.arm(k).family == base.arm("mpo").family]
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
        "from mpo_rs.reproduce import compare",
        "",
        'result = compare("examples.my_env:make", arms=("mpo", "ppo", "grpo"), seeds=5, budget="small", out="my-run")',
        "for c in result.family:  # MPO - PPO, MPO - GRPO: paired by seed, Holm-corrected",
        "    print(c.what, round(c.diff, 3), round(c.half_width, 3), c.verdict)",
        "```",
        "",
        f"- `--arms`: any of {', '.join(keys)} (default: {', '.join(table1)}); `--env-param KEY=VALUE` passes "
        "a keyword argument to the factory; `--seeds N` and `--first-seed S` choose the seeds.",
        f"- `--budget`: `quick` ({quick.updates} updates of {quick.episodes_per_update} episodes, a smoke test that "
        f"says nothing about MPO), `small` ({small.updates} updates of {small.episodes_per_update}: a first look) or "
        f"`full` ({full.updates} updates of {full.episodes_per_update}, the reported run's).",
        "- The page it writes opens with the same summary: per comparison MPO - X, the paired difference, its "
        "95% half-width and the Holm verdict. *Inconclusive* with a half-width larger than the gain that matters "
        "to you asks for more seeds, not for the conclusion that MPO does nothing.",
        "- Whether MPO should help: its premise is that value changes at turn boundaries, where observations "
        "bring information. `mpo-rs diagnose OUT/rollouts/mpo-seed1.parquet` measures the between-turn share "
        "of the trained critic's value variance; docs/envs.md measures it before training for the built-in "
        "tasks, on KeyDoor (where the premise fails) and on the tasks where it holds.",
        "- An output directory holds one configuration: its hash covers the env's `module:factory` and "
        "parameters, the arms, the seeds and the budget. The same command resumes the finished runs; another "
        "env or parameter is refused there.",
        "",
    ]


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
            report = output_subdir(out, Path("diagnosis") / run["arm"])  # no link followed
            write_diagnosis(diag, report, figures=True, overwrite=True, inputs=[path])


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
    from .api import task_chance

    out = Path(out_dir)
    img = output_subdir(out, "img")
    diagnose_runs(runs, out)
    rows = [summarize_run(r) for r in runs]
    found = claims(rows, config)
    _write_tables(runs, rows, config, out)

    label = _labels(config)
    present = {r["arm"] for r in rows}
    ran = {a.task for a in config.arms if a.key in present}
    chance = {spec.name: task_chance(spec) for spec in config.tasks if spec.name in ran}
    groups = figure_groups(config, present)
    figures: dict[str, Path] = {}
    captions: dict[str, str] = {}
    family_comps = family_comparisons(rows, found, config)
    if family_comps:
        arm_task = {a.key: a.task for a in config.arms}
        title = "The family's paired differences"
        figures[title] = _plot_family(family_comps, lambda c: arm_task.get(c.a, ""), img / "family.png")
        captions[title] = (
            "Each row is one comparison A - B of the analysis plan's family on one task: the mean per-seed "
            "difference and its uncorrected paired 95% interval; the colour is the Holm-corrected verdict "
            "(so an interval may exclude 0 in grey)."
        )
    for group in groups:
        if group.family in SWEEPS:
            continue
        title = f"Learning curves, {group.title}"
        slug = "".join(ch if ch.isalnum() else "_" for ch in f"{group.task}_{group.family}")
        figures[title], captions[title] = _plot_curves(
            runs, group.arms, group.title, img / f"curves_{slug}.png", chance.get(group.task, (None, ""))[0]
        )
    if groups:
        figures["Final success with 95% CIs"] = _plot_bars(rows, groups, chance, img / "final_success.png")
    for arm in ("mpo", "ppo"):
        src = out / "diagnosis" / arm
        for png in sorted(src.glob("*.png")) if src.is_dir() else []:
            figures[f"Value structure of the {label.get(arm, arm)} critic ({png.stem.replace('_', ' ')})"] = png

    results = {
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "meta": meta,
        "chance": {task: {"success": value, "how": how} for task, (value, how) in chance.items()},
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
    fam = family(config)
    results["family"] = {
        "plan_hash": PLAN.plan_hash(),
        "alpha": FAMILY_ALPHA,
        "correction": "holm",
        "comparisons": [{"metric": m, "a": a, "b": b} for m, a, b in fam],
    }
    results["family_comparisons"] = [vars(c) for c in family_comps]
    page = Page(config, rows, found, family_comps, chance, meta, captions, _design_inputs(config, docs_dir))
    results["summary"] = page.summary()
    label = _labels(config)
    for comp in family_comps:
        words = direction_words(
            label.get(comp.a, comp.a), label.get(comp.b, comp.b), comp.diff, comp.half_width, comp.verdict
        )
        note(
            f"{comp.what} ({comp.metric}): {words} (paired 95%, {comp.n} seeds, Holm p={_fmt(comp.p_holm)}: "
            f"{comp.verdict})"
        )
    write_file(out / "results.json", json.dumps(results, indent=1, default=_json_default, allow_nan=True))
    write_file(out / "reproduction.md", page.markdown({t: str(p.relative_to(out)) for t, p in figures.items()}))
    note(f"wrote {out / 'reproduction.md'} and {out / 'results.json'}")
    if docs_dir is not None:
        docs = Path(docs_dir)
        dest = output_subdir(docs, Path("img") / "reproduction")
        rel: dict[str, str] = {}
        for title, path in figures.items():
            name = path.name if path.parent == img else f"{path.parent.name}_{path.name}"
            write_file(dest / name, path.read_bytes())
            rel[title] = f"img/reproduction/{name}"
        write_file(docs / "reproduction.md", page.markdown(rel))
        note(f"wrote {docs / 'reproduction.md'} and {len(rel)} figures under {dest}")
    return results


def _design_inputs(config: ReproduceConfig, docs_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The committed records the design section reads, from the docs directory the committed
    page is written to: the premise measurement and the pilot's results (then sized by the plan)."""
    from .api import is_committed
    from .plan import sizing

    if docs_dir is None or not is_committed(config):
        return {}
    docs = Path(docs_dir)
    out: dict[str, Any] = {}
    premise = docs / "premise.json"
    if premise.is_file():
        out["premise"] = json.loads(premise.read_text())
    pilot = docs / "pilot" / "results.json"
    if pilot.is_file():
        out["sizing"] = sizing(json.loads(pilot.read_text())["runs"])
    return out


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def page_from_results(
    results: dict[str, Any],
    config: ReproduceConfig,
    figures: Sequence[tuple[str, str, str]],
    docs_dir: str | os.PathLike[str] | None = None,
) -> str:
    """The page of a finished run, rendered again from its ``results.json`` content alone:
    the claims and the family are recomputed from its rows; ``figures`` are the page's
    (title, relative path, caption) in order (``results["figures"]`` where a run recorded
    them). The committed page re-renders byte for byte (tests/test_reproduce_page.py)."""
    rows = results["runs"]
    found = claims(rows, config)
    family_comps = family_comparisons(rows, found, config)
    chance = {task: (c["success"], c["how"]) for task, c in results["chance"].items()}
    captions = {title: caption for title, _, caption in figures if caption}
    page = Page(config, rows, found, family_comps, chance, results["meta"], captions, _design_inputs(config, docs_dir))
    return page.markdown({title: rel for title, rel, _ in figures})
