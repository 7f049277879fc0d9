"""RAGEN's bi-level GAE (``bilevel``): the extension against the slow reference written from
the formulas (mpo_rs.testing.reference), its invariants, the refusal of bad options, and the
estimator through every entry point (numpy, padded torch, the learner, the CLI)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from test_invariants import assert_trajectories_are_independent

import mpo_rs
from mpo_rs import Estimator, InvalidBatchError, InvalidOptionError
from mpo_rs.testing import reference as ref
from mpo_rs.testing.invariants import insert_observations
from mpo_rs.testing.strategies import Batch, batches

TOL = dict(rtol=1e-5, atol=1e-4)

bilevel_params = st.fixed_dictionaries(
    {"lam": st.floats(0.0, 1.0), "gamma": st.floats(0.05, 1.0), "high_level_gamma": st.floats(0.05, 1.0)}
)


def _bilevel(b: Batch, **kw):
    return mpo_rs.bilevel_advantages(b.values, b.mask, b.offsets, rewards=b.rewards, **kw)


@given(batches(), bilevel_params, st.booleans())
def test_bilevel_matches_reference(b, p, by_score):
    source = {"scores": b.scores} if by_score else {"rewards": b.rewards}
    res = mpo_rs.bilevel_advantages(b.values, b.mask, b.offsets, **source, **p)
    adv, ret, turn_adv = ref.bilevel(b.values, b.mask.tolist(), b.offsets.tolist(), **source, **p)
    np.testing.assert_allclose(res.advantages, adv, **TOL)
    np.testing.assert_allclose(res.returns, ret, **TOL)
    np.testing.assert_allclose(res.turn_advantages, turn_adv, **TOL)
    assert res.advantages.dtype == res.returns.dtype == res.turn_advantages.dtype == np.float32
    t = ref.segment(b.mask.tolist(), b.offsets.tolist())
    assert res.turns.token_turn.tolist() == t.token_turn and res.turns.starts.tolist() == t.starts


@given(batches(), bilevel_params)
def test_per_turn_rewards_are_token_rewards_on_each_turns_last_policy_token(b, p):
    t = ref.segment(b.mask.tolist(), b.offsets.tolist())
    rng = np.random.default_rng(len(t.starts))
    turn_rewards = rng.normal(size=len(t.starts)).astype(np.float32)
    tokens = np.zeros(len(b.mask), np.float32)
    tokens[np.asarray(t.ends, dtype=np.int64) - 1] = turn_rewards  # a turn's end is exclusive
    per_turn = [turn_rewards[t.traj_offsets[j] : t.traj_offsets[j + 1]] for j in range(len(b.offsets) - 1)]
    res = mpo_rs.bilevel_advantages(b.values, b.mask, b.offsets, turn_rewards=per_turn, **p)
    want = mpo_rs.bilevel_advantages(b.values, b.mask, b.offsets, rewards=tokens, **p)
    for name in ("advantages", "returns", "turn_advantages"):
        np.testing.assert_array_equal(getattr(res, name), getattr(want, name))
    scores = [float(np.sum(r, dtype=np.float64)) for r in per_turn]
    mpo_rs.bilevel_advantages(b.values, b.mask, b.offsets, turn_rewards=per_turn, check_scores=scores, **p)
    if len(t.starts):
        with pytest.raises(InvalidBatchError, match="turn_rewards"):
            bad = [np.append(r, 1.0) for r in per_turn]
            mpo_rs.bilevel_advantages(b.values, b.mask, b.offsets, turn_rewards=bad, **p)


def test_defaults_are_ragens():
    assert Estimator("bilevel").options == {"lam": 1.0, "gamma": 1.0, "high_level_gamma": 0.95}
    assert Estimator("bilevel").family == "bilevel"
    assert "bilevel" in Estimator.names()
    row = next(r for r in Estimator.option_table() if r["name"] == "high_level_gamma")
    assert row["estimators"] == ("bilevel",) and row["defaults"] == {"bilevel": 0.95} and row["domain"] == "(0, 1]"


def test_hand_computed_two_turns():
    # Turn 0 = tokens 0, 1 (values 1, 2), an observation, turn 1 = tokens 3-5 (values 3-5);
    # rewards 0.5 in turn 0 and 1 at the end; γ = 0.8, γ_hi = 0.9, λ = 0.5.
    values = np.array([1, 2, np.nan, 3, 4, 5], np.float32)
    mask = np.array([1, 1, 0, 1, 1, 1], bool)
    rewards = np.array([0.5, 0, 0, 0, 0, 1], np.float32)
    res = mpo_rs.bilevel_advantages(values, mask, [0, 6], rewards=rewards, lam=0.5, gamma=0.8, high_level_gamma=0.9)
    # A^hi_1 = 1 − 5 = −4; A^hi_0 = 0.5 + 0.9·5 − 2 + 0.45·(−4) = 1.2.
    np.testing.assert_allclose(res.turn_advantages, [1.2, -4.0], atol=1e-6)
    # Inside turn 1 (γλ = 0.4): −4, 0.8·5 − 4 + 0.4·(−4) = −1.6, 0.8·4 − 3 + 0.4·(−1.6) = −0.44;
    # inside turn 0: 1.2, 0.8·2 − 1 + 0.4·1.2 = 1.08.
    np.testing.assert_allclose(res.advantages, [1.08, 1.2, 0, -0.44, -1.6, -4.0], atol=1e-6)
    np.testing.assert_allclose(res.returns, [2.08, 3.2, 0, 2.56, 2.4, 1.0], atol=1e-6)
    assert res.turns.token_turn.tolist() == [0, 0, -1, 1, 1, 1]


@given(batches(), bilevel_params)
def test_turn_advantage_is_the_last_tokens_advantage(b, p):
    res = _bilevel(b, **p)
    last = res.turns.ends - 1
    assert np.array_equal(res.advantages[last], res.turn_advantages)


@given(batches(), st.floats(0.0, 1.0), st.floats(0.05, 1.0), st.floats(0.05, 1.0))
def test_one_token_turns_are_token_gae_with_the_turn_discount(b, lam, gamma, high_level_gamma):
    """With one token per turn the low level has nothing to do: token GAE over the policy
    tokens with discount γ_hi (the token γ never applies), returns = A + V (lam_critic = λ)."""
    keep = np.ones(len(b.mask), bool)
    keep[1:] = ~(b.mask[1:] & b.mask[:-1])  # drop every policy token that follows one
    starts = set(b.offsets[:-1].tolist())
    keep |= np.isin(np.arange(len(b.mask)), list(starts))
    idx = np.flatnonzero(keep)
    offsets = np.searchsorted(idx, b.offsets).astype(np.int64)
    one = Batch(b.values[idx], b.mask[idx], offsets, b.rewards[idx], b.scores)
    turns = mpo_rs.segment_turns(one.mask, one.offsets)
    assert np.all(turns.lengths == 1)
    bi = _bilevel(one, lam=lam, gamma=gamma, high_level_gamma=high_level_gamma)
    gae = mpo_rs.gae_advantages(
        one.values, one.mask, one.offsets, rewards=one.rewards, gamma=high_level_gamma, lam=lam, lam_critic=lam
    )
    np.testing.assert_allclose(bi.advantages, gae.advantages, **TOL)
    np.testing.assert_allclose(bi.returns, gae.returns, **TOL)


@given(batches(), st.floats(0.05, 1.0))
def test_lambda_one_gamma_one_gives_turn_return_minus_value(b, high_level_gamma):
    """λ = γ = 1: A_{t,i} = G_t − V_{t,i}, G_t = Σ_k γ_hi^k R_{t+k}."""
    res = _bilevel(b, lam=1.0, gamma=1.0, high_level_gamma=high_level_gamma)
    t = res.turns
    want = np.zeros(len(b.mask))
    for j in range(b.n):
        tids = range(t.traj_offsets[j], t.traj_offsets[j + 1])
        r_turn = [float(b.rewards[t.starts[k] : t.ends[k]].astype(np.float64).sum()) for k in tids]
        for i, k in enumerate(tids):
            g = sum(high_level_gamma**m * r for m, r in enumerate(r_turn[i:]))
            want[t.starts[k] : t.ends[k]] = g - b.values[t.starts[k] : t.ends[k]].astype(np.float64)
    np.testing.assert_allclose(res.advantages, want, **TOL)


@given(batches(), bilevel_params)
def test_observation_tokens_get_zero_and_minus_one(b, p):
    res = _bilevel(b, **p)
    obs = ~b.mask
    assert np.all(res.advantages[obs] == 0) and np.all(res.returns[obs] == 0)
    assert np.all(res.turns.token_turn[obs] == -1)


@given(batches(), bilevel_params, st.data())
def test_inserting_observations_changes_no_policy_result(b, p, data):
    """An observation run may grow or appear anywhere that does not cut a turn in two."""
    assume(len(b.mask) > 0)
    starts = set(b.offsets[:-1].tolist())
    m = b.mask
    allowed = [q for q in range(len(m)) if q in starts or not m[q] or not m[q - 1]]
    where = data.draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=3, unique=True))
    lengths = data.draw(st.lists(st.integers(1, 5), min_size=len(where), max_size=len(where)))
    b2, pos = insert_observations(b, where, lengths)
    r1, r2 = _bilevel(b, **p), _bilevel(b2, **p)
    pol = b.mask
    assert np.array_equal(r1.advantages[pol], r2.advantages[pos[pol]])
    assert np.array_equal(r1.returns[pol], r2.returns[pos[pol]])
    assert np.array_equal(r1.turn_advantages, r2.turn_advantages)


@given(batches(), bilevel_params, st.randoms(use_true_random=False))
def test_trajectories_are_independent(b, p, rnd):
    assert_trajectories_are_independent(lambda x: _bilevel(x, **p), b, rnd)


def test_thread_count_does_not_change_a_bit():
    from mpo_rs import synthetic

    fb = synthetic.flat_batch(300, seed=3, values="normal", **synthetic.TINY)
    before = mpo_rs.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 3):
            mpo_rs.set_num_threads(n)
            res = mpo_rs.bilevel_advantages(fb.values, fb.mask, fb.offsets, scores=fb.scores, lam=0.9)
            runs.append((res.advantages.tobytes(), res.returns.tobytes(), res.turn_advantages.tobytes()))
    finally:
        mpo_rs.set_num_threads(before)
    assert runs[0] == runs[1] == runs[2]


def test_not_mean_preserving():
    res = mpo_rs.bilevel_advantages([0.0, 0.0, 0.0], [1, 1, 1], [0, 3], scores=[1.0], lam=0.5, gamma=0.5)
    assert not np.isclose(res.advantages.mean(), res.turn_advantages[0])


@pytest.mark.parametrize(
    "options, pattern",
    [
        ({"high_level_gamma": 0.0}, r"`high_level_gamma` = 0 is out of range: it must be in \(0, 1\]"),
        ({"high_level_gamma": 1.5}, r"`high_level_gamma` = 1.5 is out of range"),
        ({"gamma": float("nan")}, r"`gamma` = NaN is out of range"),
        ({"lam": -0.1}, r"`lam` = -0.1 is out of range"),
        (
            {"beta": 0.5},
            r"`beta` does not apply to the bilevel estimator; its options are lam, gamma, high_level_gamma",
        ),
        ({"lam_critic": 0.5}, r"`lam_critic` does not apply to the bilevel estimator"),
        ({"high_level_lam": 0.5}, r"`high_level_lam` is not an option of the bilevel estimator"),
        ({"high_level_gamma": "0.9"}, r"`high_level_gamma` takes a float .* got the string '0.9'"),
    ],
)
def test_bad_options_are_refused_by_name(options, pattern):
    with pytest.raises(InvalidOptionError, match=pattern):
        mpo_rs.bilevel_advantages([0.0], [1], [0, 1], scores=[1.0], **options)
    with pytest.raises(InvalidOptionError, match=pattern):
        Estimator("bilevel", **options)


def test_other_families_and_bad_batches_are_refused():
    with pytest.raises(InvalidOptionError, match="high_level_gamma` does not apply to the gae estimator"):
        Estimator("gae", high_level_gamma=0.9)
    with pytest.raises(InvalidOptionError, match="bilevel_advantages computes the bilevel estimator; got the mae"):
        mpo_rs.bilevel_advantages([0.0], [1], [0, 1], scores=[1.0], estimator=Estimator("mae"))
    with pytest.raises(InvalidBatchError, match="exactly one of `rewards`"):
        mpo_rs.bilevel_advantages([0.0], [1], [0, 1])
    with pytest.raises(InvalidBatchError, match="`values` is not finite"):
        mpo_rs.bilevel_advantages([np.nan], [1], [0, 1], scores=[1.0])
    with pytest.raises(InvalidBatchError, match="observation token 1"):
        mpo_rs.bilevel_advantages([0.0, 0.0], [1, 0], [0, 2], rewards=[0.0, 1.0])


def test_estimator_replace_and_pickle():
    import pickle

    e = Estimator("bilevel", high_level_gamma=0.9)
    assert e.replace(lam=0.95).options == {"lam": 0.95, "gamma": 1.0, "high_level_gamma": 0.9}
    assert pickle.loads(pickle.dumps(e)) == e
    assert repr(e) == "Estimator('bilevel', lam=1.0, gamma=1.0, high_level_gamma=0.9)"


def test_cli_on_a_small_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from mpo_rs import synthetic

    fb = synthetic.flat_batch(40, seed=5, values="normal", **synthetic.TINY)
    path, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(synthetic.to_arrow(fb), path, row_group_size=7)
    args = ["advantages", path, "-o", out, "--estimator", "bilevel", "--high-level-gamma", "0.9", "--lam", "0.95", "-q"]
    r = subprocess.run(
        [sys.executable, "-m", "mpo_rs.cli", *map(str, args)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    want = mpo_rs.bilevel_advantages(fb.values, fb.mask, fb.offsets, rewards=fb.rewards, lam=0.95, high_level_gamma=0.9)
    t = pq.read_table(out)
    for col, expect in [
        ("advantages", want.advantages),
        ("returns", want.returns),
        ("turn_advantages", want.turn_advantages),
    ]:
        got = np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in t[col].chunks])
        np.testing.assert_array_equal(got, expect)
    assert isinstance(t, pa.Table)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "mpo_rs.cli",
            "advantages",
            str(path),
            "-o",
            str(tmp_path / "o2.parquet"),
            "--estimator",
            "bilevel",
            "--high-level-gamma",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "`high_level_gamma` = 0 is out of range" in bad.stderr, bad.stderr


def test_padded_and_learner():
    torch = pytest.importorskip("torch")
    from mpo_rs.torch import bilevel_advantages as padded_bilevel

    values = torch.tensor([[1.0, 2.0, 0.0, 3.0, 4.0, 5.0], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    adv, ret = padded_bilevel(values, mask, scores=[1.0, 0.0], lam=0.5, gamma=0.8, high_level_gamma=0.9)
    flat = mpo_rs.bilevel_advantages(
        values.flatten().numpy(),
        mask.flatten().numpy(),
        [0, 6, 12],
        scores=[1.0, 0.0],
        lam=0.5,
        gamma=0.8,
        high_level_gamma=0.9,
    )
    assert np.array_equal(adv.flatten().numpy(), flat.advantages)
    assert np.array_equal(ret.flatten().numpy(), flat.returns)

    from mpo_rs.torch.estimation import natural_ratio
    from mpo_rs.torch.learner_config import LearnerConfig

    cfg = LearnerConfig(estimator="bilevel")
    assert cfg.estimator == Estimator("bilevel") and natural_ratio(cfg.estimator) == "token"
