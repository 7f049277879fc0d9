"""The claims and the confirmatory comparisons: the paired comparisons of arms
(:class:`Comparison`), the paper's claims with their verdicts (:func:`claims`) and the
analysis plan's confirmatory comparisons with Holm's correction
(:func:`confirmatory_comparisons`), computed from the rows and the gates: a comparison on a
task that does not pass its gates (``withheld``, :func:`.gating.withheld`) keeps its numbers
and gets no verdict; an undecided confirmatory one on a gated task gets the plan's
equivalence reading (TOST)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpo_rs.diagnose.summary import ON_TURNS_SHARE, WITHIN_TURNS_SHARE

from .config import BETA_SWEEP, LAMBDA_GRID, ReproduceConfig, task_prefix
from .plan import PLAN, PLAN_RECORDS, PLANS, plan_for
from .rows import arm_labels, by_seed, nanmedian, task_title
from .stats import (
    INCONCLUSIVE,
    NO_VERDICT,
    Paired,
    combine,
    diff_ci,
    difference_of_group_means,
    holm,
    holm_verdict,
    paired_diff_ci,
    tost_p,
    verdict,
)

REGISTERED: dict[str, tuple[tuple[str, str, str], ...]] = {name: tuple(p.confirmatory()) for name, p in PLANS.items()}
"""Per plan (:data:`~mpo_lab.reproduce.plan.PLANS`), its confirmatory comparisons as (metric, A, B)."""
CONFIRMATORY = REGISTERED["paper"]
"""The confirmatory comparisons, corrected for multiplicity, fixed in advance by the committed
analysis plan (:data:`mpo_lab.reproduce.plan.PLAN`: Table 1 on every task, MPO against its
public relatives, the β and (λ, λ_intra) claims on the main task, each on both metrics), as
(metric, A, B) for the claim "A beats B"; Holm's correction runs over all of them (a
comparison that cannot be made counts as p = 1)."""


ALPHA = PLAN.alpha
"""The plan's significance level: the Holm-corrected confirmatory comparisons' chance of any
false verdict among them, and the level of each one-sided test of equivalence (TOST)."""


def confirmatory(config: ReproduceConfig) -> tuple[tuple[str, str, str], ...]:
    """The confirmatory comparisons of ``config``, corrected for multiplicity together: those of
    its plan (:data:`REGISTERED`; the paper's: :data:`CONFIRMATORY`) whose two arms it runs (a chosen subset of arms fixes fewer with it).
    Every use of them in this module goes through here."""
    keys = {arm.key for arm in config.arms}
    plan_for(config)  # an unknown plan is refused by name
    return tuple(c for c in REGISTERED[config.plan] if c[1] in keys and c[2] in keys)


CRITIC_EV_FLOOR = 0.1
"""A critic whose explained variance at the end of training (mean over seeds) stays below
this has not learned; the summary says so (GAE and MAE then run on near-constant values)."""


METRIC_NAMES = {
    "final_success": "final held-out success",
    "auc_success": "mean held-out success over training",
}
"""How a metric of the plan is named in the summary (another by its key)."""


def verdict_rule(config: ReproduceConfig, plan_hash: str = "") -> str:
    """The verdict rule as the page states it (the code is :func:`claims`); ``plan_hash`` the
    plan the run followed ('': today's)."""
    tested = confirmatory(config)
    pairs = len({(a, b) for _, a, b in tested})
    metrics = " and ".join(METRIC_NAMES.get(m, m) for m in dict.fromkeys(m for m, _, _ in tested))
    text = (
        "Runs share their seeds across arms (same initialisation, tasks and sampler draws), so the "
        'primary analysis is paired by seed: for a claim "A beats B", the per-seed differences A - B '
        "over the seeds run on both arms give a mean and a Student-t 95% interval on n - 1 degrees of "
        "freedom; Welch's unpaired interval of the difference of the seed means is shown beside it. "
    )
    if tested:
        text += (
            f'The {len(tested)} comparisons listed under "Power achieved" ({pairs} pair(s) of arms, each on {metrics}) '
            f"are the confirmatory comparisons, fixed in advance by the analysis plan "
            f"`{plan_hash or plan_for(config).plan_hash()}` ({PLAN_RECORDS[config.plan][0]}), with Holm-Bonferroni "
            "adjusted p-values of the two-sided paired t-test: such a comparison is **reproduced** when its "
            f"adjusted p-value is below {ALPHA:g} and the difference is positive, **not reproduced** when "
            f"it is below {ALPHA:g} and the difference is negative, **inconclusive** otherwise (the "
            "intervals shown for them are the uncorrected 95% ones, so one may exclude 0 while Holm does not "
            "reject). Every other comparison"
        )
    else:
        text += "Every comparison"
    margins = " and ".join(f"±{m:g} on {METRIC_NAMES.get(k, k)}" for k, m in PLAN.equivalence_margins)
    return text + (
        " is decided by its paired 95% interval: above 0 **reproduced**, below 0 **not "
        "reproduced**, containing 0 **inconclusive** (uncorrected: read them as exploratory). A claim "
        "made of several comparisons is reproduced when all are, not reproduced when any is reversed. "
        "All of this holds only on a task that passes every gate of its role (see Gates): on any other task a "
        "comparison is shown with **no verdict**. An inconclusive confirmatory comparison on a gated task reads "
        f"**equivalent** within the plan's margin ({margins}) when both one-sided paired t-tests reject at "
        f"{ALPHA:g} (its paired 90% interval lies inside the margin; TOST, uncorrected), and **no "
        "difference shown** otherwise; never as equivalence on a task that is not gated."
    )


@dataclass
class Comparison:
    """A - B for one metric over seeds: the paired analysis (``diff``, ``low``, ``high``: the
    mean per-seed difference and its 95% interval over ``n`` seeds run on both arms; ``p``:
    the paired t-test's two-sided p-value), Welch's unpaired interval beside it, and for a
    comparison in :data:`CONFIRMATORY` its Holm-adjusted p-value. One-sample comparisons (``b``
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
    p_tost: float = math.nan
    """The TOST p-value of equivalence within ``margin`` (a confirmatory comparison's, on a gated task)."""
    margin: float = math.nan
    withheld: str = ""
    """Why the comparison gets no verdict (its task does not pass its gates); '' when it has one."""

    def reading(self) -> str:
        """What the comparison says: its verdict when decided, else "equivalent within ±m"
        (TOST below alpha) or "no difference shown"; with no verdict, why."""
        if self.withheld:
            return f"{NO_VERDICT}: {self.withheld}"
        if self.verdict != INCONCLUSIVE:
            return self.verdict
        if math.isfinite(self.p_tost) and self.p_tost < ALPHA:
            return f"equivalent within ±{self.margin:g}"
        return "no difference shown"

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


def _compare(rows: list[dict[str, Any]], metric: str, a: str, b: str, what: str, offset: float = 0.0) -> Comparison:
    mine = by_seed(rows, metric, a)
    if b == "":  # one-sample: A - offset
        paired = paired_diff_ci(mine, dict.fromkeys(mine, offset))
        welch = (math.nan, math.nan)
    else:
        theirs = by_seed(rows, metric, b)
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


def _holm_adjusted(
    rows: list[dict[str, Any]], tested: tuple[tuple[str, str, str], ...]
) -> dict[tuple[str, str, str], float]:
    """Holm-adjusted p-values of the confirmatory comparisons' paired tests, keyed like ``tested``."""
    ps = [_compare(rows, metric, a, b, "").p for metric, a, b in tested]
    return dict(zip(tested, holm(ps), strict=True))


Withheld = Mapping[str, str] | None
"""Task -> why its comparisons get no verdict ('' for a gated task; :func:`.gating.withheld`).
None: no gating, every comparison decided by the statistics alone and none read as equivalence
(a caller that gates elsewhere)."""


def _decide(
    c: Comparison, adjusted: Mapping[tuple[str, str, str], float], withheld: Withheld, tasks: Mapping[str, str]
) -> None:
    """Sets ``c``'s verdict: Holm's when it is confirmatory (and the TOST of equivalence within
    the plan's margin of its metric); then, on a task whose gates it does not pass, no verdict."""
    key = (c.metric, c.a, c.b)
    if key in adjusted:
        c.p_holm = adjusted[key]
        c.verdict = holm_verdict(c.diff, c.p_holm, ALPHA)
    if withheld is None:
        return  # the statistics alone: verdicts, and no equivalence reading (it needs a gated task)
    task = tasks.get(c.a, "")
    reason = withheld.get(task, "its gates were not measured") if task else ""
    if reason:
        c.verdict, c.withheld = NO_VERDICT, reason
    elif key in adjusted:
        c.margin = PLAN.margin(c.metric)
        c.p_tost = tost_p(c.diff, c.low, c.high, c.n, c.margin)


def claims(rows: list[dict[str, Any]], config: ReproduceConfig, withheld: Withheld = None) -> list[Claim]:
    """The paper's claims, each measured on the runs: final held-out success unless said;
    a comparison on a task not gated (``withheld``) has no verdict."""
    present = {r["arm"] for r in rows}
    label = arm_labels(config)
    keys = {arm.key for arm in config.arms}
    main = task_title(config.arm("mpo").task) if "mpo" in keys else "KeyDoor"
    out: list[Claim] = []
    adjusted = _holm_adjusted(rows, confirmatory(config))
    tasks = {arm.key: arm.task for arm in config.arms}

    def claim(number: int, paper: str, comps: list[Comparison], note: str = "") -> None:
        comps = [c for c in comps if c.a in present and (c.b == "" or c.b in present)]
        for c in comps:
            _decide(c, adjusted, withheld, tasks)
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
            _compare(rows, "final_success", arm, whitened, f"{label[arm]} - {label[whitened]}")
            for arm, whitened in (("ppo", "ppo_whiten"), ("mpo", "mpo_whiten"))
        ],
        "The pilot that fixed the advantage-scale rule (seed 0) found it; "
        + (
            "these runs include seed 0, so they do not test it independently."
            if 0 in config.seed_list
            else "these runs do not reuse its seed."
        ),
    )
    out.append(_prediction_claim(rows, config, adjusted, withheld))
    return out


def _on_plan_metrics(rows: list[dict[str, Any]], a: str, b: str, what: str) -> list[Comparison]:
    """A - B on each of the plan's metrics, the primary first."""
    return [_compare(rows, m, a, b, f"{what} ({METRIC_NAMES.get(m, m)})") for m in PLAN.metrics]


def ppo_critic_share(rows: list[dict[str, Any]], task: str) -> float:
    """The median over seeds of the between-turn share of ``task``'s trained PPO critic (NaN
    when there is none): what claim 9, the estimates table and the design section read."""
    ppo = f"{task_prefix(task)}ppo"
    return nanmedian([float(r.get("between_share", math.nan)) for r in rows if r["arm"] == ppo])


PREDICTION_BASELINES = ("ppo", "grpo")
"""The arms MPO's gain is measured against in the diagnose-predicts-benefit question."""


def _prediction_claim(
    rows: list[dict[str, Any]],
    config: ReproduceConfig,
    adjusted: dict[tuple[str, str, str], float],
    withheld: Withheld = None,
) -> Claim:
    """Claim 9, the question no anchor answers: does ``mpo-rs diagnose`` predict where MPO
    helps? Per task, MPO's paired gain over PPO and over GRPO on the primary metric beside
    the median between-turn share of that task's trained PPO critic (its diagnosis; PPO's
    critic is not shaped by MAE); then, per baseline, the mean gain on the tasks whose share
    reads "on turns" (>= ON_TURNS_SHARE) minus that on the tasks whose share reads "within
    turns" (< WITHIN_TURNS_SHARE), with its interval (:func:`difference_of_group_means`).
    Reproduced ("it predicts") when that difference is positive with 95% confidence."""
    label = arm_labels(config)
    present = {r["arm"] for r in rows}
    metric = PLAN.metrics[0]
    comps: list[Comparison] = []
    groups: dict[str, dict[str, list[Paired]]] = {b: {"on": [], "off": []} for b in PREDICTION_BASELINES}
    for spec in config.tasks:
        prefix = task_prefix(spec.name)
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
            _decide(c, adjusted, withheld, {mpo: spec.name})  # Table 1's: the confirmatory correction
            comps.append(c)
            if side is not None and not c.withheld:  # only gated tasks' gains enter the contrast
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
        if withheld is not None and not (on and off):
            contrasts[-1].verdict = NO_VERDICT
            contrasts[-1].withheld = "it needs a gated task on each side of the split"
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


def confirmatory_comparisons(
    rows: list[dict[str, Any]], found: list[Claim], config: ReproduceConfig, withheld: Withheld = None
) -> list[Comparison]:
    """The confirmatory comparisons, in the plan's order, Holm-adjusted, with their equivalence
    reading, and no verdict on a task not gated (``withheld``): the same numbers a claim that
    shows one of them has (they may compare arms no claim of the paper names, e.g. on a
    task of its own). ``found`` is accepted for the callers' symmetry and not read."""
    tested = confirmatory(config)
    adjusted = _holm_adjusted(rows, tested)
    label = arm_labels(config)
    tasks = {arm.key: arm.task for arm in config.arms}
    out = []
    for key in tested:
        # Named here, the same way whichever claim (if any) also shows it.
        metric, a, b = key
        comp = _compare(rows, metric, a, b, f"{label.get(a, a)} - {label.get(b, b)}")
        _decide(comp, adjusted, withheld, tasks)
        out.append(comp)
    return out
