"""GiGPO (docs/estimators.md, "GiGPO"): the kernel against a slow reference written from the
formulas (mpo_rs.testing.reference), on ragged batches with both anchors, every reward
source, norm_std on and off and singleton groups; the typed errors; and parity with
verl-agent's published ``mean_norm`` / ``mean_std_norm`` where the two conventions agree."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpo_rs
from mpo_rs import Estimator, InvalidBatchError, InvalidOptionError
from mpo_rs.testing.reference import gigpo as reference
from mpo_rs.testing.reference import turns_of, verl_agent


@st.composite
def gigpo_batches(draw, max_traj: int = 8):
    """Trajectories of alternating observation and policy runs over a vocabulary of three
    token ids (so observations and prefixes repeat), in a few groups (singletons too)."""
    n = draw(st.integers(0, max_traj))
    mask: list[int] = []
    tokens: list[int] = []
    offsets = [0]
    for _ in range(n):
        runs = draw(st.integers(0, 6))
        policy = draw(st.booleans())
        for _ in range(runs):
            length = draw(st.integers(1, 3))
            mask += [int(policy)] * length
            tokens += draw(st.lists(st.integers(0, 2), min_size=length, max_size=length))
            policy = not policy
        offsets.append(len(mask))
    mask_a = np.array(mask, np.uint8)
    groups = draw(st.lists(st.sampled_from(["a", "b", "c", 7]), min_size=n, max_size=n))
    value = st.floats(-4, 4, allow_nan=False, width=32)
    rewards = np.zeros(len(mask), np.float32)
    for q in np.flatnonzero(mask_a):
        rewards[q] = draw(value)
    turns = [turns_of(mask_a, offsets[j], offsets[j + 1]) for j in range(n)]
    return {
        "mask": mask_a,
        "offsets": np.array(offsets, np.int64),
        "group_ids": groups,
        "tokens": np.array(tokens, np.int64),
        "rewards": rewards,
        "scores": np.array(draw(st.lists(value, min_size=n, max_size=n)), np.float32),
        "turn_rewards": [draw(st.lists(value, min_size=len(t), max_size=len(t))) for t in turns],
        "turn_state_ids": [draw(st.lists(st.integers(0, 3), min_size=len(t), max_size=len(t))) for t in turns],
    }


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=150, deadline=None)
@given(
    b=gigpo_batches(),
    source=st.sampled_from(["rewards", "scores", "turn_rewards"]),
    anchor=st.sampled_from(["turn_state_ids", "observation", "prefix"]),
    norm_std=st.booleans(),
    gamma=st.sampled_from([1.0, 0.95, 0.5]),
    step_weight=st.sampled_from([1.0, 0.0, 2.5]),
)
def test_matches_the_reference(b, source, anchor, norm_std, gamma, step_weight):
    options = {"gamma": gamma, "step_weight": step_weight, "norm_std": norm_std}
    if anchor == "turn_state_ids":
        anchors = {"turn_state_ids": b["turn_state_ids"]}
    else:
        anchors = {"token_ids": b["tokens"]}
        options["anchor"] = anchor
    sources = {"rewards": b["rewards"], "scores": b["scores"], "turn_rewards": b["turn_rewards"]}
    reward = {source: sources[source]}
    got = mpo_rs.gigpo_advantages(b["mask"], b["offsets"], group_ids=b["group_ids"], **reward, **anchors, **options)
    want = reference(
        b["mask"],
        b["offsets"],
        b["group_ids"],
        **{k: v for k, v in reward.items()},
        turn_state_ids=b["turn_state_ids"] if anchor == "turn_state_ids" else None,
        token_ids=b["tokens"],
        **options,
    )
    _close(got.advantages, want.advantages)
    _close(got.episode_advantages, want.episode)
    _close(got.step_advantages, want.step)
    np.testing.assert_array_equal(got.step_groups, want.step_groups)
    assert got.step_groups.dtype == np.int64 and got.turns.n_turns == want.step.shape[0]
    # The one entry computes the same bits; its per-turn advantages are the tokens' values.
    est = mpo_rs.advantages(
        b["mask"], b["offsets"], group_ids=b["group_ids"], estimator="gigpo", **reward, **anchors, **options
    )
    assert est.advantages.tobytes() == got.advantages.tobytes() and est.returns is None
    assert est.per_trajectory.tobytes() == got.episode_advantages.tobytes()
    _close(est.turn_advantages, want.turn_values)
    # Observation tokens get 0.
    assert not got.advantages[b["mask"] == 0].any()


def test_singletons_get_zero_and_one_anchor_source_is_read():
    mask = np.array([0, 1, 0, 1, 0, 1], np.uint8)
    offsets = np.array([0, 4, 6])
    # Trajectory 1 is alone in its group: its episode and step advantages are 0.
    res = mpo_rs.gigpo_advantages(mask, offsets, group_ids=["a", "b"], scores=[3.0, -1.0], turn_state_ids=[[1, 1], [1]])
    assert res.episode_advantages.tolist() == [0.0, 0.0]
    # Trajectory 0's two turns share a state: G = [0.95 * 3, 3], mean 2.925.
    np.testing.assert_allclose(res.step_advantages, [-0.075, 0.075, 0.0], atol=1e-6)
    by_ids = mpo_rs.gigpo_advantages(mask, offsets, group_ids=[0, 0], scores=[1.0, 0.0], turn_state_ids=[5, 5, 5])
    assert by_ids.step_groups.tolist() == [0, 0, 0]
    # Both sources: the token ids would be left unread (issue 42 item 9), so refused.
    with pytest.raises(InvalidOptionError, match=r"give `turn_state_ids` or `token_ids` .* not both"):
        mpo_rs.gigpo_advantages(
            mask, offsets, group_ids=[0, 0], scores=[1.0, 0.0], turn_state_ids=[5, 5, 5], token_ids=np.arange(6)
        )


def test_equal_histories_are_one_state_under_prefix_only():
    # Both trajectories see [9] then act differently, then see [8]: the second turns share
    # the observation [8] but not the history.
    mask = np.array([0, 1, 0, 1, 0, 1, 0, 1], np.uint8)
    tokens = np.array([9, 1, 8, 2, 9, 3, 8, 2])
    kw = {"group_ids": [0, 0], "scores": [1.0, 0.0], "token_ids": tokens}
    obs = mpo_rs.gigpo_advantages(mask, [0, 4, 8], **kw)
    prefix = mpo_rs.gigpo_advantages(mask, [0, 4, 8], anchor="prefix", **kw)
    assert obs.step_groups.tolist() == [0, 1, 0, 1]
    assert prefix.step_groups.tolist() == [0, 1, 0, 2]


def test_typed_errors_name_what_and_where():
    mask, offsets = np.array([0, 1, 0, 1], np.uint8), np.array([0, 2, 4])
    kw = {"group_ids": [0, 0], "scores": [1.0, 0.0]}
    with pytest.raises(InvalidBatchError, match=r"give `turn_state_ids` .* or `token_ids`"):
        mpo_rs.gigpo_advantages(mask, offsets, **kw)
    with pytest.raises(InvalidBatchError, match=r"`turn_state_ids` has 2 values for trajectory 1, which has 1 turns"):
        mpo_rs.gigpo_advantages(mask, offsets, turn_state_ids=[[1], [1, 2]], **kw)
    with pytest.raises(InvalidBatchError, match=r"`turn_state_ids` has length 3, expected 2"):
        mpo_rs.gigpo_advantages(mask, offsets, turn_state_ids=[1, 2, 3], **kw)
    with pytest.raises(InvalidBatchError, match=r"`token_ids` has length 3, expected 4"):
        mpo_rs.gigpo_advantages(mask, offsets, token_ids=[1, 2, 3], **kw)
    with pytest.raises(InvalidBatchError, match=r"`token_ids` must be an integer array"):
        mpo_rs.gigpo_advantages(mask, offsets, token_ids=[1.5, 2, 3, 4], **kw)
    with pytest.raises(InvalidBatchError, match=r"`rewards` is 1 at observation token 2 \(trajectory 1, position 0\)"):
        mpo_rs.gigpo_advantages(
            mask, offsets, group_ids=[0, 0], rewards=[0, 0, 1, 0], turn_state_ids=[1, 1], estimator="gigpo"
        )
    with pytest.raises(InvalidBatchError, match=r"`scores` is not finite \(NaN\) at trajectory 1"):
        mpo_rs.gigpo_advantages(mask, offsets, group_ids=[0, 0], scores=[0.0, np.nan], turn_state_ids=[1, 1])
    with pytest.raises(InvalidBatchError, match=r"give exactly one of"):
        mpo_rs.gigpo_advantages(mask, offsets, group_ids=[0, 0], turn_state_ids=[1, 1])
    with pytest.raises(InvalidBatchError, match=r"`group_ids` is nan at trajectory 1"):
        mpo_rs.gigpo_advantages(mask, offsets, group_ids=[0, float("nan")], scores=[1.0, 0.0], turn_state_ids=[1, 1])
    with pytest.raises(InvalidOptionError, match=r"`anchor` takes one of observation, prefix, got \"state\""):
        mpo_rs.gigpo_advantages(mask, offsets, turn_state_ids=[1, 1], anchor="state", **kw)
    with pytest.raises(InvalidOptionError, match=r"`values` does not apply to the gigpo estimator"):
        mpo_rs.advantages(mask, offsets, values=np.zeros(4), turn_state_ids=[1, 1], estimator="gigpo", **kw)
    with pytest.raises(InvalidOptionError, match=r"`turn_state_ids` do not apply to the group estimator"):
        mpo_rs.advantages(mask, offsets, turn_state_ids=[1, 1], estimator="grpo", **kw)
    with pytest.raises(InvalidOptionError, match=r"gigpo_advantages computes the gigpo estimator; got the grpo"):
        mpo_rs.gigpo_advantages(mask, offsets, turn_state_ids=[1, 1], estimator="grpo", **kw)
    with pytest.raises(InvalidBatchError, match=r"overflows float32"):
        mpo_rs.gigpo_advantages(mask, offsets, group_ids=[0, 0], scores=[3e38, -3e38], turn_state_ids=[1, 1])


def test_the_estimator_and_its_choice_option():
    est = Estimator("gigpo", gamma=0.95, step_weight=1.0, norm_std=False, anchor="observation")
    assert est == Estimator("gigpo") and est.family == "gigpo"
    assert est.options == {"gamma": 0.95, "eps": 1e-6, "norm_std": False, "step_weight": 1.0, "anchor": "observation"}
    assert est.replace(anchor="prefix").options["anchor"] == "prefix"
    row = next(r for r in Estimator.option_table() if r["name"] == "anchor")
    assert row["kind"] == "choice" and row["choices"] == ("observation", "prefix")
    with pytest.raises(InvalidOptionError, match=r"`anchor` takes a choice \(observation, prefix\), got int 1"):
        Estimator("gigpo", anchor=1)


def _steps(b_mask, offsets, group_ids, turn_rewards, states):
    """The batch as verl-agent holds it: one row per step."""
    rows = []
    for j in range(len(offsets) - 1):
        for t, r in enumerate(turn_rewards[j]):
            rows.append(
                {
                    "index": group_ids[j],
                    "traj": j,
                    "reward": r,
                    "episode_reward": sum(turn_rewards[j]),
                    "anchor_obs": states[j][t],
                }
            )
    return rows


@st.composite
def equal_turn_batches(draw):
    """Groups of 2-4 trajectories, every trajectory with the same number of turns."""
    n_turns = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(2, 4), min_size=1, max_size=4))
    mask, offsets, group_ids, turn_rewards, states = [], [0], [], [], []
    for g, size in enumerate(sizes):
        for _ in range(size):
            for _ in range(n_turns):
                mask += [0] * draw(st.integers(1, 2)) + [1] * draw(st.integers(1, 3))
            offsets.append(len(mask))
            group_ids.append(g)
            turn_rewards.append(
                draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0]), min_size=n_turns, max_size=n_turns))
            )
            states.append(draw(st.lists(st.integers(0, 2), min_size=n_turns, max_size=n_turns)))
    return np.array(mask, np.uint8), np.array(offsets), group_ids, turn_rewards, states


@settings(max_examples=100, deadline=None)
@given(b=equal_turn_batches(), gamma=st.sampled_from([0.95, 1.0, 0.5]), w=st.sampled_from([1.0, 0.5]))
def test_parity_with_verl_agent(b, gamma, w):
    mask, offsets, group_ids, turn_rewards, states = b
    rows = _steps(mask, offsets, group_ids, turn_rewards, states)
    kw = {"group_ids": group_ids, "turn_rewards": turn_rewards, "turn_state_ids": states, "gamma": gamma}
    n_turns = len(turn_rewards[0])
    # mean_norm (verl-agent's default): equal wherever every trajectory has the same turns.
    ours = mpo_rs.advantages(mask, offsets, estimator="gigpo", step_weight=w, **kw).turn_advantages
    np.testing.assert_allclose(ours, verl_agent(rows, gamma, "mean_norm", w), atol=1e-6)
    # mean_std_norm: the step part always agrees; the episode std over step rows agrees
    # with one over trajectories on single-turn batches, and with verl-agent's per-trajectory
    # statistics (compute_mean_std_cross_all_data=False) on any of these batches.
    ours = mpo_rs.advantages(mask, offsets, estimator="gigpo", step_weight=w, norm_std=True, **kw).turn_advantages
    np.testing.assert_allclose(ours, verl_agent(rows, gamma, "mean_std_norm", w, cross_all=False), atol=1e-6, rtol=1e-6)
    if n_turns == 1:
        np.testing.assert_allclose(ours, verl_agent(rows, gamma, "mean_std_norm", w), atol=1e-6, rtol=1e-6)


def test_where_verl_agent_differs():
    # Unequal turn counts: verl-agent's episode mean weighs the longer trajectory per step.
    mask = np.array([0, 1, 0, 1, 0, 1], np.uint8)
    offsets = np.array([0, 4, 6])
    kw = {"group_ids": [0, 0], "turn_rewards": [[0.0, 1.0], [0.0]], "turn_state_ids": [[0, 1], [2]]}
    ours = mpo_rs.gigpo_advantages(mask, offsets, **kw)
    assert ours.episode_advantages.tolist() == [0.5, -0.5]  # mean over trajectories: 0.5
    rows = _steps(mask, offsets, [0, 0], kw["turn_rewards"], kw["turn_state_ids"])
    theirs = verl_agent(rows, 0.95, "mean_norm")
    np.testing.assert_allclose(theirs, [1 - 2 / 3, 1 - 2 / 3, 0 - 2 / 3], atol=1e-6)  # mean over steps: 2/3
    # A singleton episode group of one step: verl-agent keeps the raw return, here it is 0
    # (as GRPO). (With more steps its rows are their own mean, 0 there too.)
    single = mpo_rs.gigpo_advantages(mask[:2], [0, 2], group_ids=[0], turn_rewards=[[1.0]], turn_state_ids=[[0]])
    assert single.episode_advantages.tolist() == [0.0]
    assert verl_agent(_steps(mask[:2], [0, 2], [0], [[1.0]], [[0]]), 0.95, "mean_norm") == [1.0]
    # With std, over step rows: unequal to the std over trajectories once a trajectory has
    # more than one turn (here 2 turns each: the rows' std is sqrt(2/3) times ours).
    kw = {"group_ids": [0, 0], "turn_rewards": [[0.0, 1.0], [0.0, 0.0]], "turn_state_ids": [[0, 1], [2, 3]]}
    ours = mpo_rs.gigpo_advantages(np.array([0, 1, 0, 1] * 2, np.uint8), [0, 4, 8], norm_std=True, **kw)
    rows = _steps(None, [0, 4, 8], [0, 0], kw["turn_rewards"], kw["turn_state_ids"])
    theirs = verl_agent(rows, 0.95, "mean_std_norm")
    np.testing.assert_allclose(ours.episode_advantages, [0.5**0.5, -(0.5**0.5)], rtol=1e-5)
    np.testing.assert_allclose(theirs[0], 0.5 / (1 / 3) ** 0.5, rtol=1e-5)


def test_padded_torch_rows_are_the_flat_batch():
    torch = pytest.importorskip("torch")
    import mpo_rs.torch as mt

    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    rewards = torch.zeros(3, 6, dtype=torch.float64)
    rewards[0, 3] = rewards[1, 4] = 1.0
    rewards[2, 2] = 0.5
    tokens = torch.tensor([[4, 5, 9, 6, 0, 0], [4, 7, 9, 6, 6, 0], [3, 9, 1, 1, 1, 1]])
    got = mt.gigpo_advantages(mask, rewards, group_ids=["a", "a", "a"], token_ids=tokens, norm_std=True)
    assert got.shape == (3, 6) and got.dtype == torch.float64
    flat = mpo_rs.gigpo_advantages(
        mask.reshape(-1).numpy(),
        np.arange(4) * 6,
        group_ids=["a", "a", "a"],
        rewards=rewards.reshape(-1).numpy(),
        token_ids=tokens.reshape(-1).numpy(),
        norm_std=True,
    )
    np.testing.assert_array_equal(got.reshape(-1).numpy(), flat.advantages.astype(np.float64))
    # The one entry, and the anchors' typed errors.
    adv, returns = mt.padded.advantages(
        mask, rewards, group_ids=["a"] * 3, token_ids=tokens, estimator="gigpo", norm_std=True
    )
    assert returns is None and torch.equal(adv, got)
    with pytest.raises(InvalidBatchError, match=r"`token_ids` has shape \(3, 5\), expected \(3, 6\)"):
        mt.gigpo_advantages(mask, rewards, group_ids=["a"] * 3, token_ids=tokens[:, :5])
    with pytest.raises(InvalidBatchError, match="`group_ids` is missing"):
        mt.padded.advantages(mask, rewards, token_ids=tokens, estimator="gigpo")


_THREADS_SCRIPT = """
import hashlib, sys, numpy as np, mpo_rs
mpo_rs.set_num_threads(int(sys.argv[1]))
assert mpo_rs.get_num_threads() == int(sys.argv[1])
rng = np.random.default_rng(3)
lengths = rng.integers(1, 40, 3000)
offsets = np.concatenate([[0], np.cumsum(lengths)])
mask = rng.random(offsets[-1]) < 0.6
rewards = np.where(mask, rng.normal(size=offsets[-1]), 0).astype(np.float32)
tokens = rng.integers(0, 3, offsets[-1])
groups = rng.integers(0, 200, lengths.shape[0])
for anchor in ("observation", "prefix"):
    r = mpo_rs.gigpo_advantages(mask, offsets, group_ids=groups, rewards=rewards, token_ids=tokens,
                                anchor=anchor, norm_std=True)
    for a in (r.advantages, r.episode_advantages, r.step_advantages, r.step_groups):
        sys.stdout.write(hashlib.sha256(a.tobytes()).hexdigest() + "\\n")
"""


def test_bitwise_identical_for_any_thread_count():
    # The extension's pool is sized once per process: one process per thread count.
    runs = [
        subprocess.run(
            [sys.executable, "-c", _THREADS_SCRIPT, str(n)], capture_output=True, text=True, check=True
        ).stdout
        for n in (1, 2, 4)
    ]
    assert runs[0] and runs[0] == runs[1] == runs[2]
