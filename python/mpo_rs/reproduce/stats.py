"""Confidence intervals over seeds and the verdict rule (numpy only).

- :func:`mean_ci`: the mean over seeds with a Student-t 95% interval.
- :func:`diff_ci`: the difference of two arms' means with a Welch 95% interval (unequal
  variances; degrees of freedom rounded down, which widens the interval).
- :func:`verdict`: a claim "A > B" is *reproduced* when the interval of A - B lies above
  0, *not reproduced* when it lies below 0, and *inconclusive* otherwise (or when it is
  undefined: fewer than 2 seeds, a missing arm).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["INCONCLUSIVE", "NOT_REPRODUCED", "REPRODUCED", "combine", "diff_ci", "mean_ci", "t_quantile", "verdict"]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"

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


def verdict(low: float, high: float) -> str:
    """The rule for a claim "A > B" given the 95% interval of A - B."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if low > 0:
        return REPRODUCED
    if high < 0:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def combine(verdicts: Sequence[str]) -> str:
    """A claim made of several comparisons: reproduced when every one is, not reproduced
    when any is reversed, inconclusive otherwise."""
    if verdicts and all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if any(v == NOT_REPRODUCED for v in verdicts):
        return NOT_REPRODUCED
    return INCONCLUSIVE
