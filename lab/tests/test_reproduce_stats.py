"""The statistics of `mpo-rs reproduce` (mpo_lab.reproduce.stats) on numbers worked by hand:
confidence intervals (Welch, paired), Student's t against scipy, Holm's correction and the
verdict rules, and the claims that apply them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpo_lab.reproduce import ARMS, FULL
from mpo_lab.reproduce.config import TABLE1_TASKS, TASK_PREFIX
from mpo_lab.reproduce.stats import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    combine,
    diff_ci,
    holm,
    holm_verdict,
    mean_ci,
    paired_diff_ci,
    t_cdf,
    t_quantile,
    t_two_sided_p,
    verdict,
)

# --------------------------------------------------------------------------- statistics


def test_mean_ci_by_hand():
    mean, low, high, n = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)  # t_{0.975,4} * sd / sqrt(n)
    assert (mean, n) == (3.0, 5)
    assert low == pytest.approx(3.0 - half) and high == pytest.approx(3.0 + half)
    assert mean_ci([0.5, float("nan")])[1:] == pytest.approx([math.nan, math.nan, 1], nan_ok=True)
    assert math.isnan(mean_ci([])[0])


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30):
        assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
    assert t_quantile(4.9) == t_quantile(4)  # rounded down: a wider interval
    assert math.isnan(t_quantile(0.5))


def test_diff_ci_is_welch():
    a, b = [0.9, 0.8, 0.85, 0.95, 0.7], [0.2, 0.5, 0.1, 0.3]
    diff, low, high = diff_ci(a, b)
    va, vb = np.var(a, ddof=1) / 5, np.var(b, ddof=1) / 4
    df = (va + vb) ** 2 / (va**2 / 4 + vb**2 / 3)
    half = t_quantile(df) * math.sqrt(va + vb)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((diff - half, diff + half))
    stats = pytest.importorskip("scipy.stats")
    res = stats.ttest_ind(a, b, equal_var=False)
    assert res.df == pytest.approx(df)


def test_verdict_rule_on_synthetic_numbers():
    better, worse = [0.8, 0.82, 0.79, 0.81, 0.8], [0.2, 0.22, 0.19, 0.21, 0.2]
    assert verdict(*diff_ci(better, worse)[1:]) == REPRODUCED
    assert verdict(*diff_ci(worse, better)[1:]) == NOT_REPRODUCED
    noisy = [0.1, 0.9, 0.5, 0.3, 0.7]
    assert verdict(*diff_ci(noisy, [0.5, 0.4, 0.6, 0.5, 0.45])[1:]) == INCONCLUSIVE
    assert verdict(*diff_ci([0.9], worse)[1:]) == INCONCLUSIVE  # one seed: no interval
    assert verdict(*diff_ci([], worse)[1:]) == INCONCLUSIVE
    assert verdict(0.0, 0.1) == INCONCLUSIVE  # touching 0 is not excluding it
    assert combine([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert combine([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert combine([REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE]) == NOT_REPRODUCED
    assert combine([]) == INCONCLUSIVE


def test_paired_diff_ci_by_hand_matches_seeds():
    # Seed 9 is on one side only and seed 3's B is NaN: both are left out, 4 pairs remain.
    a = {0: 0.9, 1: 0.6, 2: 0.8, 3: 0.7, 4: 0.5, 9: 0.1}
    b = {4: 0.3, 2: 0.5, 0: 0.6, 1: 0.5, 3: math.nan}
    res = paired_diff_ci(a, b)
    d = [0.3, 0.1, 0.3, 0.2]  # seeds 0, 1, 2, 4
    sd = math.sqrt(sum((x - 0.225) ** 2 for x in d) / 3)  # = 0.0957
    half = 3.182 * sd / 2  # t_{0.975,3} * sd / sqrt(4)
    assert res.n == 4 and res.diff == pytest.approx(0.225)
    assert (res.low, res.high) == pytest.approx((0.225 - half, 0.225 + half))
    stats = pytest.importorskip("scipy.stats")
    ref = stats.ttest_rel([0.9, 0.6, 0.8, 0.5], [0.6, 0.5, 0.5, 0.3])
    assert res.p == pytest.approx(ref.pvalue, rel=1e-9)
    # The design matters: seed effects shared by both arms cancel in the paired interval.
    shared = [0.1, 0.9, 0.4, 0.7, 0.2]
    a2 = {s: x + 0.05 + 0.01 * (s % 2) for s, x in enumerate(shared)}
    b2 = dict(enumerate(shared))
    assert verdict(*paired_diff_ci(a2, b2)[1:3]) == REPRODUCED
    assert verdict(*diff_ci(a2.values(), b2.values())[1:]) == INCONCLUSIVE
    # Degenerate cases: one pair, none, equal differences.
    assert paired_diff_ci({0: 1.0}, {0: 0.5})[:4] == pytest.approx([0.5, math.nan, math.nan, 1], nan_ok=True)
    assert paired_diff_ci({0: 1.0}, {1: 0.5}).n == 0
    same = paired_diff_ci({0: 0.6, 1: 0.7}, {0: 0.5, 1: 0.6})
    assert (same.low, same.high, same.p) == pytest.approx((0.1, 0.1, 0.0))
    assert paired_diff_ci({0: 0.5, 1: 0.7}, {0: 0.5, 1: 0.7}).p == 1.0


def test_t_cdf_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 7.5, 29, 100, 1000):
        for t in (-40.0, -3.0, -1.0, -0.01, 0.0, 0.5, 1.96, 2.776, 12.7):
            assert t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12, rel=1e-9)
            assert t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(abs(t), df), abs=1e-12, rel=1e-9)
    assert t_two_sided_p(2.776, 4) == pytest.approx(0.05, abs=1e-4)  # the table's quantile
    assert t_two_sided_p(math.inf, 3) == 0.0
    assert math.isnan(t_cdf(1.0, 0)) and math.isnan(t_two_sided_p(math.nan, 4))


def test_holm_by_hand():
    # Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone).
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    # A comparison that could not be made keeps its place among those corrected (m = 3, not 2).
    assert holm([0.01, math.nan, 0.02]) == pytest.approx([0.03, math.nan, 0.04], nan_ok=True)
    assert holm([]) == []
    # The equivalent step-down decision: reject in ascending order while p_(i) < alpha / (m - i + 1).
    ps = [0.001, 0.2, 0.012, 0.04, 0.013]
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    rejected = set()
    for rank, i in enumerate(order):
        if ps[i] >= 0.05 / (len(ps) - rank):
            break
        rejected.add(i)
    assert {i for i, q in enumerate(holm(ps)) if q < 0.05} == rejected == {0, 2, 4}


def test_holm_verdict_rule_on_synthetic_numbers():
    assert holm_verdict(0.2, 0.01) == REPRODUCED
    assert holm_verdict(-0.2, 0.01) == NOT_REPRODUCED
    assert holm_verdict(0.2, 0.05) == INCONCLUSIVE  # not below alpha
    assert holm_verdict(0.2, 0.03, alpha=0.01) == INCONCLUSIVE
    assert holm_verdict(math.nan, 0.01) == INCONCLUSIVE and holm_verdict(0.2, math.nan) == INCONCLUSIVE


def test_table1_confirmatory_comparisons_are_holm_corrected():
    from mpo_lab.reproduce.analysis import CONFIRMATORY, _holm_adjusted, claims
    from mpo_lab.reproduce.plan import PLAN

    assert CONFIRMATORY == tuple(PLAN.confirmatory())  # the committed plan's, both metrics
    # MPO beats GRPO by 0.1 +- noise on 5 shared seeds: the paired interval alone excludes 0
    # (p ~ 0.04), but Holm over the plan's confirmatory comparisons does not reject, so inconclusive; MPO - PPO
    # (p ~ 2e-4) survives the correction.
    shared = [0.1, 0.5, 0.3, 0.2, 0.4]
    noise = [0.04, -0.06, 0.08, -0.10, 0.04]
    rows = []
    for seed in range(5):
        for arm in ARMS:
            value = shared[seed]
            if arm.key == "mpo":
                value += 0.1 + noise[seed]
            elif arm.key in ("ppo", "mpo_token_is"):
                value -= 0.3 + 0.01 * seed
            rows.append({"arm": arm.key, "seed": seed, "final_success": value})
    found = {c.number: c for c in claims(rows, FULL)}
    comps = {x.what: x for c in found.values() for x in c.comparisons}
    grpo = comps["MPO - GRPO (final held-out success)"]
    assert grpo.low > 0 and grpo.p < 0.05  # uncorrected, paired: it would be reproduced
    assert grpo.p_holm > 0.05 and grpo.verdict == INCONCLUSIVE
    assert grpo.welch_low < 0 < grpo.welch_high and grpo.n == 5
    assert grpo.half_width == pytest.approx((grpo.high - grpo.low) / 2)
    ppo = comps["MPO - PPO (final held-out success)"]
    assert ppo.verdict == REPRODUCED and ppo.p_holm < 0.05
    assert comps["MPO - MPO w/ token IS (final held-out success)"].verdict == REPRODUCED
    # Not measured (no auc_success in these rows): p = 1 in the correction, never a verdict.
    assert comps["MPO - GRPO (mean held-out success over training)"].verdict == INCONCLUSIVE
    # Not confirmatory: decided by the paired interval, no Holm p-value.
    assert math.isnan(comps["MPO w/ token IS - PPO (final held-out success)"].p_holm)
    corrected = {(x.metric, x.a, x.b): x.p_holm for x in comps.values() if math.isfinite(x.p_holm)}
    assert corrected and set(corrected) <= set(CONFIRMATORY)
    adjusted = _holm_adjusted(rows, CONFIRMATORY)
    assert all(corrected[k] == adjusted[k] for k in corrected)


def test_difference_of_group_means_by_hand():
    from mpo_lab.reproduce.stats import Paired, difference_of_group_means, t_quantile

    hi = [Paired(0.3, 0.1, 0.5, 5, 0.01), Paired(0.2, 0.0, 0.4, 5, 0.05)]
    lo = [Paired(-0.1, -0.4, 0.2, 9, 0.5)]
    se2 = lambda g: ((g.high - g.low) / 2 / t_quantile(g.n - 1)) ** 2  # noqa: E731
    var = (se2(hi[0]) + se2(hi[1])) / 4 + se2(lo[0])
    diff, low, high = difference_of_group_means(hi, lo)
    assert diff == pytest.approx(0.25 + 0.1)
    assert high - diff == pytest.approx(t_quantile(4) * math.sqrt(var))
    assert diff - low == pytest.approx(high - diff)
    assert all(math.isnan(x) for x in difference_of_group_means(hi, []))
    assert all(math.isnan(x) for x in difference_of_group_means(hi, [Paired(0.1, math.nan, math.nan, 1, math.nan)]))


def test_diagnose_predicts_benefit_claim():
    from mpo_lab.reproduce.analysis import claims

    # MPO gains 0.2 over PPO and GRPO where the PPO critic's share reads "on turns" and
    # nothing on KeyDoor, whose critic's value moves within turns: the contrast is positive.
    rows = []
    for seed in range(6):
        for arm in ARMS:
            prefix = next(p for t, p in TASK_PREFIX.items() if t == arm.task)
            level = 0.3 + 0.02 * seed + 0.01 * (seed % 2) * (arm.key == f"{prefix}mpo")
            if arm.key == f"{prefix}mpo" and arm.task != "key_door":
                level += 0.2
            share = 0.06 if arm.task == "key_door" else 0.9
            rows.append({"arm": arm.key, "seed": seed, "auc_success": level, "between_share": share})
    claim = {c.number: c for c in claims(rows, FULL)}[9]
    contrasts = [c for c in claim.comparisons if "gain where" in c.what]
    assert len(contrasts) == 2 and all(c.verdict == REPRODUCED for c in contrasts)
    assert all(c.diff == pytest.approx(0.2, abs=0.01) for c in contrasts)
    assert "(4 task(s))" in contrasts[0].what and "(1 task(s))" in contrasts[0].what
    assert claim.verdict == REPRODUCED
    per_task = [c for c in claim.comparisons if "gain where" not in c.what]
    assert len(per_task) == 2 * len(TABLE1_TASKS) and any("share 0.06" in c.what for c in per_task)


def test_claims_use_the_rule():
    from mpo_lab.reproduce.analysis import claims

    level = {"mpo": 0.9, "guess_mpo": 0.9, "mpo_token_is": 0.5, "mpo_beta0": 0.05, "ppo_whiten": 0.3}
    rows = []
    for seed in range(5):
        for arm in ARMS:
            rows.append(
                {
                    "arm": arm.key,
                    "seed": seed,
                    "final_success": level.get(arm.key, 0.1) + 0.01 * seed,
                    "auc_success": level.get(arm.key, 0.1) + 0.01 * seed,
                    "final_explained_variance": math.nan,
                    "entropy_drop": 0.1 * seed,
                    "final_turns": 3.0 + seed,
                    "between_share": 0.9 + 0.01 * seed,
                    "final_pass@1": 0.5,
                }
            )
    by_number = {c.number: c for c in claims(rows, FULL)}
    assert set(by_number) == set(range(1, 10))
    assert by_number[1].verdict == REPRODUCED  # shares 0.90..0.94 > 0.5
    assert by_number[2].verdict == REPRODUCED
    assert by_number[3].verdict == REPRODUCED  # 0.9 > 0.5 > 0.1
    parts = {c.what: c.verdict for c in by_number[4].comparisons}
    for metric in ("final held-out success", "mean held-out success over training"):
        assert parts[f"β=1 - β=0 ({metric})"] == REPRODUCED and parts[f"β=0 - PPO ({metric})"] == NOT_REPRODUCED
    assert by_number[4].verdict == NOT_REPRODUCED
    parts = {c.what: c.verdict for c in by_number[8].comparisons}  # not a paper claim: the advantage scale
    assert parts == {"PPO - PPO, whitened": NOT_REPRODUCED, "MPO - MPO, whitened": REPRODUCED}
    assert by_number[8].verdict == NOT_REPRODUCED
    assert by_number[7].verdict == INCONCLUSIVE  # equal pass@1 everywhere: a zero-width interval at 0
    assert all(c.verdict == INCONCLUSIVE for c in by_number[7].comparisons)
    # EV is NaN for every run: not measured, so inconclusive, never a verdict on NaN.
    ev = [c for c in by_number[6].comparisons if c.metric == "final_explained_variance"]
    assert ev and ev[0].verdict == INCONCLUSIVE
    # Every task's critic reads "on turns": no task to contrast with, so no verdict.
    assert by_number[9].verdict == INCONCLUSIVE and "(0 task(s))" in by_number[9].comparisons[-1].what


def test_a_comparison_says_which_way_it_goes() -> None:
    from mpo_lab.reproduce.stats import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, direction_words

    assert direction_words("MPO", "PPO", 0.04, 0.02, REPRODUCED) == "MPO ahead of PPO by 0.040 ± 0.020"
    assert direction_words("MPO", "GRPO", -0.03, 0.01, NOT_REPRODUCED) == "MPO behind GRPO by 0.030 ± 0.010"
    assert direction_words("MPO", "PPO", -0.01, 0.03, INCONCLUSIVE) == (
        "no difference shown between MPO and PPO (-0.010 ± 0.030)"
    )
    assert direction_words("MPO", "PPO", float("nan"), 0.1, INCONCLUSIVE) == "MPO - PPO: not measured"
