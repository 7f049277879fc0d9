"""`mpo-rs reproduce`: the quick configuration end to end (every arm runs, every file is
written, the metrics are finite where they are defined -- not the ordering), the
confidence intervals and the verdict rule on numbers worked by hand, pass@k and the
explained variance, and the equal-budget invariants of the committed configurations."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpo_rs.exceptions import InvalidOptionError
from mpo_rs.reproduce import ARMS, CONFIGS, FULL, GPU, PILOT, QUICK
from mpo_rs.reproduce.config import BETA_SWEEP, LAMBDA_GRID, MAIN_TASK, TABLE1_TASKS, TASK_PREFIX
from mpo_rs.reproduce.stats import (
    INCONCLUSIVE,
    NO_VERDICT,
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
    from mpo_rs.reproduce.analysis import CONFIRMATORY, _holm_adjusted, claims
    from mpo_rs.reproduce.plan import PLAN

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
    from mpo_rs.reproduce.stats import Paired, difference_of_group_means, t_quantile

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
    from mpo_rs.reproduce.analysis import claims

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
    from mpo_rs.reproduce.analysis import claims

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


# --------------------------------------------------------------------------- pass@k, EV

torch = pytest.importorskip("torch")


def test_pass_at_k_brute_force():
    from mpo_rs.reproduce.run import pass_at_k

    rng = np.random.default_rng(0)
    successes = rng.random((6, 4)) < 0.4
    for k in (1, 2, 3, 4):
        expected = np.mean(
            [np.mean([row[list(c)].any() for c in itertools.combinations(range(4), k)]) for row in successes]
        )
        assert pass_at_k(successes, k) == pytest.approx(expected)
    with pytest.raises(InvalidOptionError):
        pass_at_k(successes, 5)


def test_explained_variance_nan_when_returns_constant():
    from mpo_rs.reproduce.run import explained_variance

    assert math.isnan(explained_variance(np.array([0.1, 0.3]), np.array([1.0, 1.0])))
    assert math.isnan(explained_variance(np.zeros(0), np.zeros(0)))
    assert explained_variance(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == 1.0
    assert explained_variance(np.zeros(2), np.array([0.0, 1.0])) == 0.0


# --------------------------------------------------------------------------- configurations

KNOBS = {"estimator", "ratio", "advantage_scale"}  # the estimator carries its options


def _learner_fields(arm, config):
    from mpo_rs.reproduce.run import learner_config

    return dataclasses.asdict(learner_config(arm, config, seed=0))


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_arms_differ_only_in_their_knobs(config):
    by_key = {arm.key: arm for arm in config.arms}
    assert len(by_key) == len(config.arms)
    reference = _learner_fields(by_key["mpo"], config)
    for arm in config.arms:
        fields = _learner_fields(arm, config)
        differ = {k for k in fields if fields[k] != reference[k]}
        assert differ <= KNOBS, (arm.key, differ)  # same budget: epochs, minibatch, clip, ...
    if config.plan == "instrument":
        # Each task's MPO w/ token IS differs from its MPO in the ratio alone; a ladder arm from
        # the learned-critic arm of its method in the critic alone.
        for arm in config.arms:
            base_key = arm.key.split("_ref")[0]
            if arm.study == "ladder":
                own, other = by_key[base_key].identity(), arm.identity()
                changed = {k for k in other if own.get(k) != other[k]} - {"key", "label", "family"}
                assert changed == ({"critic"} if arm.critic_ev is None else {"critic", "critic_ev"}), arm.key
            elif arm.key.endswith("mpo_token_is"):
                own, other = by_key[arm.key[: -len("_token_is")]].identity(), arm.identity()
                assert {k for k in own if own[k] != other[k]} - {"key", "label", "family"} == {"ratio"}
        return
    mpo = by_key["mpo"].identity()

    # The identity's "family" key is the arm's study (Arm.study), under the name committed hashes keep.
    def ablated(key):
        other = by_key[key].identity()
        return {k for k in mpo if mpo[k] != other[k]} - {"key", "label", "family"}

    assert ablated("mpo_token_is") == {"ratio"}
    for b, key in BETA_SWEEP.items():
        assert ablated(key) == (set() if b == 1.0 else {"beta"})
        assert by_key[key].estimator.options["beta"] == b
    for (lam, intra), key in LAMBDA_GRID.items():
        assert ablated(key) <= {"lam", "lam_intra"}
        assert (by_key[key].estimator.options["lam"], by_key[key].estimator.options["lam_intra"]) == (lam, intra)
    for task in ("multi_hop", "frozen_lake", "key_door", "guess_number"):  # Table 1 on every task
        prefix = TASK_PREFIX[task]
        for key in ("grpo", "gspo", "ppo", "mpo_token_is", "mpo"):
            other = by_key[prefix + key].identity()
            main = by_key[key].identity()
            assert {k for k in main if main[k] != other[k]} - {"key", "label", "family"} == {"task"}
    # The relatives: AReaL's turn-level GAE is the beta = 0 arm under a token ratio.
    assert ablated("areal_turn_gae") == {"beta", "ratio"}
    areal, beta0 = by_key["areal_turn_gae"].identity(), by_key["mpo_beta0"].identity()
    assert {k for k in areal if areal[k] != beta0[k]} - {"key", "label", "family"} == {"ratio"}
    if "ragen_bilevel" in by_key:
        ragen = by_key["ragen_bilevel"]
        assert (ragen.estimator.name, ragen.ratio, ragen.advantage_scale) == ("bilevel", "token", "none")
    assert ablated("mpo_whiten") == {"advantage_scale"}
    ppo, ppo_whiten = by_key["ppo"].identity(), by_key["ppo_whiten"].identity()
    assert {k for k in ppo if ppo[k] != ppo_whiten[k]} - {"key", "label", "family"} == {"advantage_scale"}
    # One advantage-scale rule: no arm of the headline comparison whitens over the batch.
    assert {a.advantage_scale for a in config.arms if a.study != "scale"} <= {"group-std", "none"}
    assert {a.advantage_scale for a in config.arms if a.study == "scale"} == {"whiten"}
    for key in ("grpo", "gspo", "ppo", "mpo_token_is"):
        assert by_key[key].task == MAIN_TASK == "search" and by_key[key].identity()["lam_critic"] == 1.0
    assert (by_key["grpo"].ratio, by_key["gspo"].ratio, by_key["ppo"].ratio) == ("token", "sequence", "token")
    assert by_key["ppo"].estimator.name == "gae" and by_key["ppo"].advantage_scale == "none"
    assert by_key["grpo"].advantage_scale == by_key["gspo"].advantage_scale == "group-std"


def test_committed_configurations():
    assert FULL.seeds >= 4 and GPU.seeds >= 5 and QUICK.seeds >= 1
    assert FULL.config_hash() != QUICK.config_hash()
    assert FULL.config_hash() == dataclasses.replace(FULL, workers=7).config_hash()  # scheduling only
    # The reported task is KeyDoor with its defaults: T·K >= 100 policy tokens.
    from mpo_rs.envs import make

    door = make("key_door", **FULL.task("key_door").kwargs())
    assert door.max_turns * door.action_tokens >= 100
    gpu_door = make("key_door", **GPU.task("key_door").kwargs())
    assert gpu_door.max_turns > door.max_turns and GPU.model.width > FULL.model.width and GPU.device == "cuda"
    assert {a.study for a in ARMS} == {"table1", "relatives", "beta", "lambda", "scale"}
    assert {a.task for a in ARMS} == {spec.name for spec in FULL.tasks}
    # The pilot that fixed the advantage-scale rule ran seed 0; the sizing pilot runs seeds of its own.
    assert 0 not in FULL.seed_list and not set(FULL.seed_list) & set(PILOT.seed_list)
    assert dataclasses.replace(PILOT, name="full", seeds=FULL.seeds, first_seed=1) == FULL


# --------------------------------------------------------------------------- end to end


def test_usage_errors(capsys):
    from mpo_rs.cli import main

    assert main(["reproduce", "--quick", "--docs", "docs"]) == 2
    assert "--docs" in capsys.readouterr().err
    assert main(["reproduce", "--quick", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["reproduce", "--docs", "docs"]) == 2  # the default budget is quick, not the page's run
    assert "--config instrument" in capsys.readouterr().err
    assert main(["reproduce", "--budget", "full", "--docs", "docs"]) == 2  # the paper's run: its page is a record
    assert "--config instrument" in capsys.readouterr().err


def test_the_default_budget_finishes_in_minutes(monkeypatch, tmp_path: Path):
    """`mpo-rs reproduce` without --budget runs the quick budget (the full run is asked for)."""
    from mpo_rs.reproduce import command

    seen = {}

    def fake_build_config(env, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(command, "build_config", fake_build_config)
    with pytest.raises(SystemExit):
        command.run(
            argparse.Namespace(
                quick=False,
                budget=None,
                docs=None,
                env=None,
                env_param=[],
                arms=None,
                seeds=None,
                first_seed=None,
                device="cpu",
                workers=1,
                out=tmp_path,
                overwrite=False,
                demonstrator=None,
                base_policy=None,
            )
        )
    assert seen["budget"] == "quick"


def test_quick_end_to_end(tmp_path: Path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    from mpo_rs.cli import main

    out = tmp_path / "quick"
    assert main(["reproduce", "--quick", "--out", str(out), "--workers", "2"]) == 0
    assert str(out / "reproduction.md") in capsys.readouterr().out
    for name in (
        "results.json",
        "runs.parquet",
        "curves.parquet",
        "evals.parquet",
        "reproduction.md",
        "img/curves_search_table1.png",
        "img/curves_search_relatives.png",
        "img/curves_search_scale.png",
        "img/curves_multi_hop_table1.png",
        "img/curves_frozen_lake_table1.png",
        "img/curves_key_door_table1.png",
        "img/curves_guess_number_table1.png",
        "img/final_success.png",
        "img/confirmatory.png",
        "diagnosis/mpo/summary.json",
        "diagnosis/ppo/summary.json",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name

    runs = pq.read_table(out / "runs.parquet").to_pylist()
    assert sorted(r["arm"] for r in runs) == sorted(a.key for a in QUICK.arms)  # every arm ran
    assert {r["config_hash"] for r in runs} == {QUICK.config_hash()}
    for r in runs:
        for metric in (
            "final_success",
            "auc_success",
            "final_entropy",
            "final_turns",
            "final_response_length",
            "final_pass@1",
            "wall_s",
        ):
            assert math.isfinite(r[metric]), (r["arm"], metric)
        assert 0.0 <= r["final_success"] <= 1.0
        ev = r["final_explained_variance"]
        assert math.isnan(ev) or -10.0 < ev <= 1.0, (r["arm"], ev)  # NaN when undefined, never -1e7
        assert r["critic_trained"] or not QUICK.arm(r["arm"]).trains_critic
        assert (out / "rollouts" / f"{r['arm']}-seed0.parquet").is_file()

    curves = pq.read_table(out / "curves.parquet").to_pydict()
    per_arm = {a: curves["arm"].count(a) for a in set(curves["arm"])}
    assert per_arm == {a.key: QUICK.budget.updates for a in QUICK.arms}
    for name in ("success", "entropy", "turns", "response_length", "sample_s", "step_s"):
        assert all(math.isfinite(x) for x in curves[name]), name

    results = json.loads((out / "results.json").read_text())
    assert results["config_hash"] == QUICK.config_hash()
    assert [c["number"] for c in results["claims"]] == list(range(1, 10))
    assert {c["verdict"] for c in results["claims"]} <= {REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NO_VERDICT}
    # The run measured its own base policies' gates (one seed, a few rollouts: the smoke test's),
    # and one seed bounds no learning gate, so nothing gets a verdict.
    gates = results["gates"]
    assert gates["source"] == "run" and gates["size"]["seeds"] == [QUICK.first_seed]
    assert set(gates["tasks"]) == {spec.name for spec in QUICK.tasks}
    assert all(len(t["base"]) == 1 and not t["counts"] for t in gates["tasks"].values())
    assert {c["verdict"] for c in results["confirmatory_comparisons"]} == {NO_VERDICT}
    page = (out / "reproduction.md").read_text()
    assert "| # | the paper |" in page and "img/final_success.png" in page
    assert "## Gates" in page and "measured on this run's own seeds, not a pilot's" in page
    # The page is a function of results.json: it renders again from it alone.
    from mpo_rs.reproduce.report import page_from_results

    figures = [(f["title"], f["path"], f["caption"]) for f in results["figures"]]
    assert page_from_results(results, QUICK, figures) == page
    for arm in QUICK.arms:
        assert arm.label in page
    # The smoke test's page says what it is and repeats nothing that holds only for the full run.
    assert page.splitlines()[0] == "# Reproduction of the MPO paper's claims at toy scale (smoke test)"
    assert "**This is a smoke test**" in page and "decide nothing" in page
    for full_only in ("these are the final seeds", "(this configuration)", "`make reproduce` rewrites"):
        assert full_only not in page, full_only
    assert "Rerun: `mpo-rs reproduce --quick --out DIR`" in page
    # A summary at the top: the bottom line, the estimates per task, the confirmatory comparisons' verdicts, caveats.
    summary = page.split("## Summary\n\n", 1)[1].split("\nConfiguration **quick**", 1)[0]
    assert page.index("## Summary") < page.index("## Claims")
    assert summary.startswith("**Bottom line.** ")
    assert [r[0] for r in _table(summary, "| task | chance | seeds |")] == [
        "Search", "MultiHop", "FrozenLake", "KeyDoor", "GuessNumber"
    ]  # fmt: skip
    verdicts = _table(summary, "| task | comparison |")
    for what in ("MPO - GRPO", "MPO - GSPO", "MPO - PPO", "MPO - MPO w/ token IS"):
        assert ["Search", what] in [r[:2] for r in verdicts]  # Table 1's comparisons: on every task
        assert ["GuessNumber", what] in [r[:2] for r in verdicts]
    caveats = [line for line in summary.splitlines() if line.startswith("- **")]
    assert len(caveats) == len(QUICK.tasks) and all("one seed per arm" in c for c in caveats)
    assert results["summary"] == summary.strip()

    # With a docs directory (the committed page's place; the command allows it for the instrument
    # only), resuming the finished run writes the page, its figures and its tables there, and the
    # page renders again from the tables it wrote.
    from mpo_rs.reproduce.api import run_config
    from mpo_rs.reproduce.report import DOCS_TABLES, docs_figure

    docs = tmp_path / "docs"
    run_config(QUICK, out, docs=docs)
    for name in DOCS_TABLES:
        assert (docs / "full" / name).read_bytes() == (out / name).read_bytes(), name
    for f in results["figures"]:
        assert (docs / docs_figure(f["path"])).is_file(), f["path"]
    written = json.loads((docs / "full" / "results.json").read_text())
    figures = [(f["title"], docs_figure(f["path"]), f["caption"]) for f in written["figures"]]
    assert page_from_results(written, QUICK, figures, docs_dir=docs) == (docs / "reproduction.md").read_text()


# --------------------------------------------------------------------------- output and stops


def test_out_that_is_not_an_earlier_output_is_refused(tmp_path: Path, capsys):
    """`reproduce --quick --out docs` replaced the committed page: a non-empty --out that
    `reproduce` did not write is refused, and nothing in it changes."""
    from mpo_rs.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reproduction.md").write_text("the committed page")
    assert main(["reproduce", "--quick", "--out", str(docs)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--overwrite" in err, err
    assert [p.name for p in docs.iterdir()] == ["reproduction.md"]
    assert (docs / "reproduction.md").read_text() == "the committed page"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["reproduce", "--quick", "--out", str(a_file)]) == 2
    assert a_file.read_text() == "x"


def test_out_of_another_configuration_is_refused(tmp_path: Path, capsys):
    from mpo_rs.cli import main
    from mpo_rs.reproduce.output import claim_output_dir

    out = tmp_path / "out"
    claim_output_dir(out, "0123456789ab", overwrite=False)
    (out / "results.json").write_text("{}")
    assert main(["reproduce", "--quick", "--out", str(out)]) == 2
    assert "configuration" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "{}"


def _console_reproduce(out: Path, *extra: str) -> subprocess.Popen[str]:
    def default_signals() -> None:  # a background job's parent ignores SIGINT; undo it
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

    script = "import sys\nfrom _mpo_rs_cli import main\nsys.exit(main())"
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            script,
            "reproduce",
            "--quick",
            "--arms",
            STOP_ARMS,
            "--seeds",
            "4",
            "--workers",
            "2",
            "--out",
            str(out),
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=default_signals,
        start_new_session=True,
    )


# Three of the main task's arms on four seeds: twelve runs, so a stop after the third lands
# with runs still queued, and the resume that finishes them takes seconds, not minutes.
STOP_ARMS = "grpo,ppo,mpo"


@pytest.mark.parametrize("how", ["ctrl-c to the process group", "SIGTERM to the process"])
def test_a_stop_is_prompt_keeps_finished_runs_and_resumes(tmp_path: Path, how: str):
    """`reproduce --workers 2` ignored SIGTERM/SIGINT and ran every queued run to the end,
    then wrote nothing. A stop ends it within seconds with one line (no worker
    traceback), keeps the finished runs, and the same command resumes from them."""
    pytest.importorskip("matplotlib")
    from stops import Lines, wait

    out = tmp_path / "out"
    proc = _console_reproduce(out)
    assert proc.stderr is not None
    lines = Lines(proc.stderr)  # every read and wait below has a deadline: a hang fails the test
    try:
        lines.until(lambda line: line.startswith("mpo-rs: run 3/"), timeout=300)
    except AssertionError:
        proc.kill()
        raise
    assert proc.poll() is None, "".join(lines.seen)
    started = time.monotonic()
    if how.startswith("ctrl-c"):
        os.killpg(proc.pid, signal.SIGINT)
        code = 128 + signal.SIGINT
    else:
        proc.send_signal(signal.SIGTERM)
        code = 128 + signal.SIGTERM
    wait(proc, timeout=30)
    rest = lines.rest(timeout=30)
    proc.stderr.close()
    assert time.monotonic() - started < 5.0
    assert proc.returncode == code, rest
    assert "Traceback" not in rest
    last = [line for line in rest.splitlines() if not line.startswith("mpo-rs: run ")]
    assert len(last) == 1 and last[0].startswith("mpo-rs: error: stopped: "), rest
    kept = int(re.search(r"stopped: (\d+) of (\d+) runs", last[0]).group(1))  # type: ignore[union-attr]
    saved = sorted((out / "runs").glob("*.json"))
    assert len(saved) == kept >= 3
    assert not (out / "reproduction.md").exists()

    proc = _console_reproduce(out)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    runs = 4 * len(STOP_ARMS.split(","))
    assert f"resuming: {kept} of {runs} runs already finished" in err
    assert len(list((out / "runs").glob("*.json"))) == runs
    assert (out / "reproduction.md").is_file()


# --------------------------------------------------------------------------- the page


def _synthetic_rows(level: dict[str, float], ev: float = 0.5) -> list[dict]:
    rows = []
    for seed in range(1, 6):
        for arm in ARMS:
            value = level.get(arm.key, 0.3) + 0.02 * seed * (1 if arm.key == "mpo" else 0.5)
            rows.append(
                {
                    "arm": arm.key,
                    "seed": seed,
                    "final_success": value,
                    "auc_success": value / 2,
                    "final_explained_variance": ev if arm.trains_critic else math.nan,
                    "entropy_drop": 0.1,
                    "final_turns": 3.0,
                    "between_share": 0.2,
                    "final_pass@1": value,
                    "final_entropy": 1.0,
                    "wall_s": 1.0,
                }
            )
    return rows


def _page(rows: list[dict], config=FULL):
    from mpo_rs.reproduce.analysis import claims, confirmatory_comparisons
    from mpo_rs.reproduce.page import Page

    found = claims(rows, config)
    chance = {"key_door": (0.004, "exact"), "guess_number": (0.265, "exact")}
    return Page(config, rows, found, confirmatory_comparisons(rows, found, config), chance, {}, {})


def _table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table in ``text`` whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_summary_gives_the_bottom_line_estimates_verdicts_power_and_caveats():
    from mpo_rs.reproduce.analysis import CONFIRMATORY

    page = _page(_synthetic_rows({"mpo": 0.6, "grpo": 0.3, "gspo": 0.62, "ppo": 0.1}, ev=0.05))
    summary = page.summary()
    bottom = summary.split("\n\n")[0]
    # The bottom line: the plan's confirmatory comparisons, their tally, the power, what it decided (with its task).
    assert bottom.startswith(
        f"**Bottom line.** {len(CONFIRMATORY)} comparisons were fixed in advance by the analysis plan"
    )
    assert "paired by seed over 5 seed(s) and Holm-corrected at alpha = 0.05" in bottom
    assert re.search(r"Power achieved: 95% half-widths [0-9.-]+ on 5 paired seed\(s\)", bottom)
    # Many decided: a count per task (the table has them in bold); few: each one named.
    assert "Decided (in bold in the confirmatory comparisons' table below): Search 28 reproduced." in bottom
    assert "The other comparisons of the claims (uncorrected, exploratory; see Claims):" in bottom
    # Point estimates: tasks x Table 1's arms, the plan's order (main task first, controls last).
    estimates = _table(summary, "| task | chance | seeds |")
    assert [r[0] for r in estimates] == ["Search", "MultiHop", "FrozenLake", "KeyDoor", "GuessNumber"]
    header = summary.splitlines()[
        summary.splitlines().index(
            "| task | chance | seeds | base policy | PPO critic's between-turn share | GRPO | GSPO | PPO "
            "| MPO w/ token IS | MPO |"
        )
    ]
    assert header  # the columns are Table 1's arms, which every task runs
    search = estimates[0]
    # chance not given for search here; no base policy in these rows; the PPO critic's share
    assert search[1:5] == ["—", "5", "scratch", "0.20"]
    finals = [0.3 + 0.03, 0.62 + 0.03, 0.1 + 0.03, 0.3 + 0.03, 0.6 + 0.06]  # level + mean of the seed drift
    assert search[5:] == [f"{x / 2:.2f} / {x:.2f}" for x in finals]  # auc is half the final in these rows
    assert estimates[3][1] == "0.004" and estimates[4][1] == "0.265"
    # The confirmatory comparisons' verdicts: one row per task and pair, one column per metric; decided ones in bold.
    verdicts = _table(summary, "| task | comparison |")
    assert len(verdicts) == len({(a, b) for _, a, b in CONFIRMATORY})
    first = verdicts[0]
    assert first[:2] == ["Search", "MPO - GRPO"]
    assert re.fullmatch(r"\+0\.165 ± 0\.\d{3}, p=0\.\d{3}, \*\*reproduced\*\*", first[2])
    assert re.fullmatch(r"\+0\.330 ± 0\.\d{3}, p=0\.\d{3}, \*\*reproduced\*\*", first[3])
    gspo = next(r for r in verdicts if r[:2] == ["Search", "MPO - GSPO"])
    assert gspo[3].endswith(", inconclusive")  # [-0.01, +0.03]: no difference shown, and no equivalence reading
    assert re.search(r"The \d+ undecided show no difference; none is read as equivalence", bottom)
    assert "within ±" not in summary
    # EV 0.05 < CRITIC_EV_FLOOR on every critic arm: the caveat, per task.
    caveats = [line for line in summary.splitlines() if line.startswith("- **")]
    assert [c.split("**")[1] for c in caveats] == ["Search", "MultiHop", "FrozenLake", "KeyDoor", "GuessNumber"]
    assert all("the critics never learned" in c for c in caveats)
    # An arm subset: only its tasks, its confirmatory comparisons.
    sub = _page(_synthetic_rows({"mpo": 0.6}), FULL.with_arms(["mpo", "ppo"]))
    summary = sub.summary()
    assert summary.startswith("**Bottom line.** 2 comparisons were fixed in advance")
    assert [r[:2] for r in _table(summary, "| task | comparison |")] == [["Search", "MPO - PPO"]]
    assert [r[0] for r in _table(summary, "| task | chance | seeds |")] == ["Search"]
    assert (
        "Decided: Search, MPO - PPO (mean held-out success over training) +0.165 ± 0.010 → **reproduced**;" in summary
    )
    assert "critics never learned" not in summary
    assert "**Not the committed configuration**: this page is `mpo-rs reproduce --arms ppo,mpo`'s" in sub.kind()[0]
    assert _page(_synthetic_rows({})).kind() == []  # the committed run says nothing about itself


def test_the_committed_page_points_to_the_runs_it_replaced():
    meta = {"workers": 2, "wall_s": 60.0, "started": "now"}
    page = _page(_synthetic_rows({}))
    page.meta = meta
    text = page.markdown({})
    assert "## Earlier runs" in text
    links = re.findall(r"\]\(((?:paper|control)/reproduction\.md)\)", text)
    assert links == ["paper/reproduction.md", "control/reproduction.md"]
    for link in links:
        assert (Path(__file__).resolve().parents[1] / "docs" / link).is_file()
    sub = _page(_synthetic_rows({}), FULL.with_arms(["mpo", "ppo"]))
    sub.meta = meta
    assert "## Earlier runs" not in sub.markdown({})  # only the committed run replaced them


def test_the_page_states_where_the_arms_started():
    rows = _synthetic_rows({})
    for r in rows:  # one base policy per (task, seed); a critic warm-up where the arm trains a critic
        r["base_success"] = 0.05 * r["seed"]
        r["warmup_explained_variance"] = 0.1 if not r["arm"].endswith(("grpo", "gspo")) else math.nan
    page = _page(rows)
    page.meta = {"workers": 2, "wall_s": 60.0, "started": "now"}
    text = page.markdown({})
    assert "## Starting point: base policies and critic warm-up" in text
    table = {r[0]: r for r in _table(text, "| task | eps | base held-out success")}
    # Seeds 1-5: base success 0.05 ... 0.25, of which 0.10, 0.15, 0.20, 0.25 lie in the band.
    assert table["Search"][1:] == ["0.00", "0.150 [0.050, 0.250]", "4 of 5", "0.10 [0.10, 0.10]"]
    assert table["GuessNumber"][1] == "1.00"
    assert "no base policy" not in text.split("## Starting point", 1)[1].split("##", 1)[0]


def test_the_committed_page_states_its_design_from_the_committed_records():
    from mpo_rs.reproduce.report import _design_inputs

    docs = Path(__file__).resolve().parents[1] / "docs"
    design = _design_inputs(FULL, docs)
    # The committed pilot record sizes the committed seeds (the plan's rule, capped).
    assert design["sizing"].seeds == FULL.seeds and design["sizing"].capped
    page = _page(_synthetic_rows({}))
    page.meta, page.design = {"workers": 2, "wall_s": 60.0, "started": "now"}, design
    text = page.markdown({})
    section = text.split("## Design: tasks, pilot and seeds", 1)[1].split("\n## ", 1)[0]
    roles = {r[0]: (r[1], r[3]) for r in _table(section, "| task | role |")}
    assert roles["Search"] == ("main", "holds") and roles["KeyDoor"] == ("control", "fails")
    assert roles["MultiHop"] == ("premise", "holds") and roles["GuessNumber"][0] == "control"
    assert f"asks for {design['sizing'].needed} seeds" in section and f"this run has {FULL.seeds}" in section
    assert re.search(r"the target 0\.05 is met on \d of 5 tasks", section)
    assert _design_inputs(QUICK, docs) == {}  # only the committed page reads the committed records


def test_a_confirmatory_comparison_no_claim_makes_is_measured_and_corrected(monkeypatch):
    from mpo_rs.reproduce import analysis as report  # where CONFIRMATORY is read

    extra = ("auc_success", "guess_mpo_token_is", "guess_ppo")
    assert extra not in report.CONFIRMATORY
    monkeypatch.setattr(report, "CONFIRMATORY", (*report.CONFIRMATORY, extra))
    monkeypatch.setitem(report.REGISTERED, "paper", report.CONFIRMATORY)
    rows = _synthetic_rows({"guess_mpo_token_is": 0.9, "guess_ppo": 0.1})
    comps = {(c.metric, c.a, c.b): c for c in _page(rows).confirmatory_comps}
    assert list(comps) == list(report.CONFIRMATORY)
    mine = comps[extra]
    assert mine.what == "MPO w/ token IS - PPO" and mine.verdict == REPRODUCED
    ps = [c.p for c in comps.values()]
    assert mine.p_holm == pytest.approx(holm(ps)[-1])
    summary = _page(rows).summary()
    assert f"**Bottom line.** {len(report.CONFIRMATORY)} comparisons" in summary
    row = next(r for r in _table(summary, "| task | comparison |") if r[:2] == ["GuessNumber", "MPO w/ token IS - PPO"])
    assert re.fullmatch(r"\+0\.400 ± 0\.000, p=0\.\d{3}, \*\*reproduced\*\*", row[2])
    assert row[3] == "—"  # the extra comparison is on one metric only


def test_at_chance_caveat():
    rows = [r | {"final_success": 0.0} for r in _synthetic_rows({})]
    caveats = [line for line in _page(rows).summary().splitlines() if line.startswith("- **KeyDoor**")]
    assert len(caveats) == 1 and "distinguishable from chance (0.004)" in caveats[0]


def test_curve_panels_leave_out_what_is_constant_by_construction():
    from mpo_rs.reproduce.figures import curve_panels

    def run(arm, seed):
        curve = [
            {"update": u, "entropy": 2.0 - 0.1 * u - 0.01 * seed, "explained_variance": math.nan, "turns": 8.0,
             "response_length": 128.0 + u}
            for u in range(4)
        ]  # fmt: skip
        return {"arm": arm, "seed": seed, "curve": curve, "evals": [{"update": 0, "success": 0.0}]}

    runs = [run(arm, seed) for arm in ("grpo", "gspo") for seed in (1, 2)]
    panels, dropped = curve_panels(runs, [("grpo", "GRPO"), ("gspo", "GSPO")])
    assert [m for m, _ in panels] == ["success", "entropy", "response_length"]
    assert dropped == [
        "critic explained variance (not defined for these arms)",
        "turns per episode (8.00 on every run)",
    ]


def test_figure_groups_follow_the_configuration():
    from mpo_rs.reproduce.figures import figure_groups

    present = {a.key for a in FULL.arms}
    groups = {(g.task, g.study): g for g in figure_groups(FULL, present)}
    assert list(groups) == [
        ("key_door", "table1"),
        ("search", "table1"),
        ("search", "relatives"),
        ("search", "beta"),
        ("search", "lambda"),
        ("search", "scale"),
        ("frozen_lake", "table1"),
        ("multi_hop", "table1"),
        ("guess_number", "table1"),
    ]
    assert [k for k, _ in groups["search", "beta"].arms] == [BETA_SWEEP[b] for b in sorted(BETA_SWEEP)]
    assert [k for k, _ in groups["search", "scale"].arms] == ["ppo", "mpo", "ppo_whiten", "mpo_whiten"]
    sub = figure_groups(FULL, {"mpo", "ppo"})
    assert [(g.task, g.study, [k for k, _ in g.arms]) for g in sub] == [("search", "table1", ["ppo", "mpo"])]


def test_curve_figure_axes_chance_and_clipping():
    pytest.importorskip("matplotlib")
    from mpo_rs.reproduce.figures import curves_figure

    def run(arm, seed):
        # Success near 1 and 0 with a spread that would take a 95% interval past [0, 1];
        # explained variance from -5 (a critic's first updates) up to 0.9.
        curve = [
            {"update": u, "entropy": 2.0 - 0.1 * u, "explained_variance": -5.0 + 1.5 * u + 0.1 * seed,
             "turns": 2.0 + seed, "response_length": 4.0 + seed}
            for u in range(5)
        ]  # fmt: skip
        evals = [{"update": u, "success": [0.0, 1.0][seed % 2] if u else 0.5} for u in (0, 4)]
        return {"arm": arm, "seed": seed, "curve": curve, "evals": evals}

    runs = [run(arm, seed) for arm in ("ppo", "mpo") for seed in range(3)]
    fig, caption = curves_figure(runs, [("ppo", "PPO"), ("mpo", "MPO")], "t", chance=0.25)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    by_title = {ax.get_title(): ax for ax in axes}
    assert len(axes) == 5 and caption == ""
    assert len(fig.axes) == 6  # a 2 x 3 grid, not one row; the sixth cell hidden
    success = by_title["validation success (held-out, T=1)"]
    assert success.get_ylim() == pytest.approx((-0.02, 1.02))
    assert any(line.get_label() == "chance" and line.get_ydata()[0] == 0.25 for line in success.get_lines())
    for band in success.collections:
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        assert ys.min() >= 0.0 and ys.max() <= 1.0  # the interval is clipped to [0, 1]
    ev = by_title["critic explained variance (axis cut at -1)"]
    assert ev.get_ylim() == pytest.approx((-1.0, 1.0))
    import matplotlib.pyplot as plt

    plt.close(fig)
