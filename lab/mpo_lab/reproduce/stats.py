"""Confidence intervals over seeds and the verdict rule (numpy only).

- :func:`mean_ci`: the mean over seeds with a Student-t 95% interval.
- :func:`diff_ci`: the difference of two arms' means with a Welch 95% interval (unequal
  variances; degrees of freedom rounded down, which widens the interval).
- :func:`paired_diff_ci`: the mean of the per-seed differences A - B (runs matched by
  seed; only the seeds present on both sides count) with a Student-t 95% interval on n - 1
  degrees of freedom and the two-sided p-value of the paired t-test. The arms share their
  seeds (same initialisation, tasks and sampler draws), so this is the primary analysis.
- :func:`t_cdf` / :func:`t_two_sided_p`: Student's t distribution through the regularized
  incomplete beta function (a continued fraction; no scipy at run time).
- :func:`holm`: Holm-Bonferroni step-down adjusted p-values over comparisons corrected together.
- :func:`verdict`: a claim "A > B" is *reproduced* when the interval of A - B lies above
  0, *not reproduced* when it lies below 0, and *inconclusive* otherwise (or when it is
  undefined: fewer than 2 seeds, a missing arm). :func:`holm_verdict` is the same rule for
  a comparison among those corrected together: the Holm-adjusted p-value below alpha decides, and
  the sign of the difference says which way. :data:`NO_VERDICT` is a comparison's on a task
  that does not pass its gates (:mod:`.gating`): its numbers are shown, nothing is decided.
- :func:`tost_p`: the two one-sided tests of equivalence within a margin (TOST) on the paired
  differences: the larger of the two one-sided p-values, below alpha exactly when the
  (1 - 2 alpha) paired interval lies inside the margin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "INCONCLUSIVE",
    "NOT_REPRODUCED",
    "NO_VERDICT",
    "REPRODUCED",
    "Paired",
    "combine",
    "diff_ci",
    "difference_of_group_means",
    "direction_words",
    "holm",
    "holm_verdict",
    "mean_ci",
    "paired_diff_ci",
    "t_cdf",
    "t_quantile",
    "t_two_sided_p",
    "tost_p",
    "verdict",
]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NO_VERDICT = "no verdict"

# Two-sided 95% quantiles t_{0.975, df}, df = 1..30; beyond, the normal 1.96 is close enough.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile(df: float) -> float:
    """t_{0.975} for ``df`` degrees of freedom, rounded down (NaN below 1)."""
    if not df >= 1:
        return math.nan
    d = math.floor(df)
    return _T975[d - 1] if d <= len(_T975) else 1.96


def _clean(xs: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(xs), dtype=np.float64)
    return a[np.isfinite(a)]


def mean_ci(xs: Iterable[float]) -> tuple[float, float, float, int]:
    """(mean, low, high, n) over the finite values; the interval is NaN below 2 values."""
    a = _clean(xs)
    n = int(a.size)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(a.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = t_quantile(n - 1) * float(a.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def diff_ci(a_values: Iterable[float], b_values: Iterable[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's 95% interval; NaN bounds with < 2 values on
    either side. When both sides have zero variance the interval is the point itself."""
    a, b = _clean(a_values), _clean(b_values)
    if a.size == 0 or b.size == 0:
        return math.nan, math.nan, math.nan
    diff = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return diff, math.nan, math.nan
    va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
    se2 = va + vb
    if se2 == 0:
        return diff, diff, diff
    df = se2**2 / ((va**2 / (a.size - 1) if va else 0.0) + (vb**2 / (b.size - 1) if vb else 0.0))
    half = t_quantile(df) * math.sqrt(se2)
    return diff, diff - half, diff + half


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (NaN when undefined)."""
    if not (df > 0) or math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (NaN when undefined)."""
    p = t_two_sided_p(t, df)
    if math.isnan(p):
        return math.nan
    return 1.0 - p / 2.0 if t > 0 else p / 2.0


class Paired(NamedTuple):
    """The paired analysis of A - B: mean per-seed difference, its 95% interval, the number
    of seeds paired, and the two-sided p-value of the paired t-test."""

    diff: float
    low: float
    high: float
    n: int
    p: float


def paired_diff_ci(a_by_seed: Mapping[int, float], b_by_seed: Mapping[int, float]) -> Paired:
    """A - B paired by seed: only the seeds present on both sides with finite values count
    (a seed run on one side only is left out). With n pairs the interval is
    mean(d) +- t_{0.975, n-1} sd(d) / sqrt(n) and p is the paired t-test's; NaN bounds and
    p below 2 pairs. When every difference is equal the interval is the point itself and p
    is 0 (1 when the differences are all 0)."""
    seeds = sorted(
        s for s in a_by_seed if s in b_by_seed and math.isfinite(a_by_seed[s]) and math.isfinite(b_by_seed[s])
    )
    d = np.asarray([a_by_seed[s] - b_by_seed[s] for s in seeds], dtype=np.float64)
    n = int(d.size)
    if n == 0:
        return Paired(math.nan, math.nan, math.nan, 0, math.nan)
    diff = float(d.mean())
    if n < 2:
        return Paired(diff, math.nan, math.nan, n, math.nan)
    se = float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0:
        return Paired(diff, diff, diff, n, 1.0 if diff == 0 else 0.0)
    half = t_quantile(n - 1) * se
    return Paired(diff, diff - half, diff + half, n, t_two_sided_p(diff / se, n - 1))


