"""Per-turn rewards and truncation (issue 20 items 4, 5): against the independent reference
(mpo_rs.testing.reference, written from the formulas), the invariants (a flag that is not set
changes nothing bitwise; per-turn rewards are token rewards on each turn's last policy
token, bitwise) and the typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpo_rs
from mpo_rs import InvalidBatchError, InvalidOptionError
from mpo_rs.testing import reference as ref
from mpo_rs.testing.strategies import Batch, batches, finite, gae_params, mae_params

TOL = dict(rtol=1e-5, atol=1e-4)
ESTIMATORS = {"mae": (mpo_rs.mae_advantages, ref.mae), "gae": (mpo_rs.gae_advantages, ref.gae)}


def _turn_counts(b: Batch) -> list[int]:
    t = mpo_rs.segment_turns(b.mask, b.offsets)
    return np.diff(t.traj_offsets).tolist()


@st.composite
def with_turn_rewards(draw, params):
    b = draw(batches())
    turn_rewards = [draw(st.lists(finite, min_size=k, max_size=k)) for k in _turn_counts(b)]
    truncated = draw(st.lists(st.booleans(), min_size=b.n, max_size=b.n))
    return b, turn_rewards, truncated, draw(params)


def _bits(x: np.ndarray) -> list[int]:
    return np.asarray(x, dtype=np.float32).view(np.uint32).tolist()


@pytest.mark.parametrize("name", ["mae", "gae"])
@given(data=st.data())
def test_truncation_and_turn_rewards_match_the_reference(name, data):
    fast, slow = ESTIMATORS[name]
    b, turn_rewards, truncated, p = data.draw(with_turn_rewards(mae_params if name == "mae" else gae_params))
    res = fast(b.values, b.mask, b.offsets, turn_rewards=turn_rewards, truncated=truncated, **p)
    want = slow(b.values, b.mask.tolist(), b.offsets.tolist(), turn_rewards=turn_rewards, truncated=truncated, **p)
    np.testing.assert_allclose(res.advantages, want[0], **TOL)
    np.testing.assert_allclose(res.returns, want[1], **TOL)
    if name == "mae":
        np.testing.assert_allclose(res.turn_advantages, want[2], **TOL)
    # Token rewards with truncation, and scores with truncation, too.
    res = fast(b.values, b.mask, b.offsets, rewards=b.rewards, truncated=truncated, **p)
    want = slow(b.values, b.mask.tolist(), b.offsets.tolist(), rewards=b.rewards, truncated=truncated, **p)
    np.testing.assert_allclose(res.advantages, want[0], **TOL)
    np.testing.assert_allclose(res.returns, want[1], **TOL)
    res = fast(b.values, b.mask, b.offsets, scores=b.scores, truncated=truncated, **p)
    want = slow(b.values, b.mask.tolist(), b.offsets.tolist(), scores=b.scores, truncated=truncated, **p)
    np.testing.assert_allclose(res.advantages, want[0], **TOL)
    np.testing.assert_allclose(res.returns, want[1], **TOL)


@pytest.mark.parametrize("name", ["mae", "gae"])
@given(data=st.data())
def test_turn_rewards_are_token_rewards_on_each_turns_last_token_bitwise(name, data):
    fast, _ = ESTIMATORS[name]
    b, turn_rewards, truncated, p = data.draw(with_turn_rewards(mae_params if name == "mae" else gae_params))
    turns = mpo_rs.segment_turns(b.mask, b.offsets)
    tokens = np.zeros(b.mask.shape[0], dtype=np.float32)
    flat = np.array([r for rs in turn_rewards for r in rs], dtype=np.float32)
    tokens[turns.ends - 1] = flat
    by_token = fast(b.values, b.mask, b.offsets, rewards=tokens, truncated=truncated, **p)
    ragged = np.empty(len(turn_rewards), dtype=object)
    ragged[:] = [np.array(r, dtype=np.float64) for r in turn_rewards]
    for given_as in (turn_rewards, flat, ragged):  # lists per trajectory, flat, a ragged object array
        by_turn = fast(b.values, b.mask, b.offsets, turn_rewards=given_as, truncated=truncated, **p)
        assert _bits(by_turn.advantages) == _bits(by_token.advantages)
        assert _bits(by_turn.returns) == _bits(by_token.returns)


@pytest.mark.parametrize("name", ["mae", "gae"])
@given(data=st.data())
def test_a_flag_not_set_changes_nothing_bitwise(name, data):
    fast, _ = ESTIMATORS[name]
    b, _, truncated, p = data.draw(with_turn_rewards(mae_params if name == "mae" else gae_params))
    plain = fast(b.values, b.mask, b.offsets, rewards=b.rewards, **p)
    unset = fast(b.values, b.mask, b.offsets, rewards=b.rewards, truncated=np.zeros(b.n, dtype=bool), **p)
    assert _bits(unset.advantages) == _bits(plain.advantages)
    assert _bits(unset.returns) == _bits(plain.returns)
    # Flags set on some trajectories leave every other trajectory's tokens bitwise alone.
    some = fast(b.values, b.mask, b.offsets, rewards=b.rewards, truncated=truncated, **p)
    for j in range(b.n):
        if not truncated[j]:
            lo, hi = b.offsets[j], b.offsets[j + 1]
            assert _bits(some.advantages[lo:hi]) == _bits(plain.advantages[lo:hi])
            assert _bits(some.returns[lo:hi]) == _bits(plain.returns[lo:hi])


@pytest.mark.parametrize("name", ["mae", "gae"])
@given(data=st.data())
def test_truncation_is_gamma_times_the_last_value_added_to_the_last_reward(name, data):
    # δ_last = r + γ·V_last − V_last: the same residuals as r' = r + γ·V_last without the flag.
    fast, _ = ESTIMATORS[name]
    b, _, _, p = data.draw(with_turn_rewards(mae_params if name == "mae" else gae_params))
    shifted = b.rewards.astype(np.float64)
    for j in range(b.n):
        pol = np.flatnonzero(b.mask[b.offsets[j] : b.offsets[j + 1]])
        if pol.size:
            q = b.offsets[j] + pol[-1]
            shifted[q] += p["gamma"] * float(b.values[q])
    cut = fast(b.values, b.mask, b.offsets, rewards=b.rewards, truncated=np.ones(b.n, dtype=bool), **p)
    same = fast(b.values, b.mask, b.offsets, rewards=shifted, **p)
    np.testing.assert_allclose(cut.advantages, same.advantages, **TOL)
    np.testing.assert_allclose(cut.returns, same.returns, **TOL)


# Two trajectories: [obs, t0 t0, obs, t1] (2 turns) and [t0, obs, obs] (1 turn).
MASK = np.array([0, 1, 1, 0, 1, 1, 0, 0], dtype=bool)
OFFSETS = np.array([0, 5, 8])
VALUES = np.linspace(0.0, 1.0, 8, dtype=np.float32)


@pytest.mark.parametrize("fn", [mpo_rs.mae_advantages, mpo_rs.gae_advantages])
def test_bad_turn_rewards_are_typed_errors_naming_the_trajectory(fn):
    with pytest.raises(InvalidBatchError, match=r"`turn_rewards` has 1 values for trajectory 0, which has 2 turns"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=[[1.0], [2.0]])
    with pytest.raises(InvalidBatchError, match=r"`turn_rewards` has 3 values for trajectory 1, which has 1 turns"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=[[1.0, 0.0], [2.0, 1.0, 1.0]])
    with pytest.raises(InvalidBatchError, match=r"`turn_rewards` has length 2, expected 3 \(one per turn"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=np.array([1.0, 2.0]))
    with pytest.raises(InvalidBatchError, match=r"`turn_rewards` has 3 lists, expected 2 \(one per trajectory\)"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=[[1.0], [2.0], [3.0]])
    for bad in (np.nan, np.inf):
        with pytest.raises(InvalidBatchError, match=r"`turn_rewards` is not finite \(.*\) at turn 1 of trajectory 0"):
            fn(VALUES, MASK, OFFSETS, turn_rewards=[[1.0, bad], [2.0]])
    with pytest.raises(InvalidBatchError, match=r"give exactly one of `rewards`.*got `scores` and `turn_rewards`"):
        fn(VALUES, MASK, OFFSETS, scores=[1.0, 2.0], turn_rewards=[[1.0, 0.0], [2.0]])
    with pytest.raises(InvalidBatchError, match="got none"):
        fn(VALUES, MASK, OFFSETS)


@pytest.mark.parametrize("fn", [mpo_rs.mae_advantages, mpo_rs.gae_advantages])
def test_the_optional_sum_check(fn):
    turn_rewards = [[0.5, 0.25], [-1.0]]
    fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75, -1.0])
    fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75 + 5e-5, -1.0])  # within 1e-4
    with pytest.raises(InvalidBatchError, match=r"`turn_rewards` of trajectory 1 sum to -1, but its score is -0.5"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75, -0.5])
    with pytest.raises(InvalidBatchError, match="trajectory 0"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75 + 5e-5, -1.0], check_tolerance=1e-6)
    with pytest.raises(InvalidBatchError, match=r"`check_scores` is not finite \(NaN\) at trajectory 0"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[np.nan, -1.0])
    with pytest.raises(InvalidBatchError, match="`check_scores` has length 1, expected 2"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75])
    with pytest.raises(InvalidBatchError, match="give `turn_rewards` too"):
        fn(VALUES, MASK, OFFSETS, scores=[0.75, -1.0], check_scores=[0.75, -1.0])
    for tol in (-1.0, float("nan")):
        with pytest.raises(InvalidOptionError, match="check_tolerance"):
            fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75, -1.0], check_tolerance=tol)
    with pytest.raises(InvalidOptionError, match="check_tolerance"):
        fn(VALUES, MASK, OFFSETS, turn_rewards=turn_rewards, check_scores=[0.75, -1.0], check_tolerance="0.1")


@pytest.mark.parametrize("fn", [mpo_rs.mae_advantages, mpo_rs.gae_advantages])
def test_bad_truncated_flags_are_typed_errors(fn):
    with pytest.raises(InvalidBatchError, match="`truncated` has length 3, expected 2"):
        fn(VALUES, MASK, OFFSETS, scores=[1.0, 0.0], truncated=[True, False, True])
    with pytest.raises(InvalidBatchError, match="`truncated` must hold 0 or 1, found 2 at trajectory 1"):
        fn(VALUES, MASK, OFFSETS, scores=[1.0, 0.0], truncated=[0, 2])
    with pytest.raises(InvalidBatchError, match="`truncated` must be a bool array"):
        fn(VALUES, MASK, OFFSETS, scores=[1.0, 0.0], truncated=["yes", "no"])
    with pytest.raises(InvalidBatchError, match="`truncated` must be 1-D"):
        fn(VALUES, MASK, OFFSETS, scores=[1.0, 0.0], truncated=[[True, False]])
    ints = fn(VALUES, MASK, OFFSETS, scores=[1.0, 0.0], truncated=[1, 0])
    bools = fn(VALUES, MASK, OFFSETS, scores=[1.0, 0.0], truncated=[True, False])
    assert _bits(ints.advantages) == _bits(bools.advantages)


def test_a_truncated_trajectory_by_hand():
    # One turn, values (1, 2), reward 1 on the last token, γ = 0.9, λ = 1 (GAE).
    values = np.array([1.0, 2.0], dtype=np.float32)
    mask = np.array([1, 1], dtype=bool)
    res = mpo_rs.gae_advantages(values, mask, [0, 2], scores=[1.0], truncated=[True], gamma=0.9, lam=1.0)
    # δ_1 = 1 + 0.9·2 − 2 = 0.8, δ_0 = 0.9·2 − 1 = 0.8; A_0 = 0.8 + 0.9·0.8 = 1.52.
    np.testing.assert_allclose(res.advantages, [1.52, 0.8], rtol=1e-6)
    np.testing.assert_allclose(res.returns, [2.52, 2.8], rtol=1e-6)
    # MAE, one turn: A^turn = R + γ·V_last − V_first = 1 + 1.8 − 1 = 1.8.
    res = mpo_rs.mae_advantages(values, mask, [0, 2], scores=[1.0], truncated=[True], gamma=0.9, beta=0.0)
    np.testing.assert_allclose(res.turn_advantages, [1.8], rtol=1e-6)


def test_a_reward_on_a_trailing_observation_token_is_refused_by_the_flat_api():
    # Where would it land? Nowhere silently: the flat API refuses it, naming the token.
    rewards = np.zeros(8, dtype=np.float32)
    rewards[7] = 1.0  # trajectory 1's trailing observation
    for fn in (mpo_rs.mae_advantages, mpo_rs.gae_advantages):
        with pytest.raises(InvalidBatchError, match=r"at observation token 7 \(trajectory 1, position 2\)"):
            fn(VALUES, MASK, OFFSETS, rewards=rewards)
