"""The verl plug-in's ``mpo_gigpo`` (mpo_rs.integrations.verl): equal to
:func:`mpo_rs.gigpo_advantages` on the flattened rows, with anchor states from verl-agent's
``anchor_obs`` or from the rows' token ids, called directly and through verl's
``compute_advantage`` (the values hook hands the batch over); verl-agent's config keys."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from omegaconf import OmegaConf  # noqa: E402
from test_integration_verl import algo_config, flat_batch, rollout_batch  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs import InvalidBatchError, InvalidOptionError  # noqa: E402
from mpo_rs.integrations import verl as plugin  # noqa: E402
from mpo_rs.integrations.verl import values_hook  # noqa: E402


def token_batch(seed: int):
    """verl's multi-turn rows with response token ids over a vocabulary of three (so
    observations repeat across the rows of a group)."""
    rewards, _, mask, uid = rollout_batch(seed)
    rng = np.random.default_rng(seed + 100)
    responses = torch.from_numpy(rng.integers(0, 3, tuple(mask.shape)))
    return rewards, mask, uid, responses


def numpy_gigpo(rewards, mask, uid, **kw):
    flat_mask, offsets = flat_batch(mask)
    codes = mpo_rs.estimators.group_codes(uid)[0]
    credited = rewards.reshape(-1).numpy()  # rewards sit on LLM tokens here: nothing to credit
    return mpo_rs.gigpo_advantages(flat_mask, offsets, group_ids=codes, rewards=credited, **kw).advantages


def test_mpo_gigpo_is_registered_and_equals_the_core_on_token_ids():
    assert core_algos.get_adv_estimator_fn("mpo_gigpo") is plugin.compute_mpo_gigpo_advantage
    rewards, mask, uid, responses = token_batch(3)
    for anchor in ("observation", "prefix"):
        config = algo_config(gamma=0.9, anchor=anchor)
        adv, ret = plugin.compute_mpo_gigpo_advantage(rewards, mask, config, uid, token_ids=responses)
        assert ret is adv
        want = numpy_gigpo(rewards, mask, uid, token_ids=responses.reshape(-1).numpy(), gamma=0.9, anchor=anchor)
        np.testing.assert_array_equal(adv.reshape(-1).numpy(), want)
        assert torch.all(adv[mask == 0] == 0)


def test_anchor_obs_one_per_one_turn_row_as_verl_agent_batches():
    """verl-agent's rows are single steps: one LLM turn each, one observation each."""
    rng = np.random.default_rng(7)
    rows, cols = 16, 10
    mask = torch.zeros(rows, cols, dtype=torch.int64)
    for b in range(rows):
        mask[b, : int(rng.integers(1, cols))] = 1
    rewards = torch.zeros(rows, cols)
    rewards[torch.arange(rows), mask.sum(1) - 1] = torch.from_numpy(rng.integers(0, 3, rows).astype(np.float32))
    uid = np.array([f"g{b // 8}" for b in range(rows)], dtype=object)
    obs = np.array([["left room", "right room", "hall"][int(rng.integers(3))] for _ in range(rows)], dtype=object)
    config = OmegaConf.create({"gamma": 0.95, "gigpo": {"mode": "mean_std_norm", "step_advantage_w": 0.5}})
    adv, _ = plugin.compute_mpo_gigpo_advantage(rewards, mask, config, uid, anchor_obs=obs)
    states = [[{"left room": 0, "right room": 1, "hall": 2}[o]] for o in obs]
    want = numpy_gigpo(rewards, mask, uid, turn_state_ids=states, gamma=0.95, norm_std=True, step_weight=0.5)
    np.testing.assert_array_equal(adv.reshape(-1).numpy(), want)


def test_anchor_obs_per_turn_and_arrays_hash_by_value():
    rewards, mask, uid, _ = token_batch(5)
    starts = mask.clone()
    starts[:, 1:] &= 1 - mask[:, :-1]
    turns = starts.sum(1).tolist()
    rng = np.random.default_rng(0)
    states = [rng.integers(0, 2, t).tolist() for t in turns]
    # Observations as small arrays: equal arrays are one state, whatever object holds them.
    obs = np.empty(len(turns), dtype=object)
    obs[:] = [
        [np.full(3, s, np.int32) for s in row] if len(row) != 1 else np.full(3, row[0], np.int32) for row in states
    ]
    adv, _ = plugin.compute_mpo_gigpo_advantage(rewards, mask, algo_config(), uid, anchor_obs=obs)
    want = numpy_gigpo(rewards, mask, uid, turn_state_ids=states, gamma=1.0)
    np.testing.assert_array_equal(adv.reshape(-1).numpy(), want)
    bad = obs.copy()
    row = next(j for j, t in enumerate(turns) if t > 1)
    bad[row] = bad[row][:-1]
    with pytest.raises(InvalidBatchError, match=rf"row {row}: `anchor_obs` gives \d+ observation\(s\) but the row has"):
        plugin.compute_mpo_gigpo_advantage(rewards, mask, algo_config(), uid, anchor_obs=bad)