def difference_of_group_means(high: Sequence[Paired], low: Sequence[Paired]) -> tuple[float, float, float]:
    """(difference, low, high) of the mean of the paired differences in ``high`` minus the
    mean of those in ``low`` -- the paired gains of an arm on two groups of tasks, which share
    no runs, so their errors are independent. Each gain's standard error is its interval's
    half-width over t_{0.975, n-1}; the interval is the difference +- t_{0.975, df} times the
    combined standard error, with df the smallest n - 1 of all the gains (conservative). NaN
    when a group is empty or a gain has no interval."""
    if not high or not low:
        return math.nan, math.nan, math.nan
    gains = [*high, *low]
    if any(g.n < 2 or not (math.isfinite(g.low) and math.isfinite(g.high)) for g in gains):
        return math.nan, math.nan, math.nan

    def mean_and_var(group: Sequence[Paired]) -> tuple[float, float]:
        ses = [(g.high - g.low) / 2 / t_quantile(g.n - 1) for g in group]
        return float(np.mean([g.diff for g in group])), sum(se * se for se in ses) / len(group) ** 2

    (m_hi, v_hi), (m_lo, v_lo) = mean_and_var(high), mean_and_var(low)
    diff = m_hi - m_lo
    half = t_quantile(min(g.n for g in gains) - 1) * math.sqrt(v_hi + v_lo)
    return diff, diff - half, diff + half


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the order given. With the m p-values
    sorted ascending, p_(i) adjusted = max over j <= i of min(1, (m - j + 1) p_(j)); a
    comparison is rejected at level alpha when its adjusted p-value is below alpha. The
    m counts every entry: a NaN (a comparison that could not be made) stays NaN
    and is treated as p = 1, so a missing arm never makes the others' correction milder."""
    m = len(p_values)
    filled = [p if math.isfinite(p) else 1.0 for p in p_values]
    order = sorted(range(m), key=lambda i: filled[i])
    adjusted = [math.nan] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * filled[i]))
        adjusted[i] = running if math.isfinite(p_values[i]) else math.nan
    return adjusted


def holm_verdict(diff: float, p_adjusted: float, alpha: float = 0.05) -> str:
    """The rule for a claim "A > B" among Holm-corrected ones: *reproduced* when the
    adjusted p-value of the paired test is below ``alpha`` and A - B > 0, *not reproduced*
    when it is below ``alpha`` and A - B < 0, *inconclusive* otherwise (or undefined)."""
    if not (math.isfinite(diff) and math.isfinite(p_adjusted)) or p_adjusted >= alpha or diff == 0:
        return INCONCLUSIVE
    return REPRODUCED if diff > 0 else NOT_REPRODUCED


def verdict(low: float, high: float) -> str:
    """The rule for a claim "A > B" given the 95% interval of A - B."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if low > 0:
        return REPRODUCED
    if high < 0:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def tost_p(diff: float, low: float, high: float, n: int, margin: float) -> float:
    """The p-value of equivalence within +-``margin`` by two one-sided paired t-tests (TOST),
    from a paired analysis of A - B (``diff`` and its 95% interval ``low``-``high`` over ``n``
    seeds, as :func:`paired_diff_ci` gives them): the larger of the p-values of
    "A - B <= -margin" and "A - B >= +margin", on n - 1 degrees of freedom. Equivalence is
    shown at level alpha when it is below alpha, i.e. when the paired (1 - 2 alpha) interval
    lies inside the margin. NaN when undefined (fewer than 2 seeds, no margin)."""
    if n < 2 or not (math.isfinite(diff) and math.isfinite(low) and math.isfinite(high) and margin > 0):
        return math.nan
    se = (high - low) / 2 / t_quantile(n - 1)  # the interval's half-width is t_{0.975, n-1} se
    if se == 0:
        return 0.0 if abs(diff) < margin else 1.0
    lower = 1.0 - t_cdf((diff + margin) / se, n - 1)  # H0: A - B <= -margin
    upper = t_cdf((diff - margin) / se, n - 1)  # H0: A - B >= +margin
    return max(lower, upper)


def combine(verdicts: Sequence[str]) -> str:
    """A claim made of several comparisons: reproduced when every one is, not reproduced
    when any is reversed, inconclusive otherwise; no verdict when none of them has one."""
    if verdicts and all(v == NO_VERDICT for v in verdicts):
        return NO_VERDICT
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if any(v == NOT_REPRODUCED for v in verdicts):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def direction_words(a: str, b: str, diff: float, half_width: float, decided: str) -> str:
    """A comparison A - B in words a reader acts on, its verdict ``decided`` choosing them:
    "MPO ahead of PPO by 0.040 ± 0.020", "MPO behind PPO by 0.030 ± 0.010", or "no
    difference shown between MPO and PPO (+0.010 ± 0.030)"."""
    if not math.isfinite(diff):
        return f"{a} - {b}: not measured"
    by = f"{abs(diff):.3f}" + (f" ± {half_width:.3f}" if math.isfinite(half_width) else "")
    if decided == REPRODUCED:
        return f"{a} ahead of {b} by {by}"
    if decided == NOT_REPRODUCED:
        return f"{a} behind {b} by {by}"
    sign = "+" if diff >= 0 else "-"
    return f"no difference shown between {a} and {b} ({sign}{by})"
