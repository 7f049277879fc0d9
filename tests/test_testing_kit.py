"""mpo_rs.testing on mpo_rs itself (every invariant holds) and on deliberately broken
functions (each caught, with a counterexample of a few turns), `mpo-rs check`, and the
strategies' batches (consistent, padded both ways, the edge layouts drawn)."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpo_rs
from mpo_rs.cli import main
from mpo_rs.testing import check_advantages
from mpo_rs.testing.invariants import ESTIMATORS, INVARIANTS
from mpo_rs.testing.strategies import (
    EDGE_LAYOUTS,
    MASK_NAMES,
    batches,
    edge_trajectory,
    from_padded,
    group_batches,
    to_padded,
)

# --- functions of the flat convention: a correct token GAE and its broken variants -------


def gae_loop(values, mask, offsets, *, rewards, gamma, lam, bug: str | None = None) -> np.ndarray:
    """Token GAE over policy tokens, one token at a time (verl's multi-turn convention);
    ``bug`` plants one of the defects the kit is meant to catch."""
    adv = np.zeros(len(mask), np.float64)
    for j in range(len(offsets) - 1):
        last, next_v = 0.0, 0.0
        for q in reversed(range(offsets[j], offsets[j + 1])):
            if not mask[q]:
                if bug == "reset-at-observations":
                    last = 0.0
                if bug == "bootstrap-masked-value":
                    next_v = float(values[q])  # the observation's value, which is never to be read
                continue
            g = 1.0 if bug == "ignore-gamma" else gamma
            delta = float(rewards[q]) + g * next_v - float(values[q])
            last = delta + g * lam * last
            next_v = float(values[q])
            adv[q] = last
    return adv


def _turn_slices(mask, offsets) -> list[list[tuple[int, int]]]:
    t = mpo_rs.segment_turns(mask, offsets)
    return [
        [(int(t.starts[k]), int(t.ends[k])) for k in range(t.traj_offsets[j], t.traj_offsets[j + 1])]
        for j in range(len(offsets) - 1)
    ]


def mae_off_by_one(values, mask, offsets, *, rewards, **options: Any) -> np.ndarray:
    """MAE whose turn boundary is one token late: a turn's first token is credited with
    the previous turn's advantage."""
    res = mpo_rs.mae_advantages(values, mask, offsets, rewards=rewards, **options)
    adv = res.advantages.astype(np.float64)
    k = 0
    for turns in _turn_slices(mask, offsets):
        for i, (s, _) in enumerate(turns):
            if i > 0:
                adv[s] = res.turn_advantages[k + i - 1]
        k += len(turns)
    return adv


def mae_skips_a_turn(values, mask, offsets, *, rewards, **options: Any) -> np.ndarray:
    """MAE whose broadcast loop stops one turn short: the last turn of each trajectory
    keeps 0 (a step-wise broadcast over range(n_turns - 1))."""
    adv = mpo_rs.mae_advantages(values, mask, offsets, rewards=rewards, **options).advantages.astype(np.float64)
    for turns in _turn_slices(mask, offsets):
        if turns:
            s, e = turns[-1]
            adv[s:e] = 0.0
    return adv


def _turns_in(counterexample: str) -> int:
    return len(re.findall(r"^    turn \d+ ", counterexample, flags=re.M))


# --- mpo_rs itself -----------------------------------------------------------------------


@pytest.mark.parametrize("estimator, fn", [("gae", mpo_rs.gae_advantages), ("mae", mpo_rs.mae_advantages)])
def test_every_invariant_holds_for_mpo_rs_critic_estimators(estimator, fn):
    report = check_advantages(fn, convention="flat", estimator=estimator)
    report.raise_if_failed()
    assert [r.name for r in report.results] == list(ESTIMATORS[estimator].invariants)
    assert all(r.status == "held" and r.examples >= 20 for r in report.results), str(report)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_every_invariant_holds_for_mpo_rs_group_estimators(estimator):
    report = check_advantages(
        mpo_rs.group_advantages, convention="flat-group", estimator=estimator, call_options={"estimator": estimator}
    )
    report.raise_if_failed()
    assert all(r.status == "held" for r in report.results), str(report)


def test_the_padded_torch_functions_hold_too():
    pytest.importorskip("torch")
    import torch

    import mpo_rs.torch as mt

    def padded_gae(rewards, values, mask, **options):
        t = torch.from_numpy
        return mt.gae_advantages(t(values), t(mask), token_level_rewards=t(rewards), **options)

    check_advantages(padded_gae, convention="padded", estimator="gae").raise_if_failed()


def test_a_correct_loop_holds_and_the_options_vary():
    report = check_advantages(gae_loop, estimator="gae")
    report.raise_if_failed()
    # A function that ignores γ is caught: the kit draws γ below 1.
    ignored = check_advantages(
        gae_loop, estimator="gae", invariants=["reference"], call_options={"bug": "ignore-gamma"}
    )
    assert ignored["reference"].status == "failed"
    assert re.search(r"gamma=0\.\d", ignored["reference"].counterexample or "")


# --- broken functions are caught and shrunk ----------------------------------------------


@pytest.mark.parametrize(
    "fn, estimator, bug, caught_by",
    [
        (gae_loop, "gae", "reset-at-observations", ["terminal-reward", "observation-transparency"]),
        (gae_loop, "gae", "bootstrap-masked-value", ["masked-value-independence"]),
        (mae_off_by_one, "mae", None, ["reference", "turn-mean"]),
        (mae_skips_a_turn, "mae", None, ["beta-zero-broadcast", "turn-mean"]),
    ],
)
def test_a_broken_function_is_caught_with_a_small_counterexample(fn, estimator, bug, caught_by):
    options = {"bug": bug} if bug else None
    report = check_advantages(fn, estimator=estimator, invariants=caught_by, call_options=options)
    for name in caught_by:
        r = report[name]
        assert r.status == "failed", f"{name} did not catch {bug or fn.__name__}:\n{report}"
        text = r.counterexample or ""
        assert text.startswith(f"{name} (docs/spec.md, {INVARIANTS[name].section}) failed")
        assert "<-- differs" in text and "expected" in text
        assert 1 <= _turns_in(text) <= 4, text


def test_a_failure_reads_as_turns_with_expected_and_actual_values():
    report = check_advantages(gae_loop, invariants=["reference"], call_options={"bug": "reset-at-observations"})
    text = report["reference"].counterexample or ""
    assert re.search(r"^  trajectory 0 \[0:\d+\]", text, flags=re.M)
    assert re.search(r"^    observation \[\d+:\d+\]", text, flags=re.M)
    assert re.search(r"^    turn 0 \[\d+:\d+\]  V = .*  r = ", text, flags=re.M)
    assert "FAILED" in str(report) and "counterexample for reference" in str(report)
    with pytest.raises(AssertionError, match="counterexample for reference"):
        report.raise_if_failed()


def test_a_function_that_raises_is_a_failure_naming_the_error():
    def boom(values, mask, offsets, *, rewards, **options):
        raise RuntimeError("no batches today")

    r = check_advantages(boom, invariants=["reference"])["reference"]
    assert r.status == "failed" and "the function raised RuntimeError: no batches today" in (r.counterexample or "")


def test_bad_arguments_are_typed_errors():
    with pytest.raises(mpo_rs.InvalidOptionError, match="unknown convention 'verl'"):
        check_advantages(gae_loop, convention="verl")
    with pytest.raises(mpo_rs.InvalidOptionError, match="unknown estimator 'ppo'"):
        check_advantages(gae_loop, estimator="ppo")
    with pytest.raises(mpo_rs.InvalidOptionError, match="'turn-mean' does not apply to the gae estimator"):
        check_advantages(gae_loop, invariants=["turn-mean"])


# --- the command line --------------------------------------------------------------------


def test_check_command_exit_codes_and_counterexample(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_trainer.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def reset_gae(values, mask, offsets, *, rewards, gamma, lam):
                adv = np.zeros(len(mask))
                for j in range(len(offsets) - 1):
                    last = nv = 0.0
                    for q in reversed(range(offsets[j], offsets[j + 1])):
                        if not mask[q]:
                            last = 0.0
                            continue
                        last = rewards[q] + gamma * nv - values[q] + gamma * lam * last
                        nv = values[q]
                        adv[q] = last
                return adv
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", "my_trainer:reset_gae", "--invariant", "terminal-reward"]) == 1
    out, err = capsys.readouterr()
    assert "terminal-reward: FAILED" in out and "<-- differs" in out
    assert "checking terminal-reward (1/1)" in err
    assert main(["check", "mpo_rs:gae_advantages", "--invariant", "reference", "--max-examples", "10"]) == 0
    assert "reference: held over 10 examples" in capsys.readouterr().out
    assert main(["check", "my_trainer:nothing"]) == 1
    assert "cannot load my_trainer:nothing: AttributeError" in capsys.readouterr().err
    assert main(["check", "mpo_rs:gae_advantages", "--invariant", "turn-mean"]) == 2


# --- the strategies ----------------------------------------------------------------------


@given(batches(6, edges=True, turn_rewards=True, truncation=True, groups=3, anchors=4, min_policy=3), st.data())
@settings(max_examples=60)
def test_drawn_batches_are_consistent_and_pad_both_ways(b, data):
    n, counts = b.n, b.turn_counts()
    assert b.offsets[0] == 0 and np.all(np.diff(b.offsets) >= 0) and b.offsets[-1] == len(b.mask)
    assert int(b.mask.sum()) >= 3
    assert np.isnan(b.values[~b.mask]).all() and np.isfinite(b.values[b.mask]).all()
    assert not b.rewards[~b.mask].any()
    assert [len(r) for r in b.turn_rewards] == counts == [len(s) for s in b.turn_state_ids]
    assert b.truncated.shape == b.group_ids.shape == (n,) and b.group_ids.max(initial=0) < 6
    assert counts == [len(ends) for ends in b.turn_ends()]
    side = data.draw(st.sampled_from(["left", "right"]))
    p = to_padded(b, padding_side=side, extra=data.draw(st.integers(0, 3)), fill=7.0)
    assert p.mask.sum() == b.mask.sum() and p.attention_mask.sum() == len(b.mask)
    assert np.array_equal(from_padded(p.mask, p), b.mask) and np.array_equal(
        from_padded(p.token_level_rewards, p), b.rewards
    )
    assert np.all(from_padded(p.values, p)[~b.mask] == 7.0)
    if side == "left" and n:
        assert p.attention_mask[:, -1][np.diff(b.offsets) > 0].all()  # rows end at the last column
    assert set(p.named("trl")) >= {"completion_mask", "token_level_rewards", "values"}
    assert MASK_NAMES == {"verl": "response_mask", "trl": "completion_mask", "openrlhf": "action_mask"}
    placed = b.with_turn_rewards_as_tokens()
    assert np.isclose(placed.rewards.sum(), sum(map(sum, b.turn_rewards)), atol=1e-3)


@given(group_batches(min_group=2))
@settings(max_examples=60)
def test_group_batches_can_exclude_groups_of_one(b):
    sizes = np.unique(b.group_ids, return_counts=True)[1]
    assert (sizes >= 2).all()
    has_policy = [b.mask[b.offsets[j] : b.offsets[j + 1]].any() for j in range(b.n)]
    assert all(h or s == 0 for h, s in zip(has_policy, b.scores, strict=True))


def test_every_edge_layout_is_drawn():
    seen: set[str] = set()
    names = {tuple(m): name for name, m in EDGE_LAYOUTS.items()}

    @given(edge_trajectory())
    @settings(max_examples=100, derandomize=True)
    def collect(mask):
        seen.add(names[tuple(mask)])

    collect()
    assert seen == set(EDGE_LAYOUTS)


def test_the_ci_profile_is_deterministic(monkeypatch):
    def run() -> str:
        report = check_advantages(gae_loop, invariants=["reference"], call_options={"bug": "reset-at-observations"})
        return report["reference"].counterexample or ""

    first = run()
    assert first and run() == first
    monkeypatch.setenv("MPO_RS_TESTING_PROFILE", "nightly")
    with pytest.raises(mpo_rs.InvalidOptionError, match="unknown profile 'nightly'; the profiles are: ci, fuzz"):
        run()
