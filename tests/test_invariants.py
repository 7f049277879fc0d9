"""The estimators' invariants (mean-preserving refinement, observation and value
invariances, ...): the kit's named checks (mpo_rs.testing.invariants) on mpo_rs's own
functions, bitwise where the spec says so, and the checks against the independent
reference that the kit does not make (returns, segmentation, scores, group ids)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import mpo_rs
from mpo_rs.testing import check_advantages
from mpo_rs.testing import reference as ref
from mpo_rs.testing.invariants import Tolerance, take
from mpo_rs.testing.strategies import Batch, batches, gae_params, mae_params

TOL = dict(rtol=1e-5, atol=1e-4)


def _mae(b: Batch, **kw):
    return mpo_rs.mae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, **kw)


@given(batches(), mae_params)
def test_mae_matches_reference(b, p):
    res = _mae(b, **p)
    adv, ret, turn_adv = ref.mae(b.values, b.mask.tolist(), b.offsets.tolist(), rewards=b.rewards, **p)
    np.testing.assert_allclose(res.advantages, adv, **TOL)
    np.testing.assert_allclose(res.returns, ret, **TOL)
    np.testing.assert_allclose(res.turn_advantages, turn_adv, **TOL)
    assert res.advantages.dtype == res.returns.dtype == np.float32


@given(batches(), mae_params)
def test_mae_with_scores_matches_reference(b, p):
    res = mpo_rs.mae_advantages(b.values, b.mask, b.offsets, scores=b.scores, **p)
    adv, ret, turn_adv = ref.mae(b.values, b.mask.tolist(), b.offsets.tolist(), scores=b.scores, **p)
    np.testing.assert_allclose(res.advantages, adv, **TOL)
    np.testing.assert_allclose(res.returns, ret, **TOL)
    np.testing.assert_allclose(res.turn_advantages, turn_adv, **TOL)


@given(batches())
def test_segmentation_matches_reference(b):
    t = mpo_rs.segment_turns(b.mask, b.offsets)
    r = ref.segment(b.mask.tolist(), b.offsets.tolist())
    assert t.starts.tolist() == r.starts
    assert t.ends.tolist() == r.ends
    assert t.traj_offsets.tolist() == r.traj_offsets
    assert t.token_turn.tolist() == r.token_turn
    assert (t.starts.dtype, t.traj_offsets.dtype, t.token_turn.dtype) == (np.int64, np.int64, np.int32)


@given(batches(), gae_params, st.none() | st.floats(0.001, 1.0))
def test_gae_matches_reference(b, p, alpha):
    res = mpo_rs.gae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, length_adaptive_alpha=alpha, **p)
    adv, ret = ref.gae(
        b.values, b.mask.tolist(), b.offsets.tolist(), rewards=b.rewards, length_adaptive_alpha=alpha, **p
    )
    np.testing.assert_allclose(res.advantages, adv, **TOL)
    np.testing.assert_allclose(res.returns, ret, **TOL)


@given(batches(), mae_params, st.data())
def test_turn_advantage_ignores_values_strictly_inside_a_turn(b, p, data):
    res = _mae(b, **p)
    t = res.turns
    inner = np.concatenate([np.arange(s + 1, e) for s, e in zip(t.starts, t.ends, strict=True)] + [np.array([], int)])
    assume(inner.size > 0)
    shifted = b.values.copy()
    shifted[inner] += np.float32(data.draw(st.floats(-3, 3, allow_nan=False, width=32)))
    res2 = mpo_rs.mae_advantages(shifted, b.mask, b.offsets, rewards=b.rewards, **p)
    assert np.array_equal(res.turn_advantages, res2.turn_advantages)


@given(batches(), st.floats(0.0, 1.0), st.floats(0.0, 2.0))
def test_lambda_one_gamma_one_gives_return_minus_first_value(b, lam_intra, beta):
    res = _mae(b, lam=1.0, lam_intra=lam_intra, beta=beta, gamma=1.0, lam_critic=1.0)
    t = res.turns
    expect = res.returns[t.starts].astype(np.float64) - b.values[t.starts]
    np.testing.assert_allclose(res.turn_advantages, expect, **TOL)
    g = mpo_rs.gae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, lam=1.0, lam_critic=1.0)
    np.testing.assert_allclose(g.advantages[b.mask], (g.returns - np.nan_to_num(b.values))[b.mask], **TOL)


@given(batches(), mae_params)
def test_observation_tokens_get_zero_and_minus_one(b, p):
    res = _mae(b, **p)
    g = mpo_rs.gae_advantages(b.values, b.mask, b.offsets, rewards=b.rewards)
    off = ~b.mask
    for arr in (res.advantages, res.returns, g.advantages, g.returns):
        assert np.all(arr[off] == 0)
    assert np.all(res.turns.token_turn[off] == -1)
    assert np.all(res.turns.token_turn[b.mask] >= 0)


# Exact where the spec promises bitwise equality; to the reference's tolerance elsewhere.
EXACT = Tolerance(rtol=0.0, atol=0.0)
KIT = [
    ("mae", "turn-mean", Tolerance()),
    ("mae", "beta-zero-broadcast", EXACT),
    ("mae", "observation-transparency", EXACT),
    ("gae", "observation-transparency", EXACT),
    ("mae", "masked-value-independence", EXACT),
    ("gae", "masked-value-independence", EXACT),
    ("mae", "permutation-equivariance", EXACT),
    ("gae", "permutation-equivariance", EXACT),
    ("mae", "telescoping", Tolerance()),
    ("gae", "telescoping", Tolerance()),
    ("mae", "thread-determinism", EXACT),
]
FUNCTIONS = {"mae": mpo_rs.mae_advantages, "gae": mpo_rs.gae_advantages}


@pytest.mark.parametrize("estimator, invariant, tolerance", KIT, ids=[f"{e}-{i}" for e, i, _ in KIT])
def test_the_kits_invariants_hold(estimator, invariant, tolerance):
    report = check_advantages(FUNCTIONS[estimator], estimator=estimator, invariants=[invariant], tolerance=tolerance)
    report.raise_if_failed()


def _take(b: Batch, order: list[int]) -> Batch:
    return take(b, order)[0]


def _per_traj(arr: np.ndarray, offsets: np.ndarray) -> list[list[float]]:
    return [arr[offsets[j] : offsets[j + 1]].tolist() for j in range(len(offsets) - 1)]


def assert_trajectories_are_independent(estimate: Callable[[Batch], Any], b: Batch, rnd: random.Random) -> None:
    """Shuffling the trajectories shuffles the advantages; splitting the batch in two splits
    the returns (``estimate``: an estimator's result for a batch)."""
    order = list(range(b.n))
    rnd.shuffle(order)
    whole = estimate(b)
    perm = estimate(_take(b, order))
    per = _per_traj(whole.advantages, b.offsets)
    assert _per_traj(perm.advantages, _take(b, order).offsets) == [per[j] for j in order]
    cut = rnd.randint(0, b.n)
    left, right = _take(b, list(range(cut))), _take(b, list(range(cut, b.n)))
    joined = np.concatenate([estimate(left).returns, estimate(right).returns])
    assert np.array_equal(joined, whole.returns)


@given(batches(), mae_params, st.randoms(use_true_random=False))
def test_trajectories_are_independent(b, p, rnd):
    assert_trajectories_are_independent(lambda x: _mae(x, **p), b, rnd)


@given(
    st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=0, max_size=40),
    st.data(),
    st.booleans(),
    st.booleans(),
)
def test_group_baselines_match_reference(scores, data, norm_std, loo):
    ids = data.draw(st.lists(st.integers(0, 5), min_size=len(scores), max_size=len(scores)))
    s = np.array(scores, np.float32)
    got = mpo_rs.group_advantages(s, np.array(ids, np.int64), norm_std=norm_std, leave_one_out=loo)
    want = ref.group(s.tolist(), ids, norm_std=norm_std, leave_one_out=loo)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    # same groups named by strings
    names = np.array([f"prompt-{i}" for i in ids], dtype=object)
    assert np.array_equal(got, mpo_rs.group_advantages(s, names, norm_std=norm_std, leave_one_out=loo))