def test_through_verls_compute_advantage_the_hook_hands_over_the_batch():
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    from verl import DataProto

    plugin.install_values_hook()
    rewards, mask, uid, responses = token_batch(9)
    config = algo_config(gamma=0.9)
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "responses": responses}
    out = ray_trainer.compute_advantage(
        DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid}), adv_estimator="mpo_gigpo", config=config
    )
    want, _ = plugin.compute_mpo_gigpo_advantage(rewards, mask, config, uid, token_ids=responses)
    torch.testing.assert_close(out.batch["advantages"], want, rtol=0, atol=0)
    # verl-agent's anchor_obs win over the token ids.
    obs = np.array([str(int(m.sum()) % 2) for m in mask], dtype=object)
    one_turn = torch.zeros_like(mask)
    one_turn[:, :3] = 1
    tensors = {"token_level_rewards": rewards * one_turn, "response_mask": one_turn, "responses": responses}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid, "anchor_obs": obs})
    out = ray_trainer.compute_advantage(data, adv_estimator="mpo_gigpo", config=config)
    want, _ = plugin.compute_mpo_gigpo_advantage(rewards * one_turn, one_turn, config, uid, anchor_obs=obs)
    torch.testing.assert_close(out.batch["advantages"], want, rtol=0, atol=0)
    assert values_hook.hooked_batch() is None  # only during the call


def test_missing_anchors_and_bad_config_are_refused():
    rewards, mask, uid, responses = token_batch(1)
    with pytest.raises(InvalidBatchError, match=r"needs anchor states: verl-agent's non_tensor_batch\['anchor_obs'\]"):
        plugin.compute_mpo_gigpo_advantage(rewards, mask, algo_config(), uid)
    with pytest.raises(InvalidBatchError, match="needs the group ids"):
        plugin.compute_mpo_gigpo_advantage(rewards, mask, algo_config(), None, token_ids=responses)
    bad_mode = OmegaConf.create({"gigpo": {"mode": "mean"}})
    with pytest.raises(InvalidOptionError, match=r"`algorithm.gigpo.mode` \(adv_estimator mpo_gigpo\) must be one of"):
        plugin.compute_mpo_gigpo_advantage(rewards, mask, bad_mode, uid, token_ids=responses)
    with pytest.raises(InvalidOptionError, match=r"algorithm\.mpo\.beta"):
        plugin.compute_mpo_gigpo_advantage(rewards, mask, algo_config(beta=0.5), uid, token_ids=responses)
    with pytest.raises(InvalidOptionError, match=r"algorithm\.mpo\.anchor"):
        plugin.estimator_options("mpo_grpo", algo_config(anchor="prefix"))
    options = plugin.estimator_options("mpo_gigpo", OmegaConf.create({"gigpo": {"step_advantage_w": 2.0}}))
    assert options.estimator == mpo_rs.Estimator("gigpo", gamma=1.0, step_weight=2.0)


def test_anchor_obs_ids_come_from_content():
    # Issue 42 item 4: ids were a hash of repr() (numpy abbreviates arrays over 1,000
    # elements, so observations differing in the middle merged) or of an object array's
    # bytes (pointers, so equal observations split). Ids now key the content exactly.
    mask = torch.ones(6, 2, dtype=torch.int64)  # one turn per row
    big = np.zeros(2000)
    middle = big.copy()
    middle[1000] = 1.0

    def obj(*xs):
        a = np.empty(len(xs), dtype=object)
        a[:] = xs
        return a

    obs = np.empty(6, dtype=object)
    obs[:] = [
        {"image": big, "text": "hall"},
        {"text": "hall", "image": big.copy()},  # equal: another dict order, another array object
        {"image": middle, "text": "hall"},  # differs only in the middle of a long array
        obj("go", "north"),
        obj("go", "nor" + "th"),  # equal content, other objects
        obj("go", "south"),
    ]
    ids = plugin.estimators.observation_ids(obs, mask)
    assert ids == [[0], [0], [1], [2], [2], [3]]
    # Kinds stay apart (1 and "1", a list and a tuple), -0.0 is 0.0.
    kinds = np.empty(6, dtype=object)
    kinds[:] = [1, "1", [1, 2], (1, 2), 0.0, -0.0]
    assert plugin.estimators.observation_ids(kinds, mask) == [[0], [1], [2], [3], [4], [4]]
    # An object whose content cannot be read is refused, naming where.
    odd = np.empty(6, dtype=object)
    odd[:] = ["a"] * 5 + [object()]
    with pytest.raises(InvalidBatchError, match=r"`anchor_obs` at row 5, turn 0 is a object"):
        plugin.estimators.observation_ids(odd, mask)


def test_every_config_section_refuses_unknown_keys():
    # Issue 42 item 8: algorithm.gigpo's keys were read with defaults for anything else.
    for section in ("gigpo", "mpo"):
        config = OmegaConf.create({section: {"step_advantage_weight": 2.0}})
        with pytest.raises(
            InvalidOptionError, match=rf"unknown `algorithm.{section}` option\(s\) 'step_advantage_weight'"
        ):
            plugin.estimator_options("mpo_gigpo", config)
    with pytest.raises(plugin.InvalidConfigError, match=r"`algorithm.gigpo` must be a mapping"):
        plugin.estimator_options("mpo_gigpo", OmegaConf.create({"gigpo": 3}))
    # Issue 42 item 9 through verl: eps in mean_norm (no std division) is refused, naming the key.
    with pytest.raises(InvalidOptionError, match=r"`algorithm.mpo.eps`.*does not apply to the gigpo estimator"):
        plugin.estimator_options("mpo_gigpo", algo_config(eps=1e-3))
    std = OmegaConf.create({"gigpo": {"mode": "mean_std_norm"}, "mpo": {"eps": 1e-3}})
    assert plugin.estimator_options("mpo_gigpo", std).estimator.options["eps"] == 1e-3
