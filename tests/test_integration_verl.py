"""The verl plug-in (mpo_rs.integrations.verl) against verl's own functions.

Runs verl 0.9.1's code (installed with --no-deps plus the few modules core_algos imports);
skipped when verl is absent. Equality is shown where the semantics match (GAE, GRPO, RLOO,
PPO with one-token turns); elsewhere the plug-in must equal mpo_rs itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

from omegaconf import OmegaConf  # noqa: E402

import mpo_rs  # noqa: E402
from mpo_rs.integrations import verl as plugin  # noqa: E402
from mpo_rs.integrations.verl import values_hook  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
F32, F64 = torch.float32, torch.float64


# --------------------------------------------------------------------------- data


def agent_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """verl-style response masks: LLM turns (1) alternating with tool outputs (0), ending
    in an LLM turn, then right padding (0)."""
    mask = np.zeros((rows, cols), dtype=np.int64)
    for b in range(rows):
        pos, end = 0, int(rng.integers(cols // 2, cols + 1))
        while pos < end:
            turn = int(rng.integers(1, 8))
            mask[b, pos : min(pos + turn, end)] = 1
            pos += turn + int(rng.integers(1, 6))
    return mask


def last_llm_token(mask: np.ndarray) -> np.ndarray:
    cols = mask.shape[1]
    return cols - 1 - np.argmax(mask[:, ::-1], axis=1)


def rollout_batch(seed: int, rows: int = 12, cols: int = 48, token_rewards: bool = True):
    """(rewards, values, mask, uid): an outcome reward on each row's last LLM token plus,
    optionally, small per-token rewards on LLM tokens (as verl's in-reward KL penalty)."""
    rng = np.random.default_rng(seed)
    mask = agent_rows(rng, rows, cols)
    rewards = np.zeros((rows, cols), dtype=np.float32)
    if token_rewards:
        rewards += (0.01 * rng.standard_normal((rows, cols)) * mask).astype(np.float32)
    rewards[np.arange(rows), last_llm_token(mask)] += rng.integers(0, 2, rows).astype(np.float32)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    uid = np.array([f"prompt-{b // 4}" for b in range(rows)], dtype=object)  # groups of 4
    return torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(mask), uid


def algo_config(**mpo_options) -> OmegaConf:
    base = {"gamma": 1.0, "lam": 0.95, "norm_adv_by_std_in_grpo": True}
    gamma = mpo_options.pop("gamma", None)
    if gamma is not None:
        base["gamma"] = gamma
    if "norm_adv_by_std_in_grpo" in mpo_options:
        base["norm_adv_by_std_in_grpo"] = mpo_options.pop("norm_adv_by_std_in_grpo")
    if mpo_options:
        base["mpo"] = mpo_options
    return OmegaConf.create(base)


def on_llm_tokens(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()]


def flat_batch(mask: torch.Tensor):
    rows, cols = mask.shape
    return mask.reshape(-1).numpy().astype(np.uint8), np.arange(rows + 1, dtype=np.int64) * cols


# --------------------------------------------------------------------------- registry


def test_every_name_resolves_through_verls_registries():
    for name, fn in plugin._ESTIMATOR_FUNCTIONS.items():
        assert core_algos.get_adv_estimator_fn(name) is fn
    for name, fn in plugin._LOSS_FUNCTIONS.items():
        assert core_algos.get_policy_loss_fn(name) is fn
    assert set(plugin.ESTIMATORS) == set(plugin._ESTIMATOR_FUNCTIONS)
    assert set(plugin.LOSS_MODES) == set(plugin._LOSS_FUNCTIONS)
    # verl's own entries are untouched.
    assert core_algos.get_adv_estimator_fn("gae") is core_algos.compute_gae_advantage_return
    assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla


def test_registering_again_is_harmless_but_a_foreign_name_clash_is_refused():
    plugin.register()
    assert core_algos.get_adv_estimator_fn("mpo_mae") is plugin.compute_mpo_mae_advantage

    def foreign(**kwargs):
        raise AssertionError("never called")

    core_algos.ADV_ESTIMATOR_REGISTRY["mpo_mae"] = foreign
    try:
        with pytest.raises(RuntimeError, match="already has a advantage estimator named 'mpo_mae'"):
            plugin.register()
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY["mpo_mae"] = plugin.compute_mpo_mae_advantage
        plugin.register()


# --------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.99, 0.9), (1.0, 1.0)])
def test_mpo_gae_equals_verls_gae_with_its_whitening(seed, gamma, lam):
    rewards, values, mask, uid = rollout_batch(seed)
    want_adv, want_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    fn = core_algos.get_adv_estimator_fn("mpo_gae")
    config = OmegaConf.create({"gamma": gamma, "lam": lam})
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, config=config, index=uid, values=values)
    assert adv.shape == rewards.shape and adv.dtype == F32
    torch.testing.assert_close(on_llm_tokens(adv, mask), on_llm_tokens(want_adv, mask), rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(on_llm_tokens(ret, mask), on_llm_tokens(want_ret, mask), rtol=1e-5, atol=2e-5)
    # Off the LLM tokens verl leaves carried-over numbers; mpo_gae leaves zeros.
    assert not adv[mask == 0].any() and not ret[mask == 0].any()


def test_mpo_gae_whitening_is_selectable():
    rewards, values, mask, uid = rollout_batch(2)
    _, verl_returns = core_algos.compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)
    config = OmegaConf.create({"gamma": 1.0, "lam": 0.95, "mpo": {"whiten": False}})
    adv, _ = plugin.compute_mpo_gae_advantage(rewards, mask, config, uid, values=values)
    # verl's returns are its unwhitened advantages plus the values.
    torch.testing.assert_close(
        on_llm_tokens(adv, mask), on_llm_tokens(verl_returns - values, mask), rtol=1e-5, atol=2e-5
    )
    whitened, _ = plugin.compute_mpo_gae_advantage(rewards, mask, config={"gamma": 1.0, "lam": 0.95}, values=values)
    assert abs(float(on_llm_tokens(whitened, mask).mean())) < 1e-5
    assert not torch.allclose(on_llm_tokens(adv, mask), on_llm_tokens(whitened, mask))


def test_drop_in_gae_function_has_verls_signature_and_results():
    rewards, values, mask, _ = rollout_batch(3)
    want_adv, want_ret = core_algos.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.99, lam=0.95
    )
    adv, ret = plugin.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=0.99, lam=0.95
    )
    torch.testing.assert_close(on_llm_tokens(adv, mask), on_llm_tokens(want_adv, mask), rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(on_llm_tokens(ret, mask), on_llm_tokens(want_ret, mask), rtol=1e-5, atol=2e-5)


def test_whitening_needs_two_llm_tokens_as_in_verl():
    rewards, values, _, _ = rollout_batch(16, rows=2, cols=6)
    mask = torch.zeros_like(rewards, dtype=torch.int64)
    mask[1, 2] = 1
    with pytest.raises(ValueError, match="sum of the mask is one"):
        core_algos.compute_gae_advantage_return(rewards * mask, values, mask, 1.0, 0.95)
    with pytest.raises(mpo_rs.InvalidBatchError, match="at least 2 LLM tokens"):
        plugin.compute_gae_advantage_return(rewards * mask, values, mask, 1.0, 0.95)


def test_mpo_gae_ignores_rewards_on_observation_tokens_like_verl():
    rewards, values, mask, _ = rollout_batch(4)
    observation = (mask == 0).nonzero()[0]
    rewards[observation[0], observation[1]] = 5.0  # verl's loop never reads it
    want_adv, want_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)
    adv, ret = plugin.compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(on_llm_tokens(adv, mask), on_llm_tokens(want_adv, mask), rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(on_llm_tokens(ret, mask), on_llm_tokens(want_ret, mask), rtol=1e-5, atol=2e-5)


# --------------------------------------------------------------------------- group baselines


@pytest.mark.parametrize("norm_std", [True, False])
def test_mpo_grpo_equals_verls_grpo(norm_std):
    rewards, _, mask, uid = rollout_batch(5, rows=16)
    want, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm_std)
    fn = core_algos.get_adv_estimator_fn("mpo_grpo")
    adv, ret = fn(
        token_level_rewards=rewards,
        response_mask=mask,
        config=algo_config(norm_adv_by_std_in_grpo=norm_std),
        index=uid,
    )
    torch.testing.assert_close(adv, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv)


def test_mpo_rloo_equals_verls_rloo():
    rewards, _, mask, uid = rollout_batch(6, rows=16)
    want, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uid, config=algo_config())
    fn = core_algos.get_adv_estimator_fn("mpo_rloo")
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, config=algo_config(), index=uid)
    torch.testing.assert_close(adv, want.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_std", [True, False])
def test_critic_free_mae_at_lam_1_beta_0_is_grpo(norm_std):
    rewards, _, mask, uid = rollout_batch(7, rows=16, token_rewards=False)
    want, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm_std)
    config = algo_config(lam=1.0, beta=0.0, norm_adv_by_std_in_grpo=norm_std)
    adv, ret = core_algos.get_adv_estimator_fn("mpo_mae_grpo")(
        token_level_rewards=rewards, response_mask=mask, config=config, index=uid
    )
    torch.testing.assert_close(adv, want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv)


def test_critic_free_mae_at_lam_1_beta_0_is_rloo():
    rewards, _, mask, uid = rollout_batch(8, rows=16, token_rewards=False)
    want, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uid, config=algo_config())
    adv, _ = core_algos.get_adv_estimator_fn("mpo_mae_rloo")(
        token_level_rewards=rewards, response_mask=mask, config=algo_config(lam=1.0, beta=0.0), index=uid
    )
    torch.testing.assert_close(adv, want.float(), rtol=1e-5, atol=1e-5)


def test_critic_free_mae_decays_credit_once_per_interaction():
    rewards, _, mask, uid = rollout_batch(9, rows=16, token_rewards=False)
    lam = 0.5
    grpo, _ = plugin.compute_mpo_grpo_advantage(rewards, mask, algo_config(), uid)
    adv, _ = plugin.compute_mpo_mae_grpo_advantage(rewards, mask, algo_config(lam=lam, beta=0.0), uid)
    flat_mask, offsets = flat_batch(mask)
    turns = mpo_rs.segment_turns(flat_mask, offsets)
    flat_adv, flat_grpo = adv.reshape(-1).numpy(), grpo.reshape(-1).numpy()
    for row in range(mask.shape[0]):
        first, last = turns.traj_offsets[row], turns.traj_offsets[row + 1]
        for t in range(first, last):
            tokens = slice(turns.starts[t], turns.ends[t])
            # beta=0: one advantage per turn, lam^(turns after it) times the GRPO advantage.
            np.testing.assert_allclose(
                flat_adv[tokens], lam ** (last - 1 - t) * flat_grpo[tokens], rtol=1e-5, atol=1e-6
            )


def test_a_group_of_one_gets_zero_advantage():
    rewards, _, mask, uid = rollout_batch(10, rows=8)
    uid = uid.copy()
    uid[3] = "alone"
    for fn in (
        plugin.compute_mpo_grpo_advantage,
        plugin.compute_mpo_rloo_advantage,
        plugin.compute_mpo_mae_grpo_advantage,
        plugin.compute_mpo_mae_rloo_advantage,
    ):
        adv, _ = fn(rewards, mask, algo_config(), uid)
        assert not adv[3].any(), fn.__name__
        assert adv[0].any(), fn.__name__


def test_group_estimators_need_the_uid_index():
    rewards, _, mask, _ = rollout_batch(11)
    with pytest.raises(mpo_rs.InvalidBatchError, match="needs the group ids"):
        core_algos.get_adv_estimator_fn("mpo_grpo")(token_level_rewards=rewards, response_mask=mask, config=None)
    with pytest.raises(mpo_rs.InvalidBatchError, match="expected 12"):
        plugin.compute_mpo_rloo_advantage(rewards, mask, None, np.array(["a", "b"], dtype=object))


# --------------------------------------------------------------------------- MAE with a critic


def test_mpo_mae_equals_the_core_on_the_flattened_batch():
    rewards, values, mask, uid = rollout_batch(12)
    config = algo_config(lam=0.8, lam_intra=0.9, beta=0.7, gamma=0.99)
    adv, ret = core_algos.get_adv_estimator_fn("mpo_mae")(
        token_level_rewards=rewards, response_mask=mask, config=config, index=uid, values=values
    )
    flat_mask, offsets = flat_batch(mask)
    want = mpo_rs.mae_advantages(
        values.reshape(-1),
        flat_mask,
        offsets,
        rewards=rewards.reshape(-1),
        lam=0.8,
        lam_intra=0.9,
        beta=0.7,
        gamma=0.99,
    )
    np.testing.assert_array_equal(adv.reshape(-1).numpy(), want.advantages)
    np.testing.assert_array_equal(ret.reshape(-1).numpy(), want.returns)


def test_mpo_mae_credits_an_observation_reward_to_the_llm_token_before_it():
    rewards, values, mask, _ = rollout_batch(13, token_rewards=False)
    row = 0
    llm = mask[row].nonzero().flatten()
    last = int(llm[-1])
    # A reward on the tool output after the first turn, and one on trailing padding.
    first_turn_end = int(llm[(llm.diff() > 1).nonzero()[0, 0]]) if (llm.diff() > 1).any() else last
    moved = rewards.clone()
    moved[row, first_turn_end + 1] = 0.5
    if last + 1 < mask.shape[1]:
        moved[row, last + 1] = 0.25
    expected = rewards.clone()
    expected[row, first_turn_end] += 0.5
    if last + 1 < mask.shape[1]:
        expected[row, last] += 0.25
    got, _ = plugin.compute_mpo_mae_advantage(moved, mask, algo_config(), values=values)
    want, _ = plugin.compute_mpo_mae_advantage(expected, mask, algo_config(), values=values)
    torch.testing.assert_close(got, want)


def test_critic_estimators_without_values_say_how_to_get_them():
    rewards, _, mask, uid = rollout_batch(14)
    for name in plugin.CRITIC_ESTIMATORS:
        fn = core_algos.get_adv_estimator_fn(name)
        with pytest.raises(plugin.MissingCriticValuesError, match=r"critic\.enable=True"):
            fn(token_level_rewards=rewards, response_mask=mask, config=algo_config(), index=uid)


def test_option_defaults_are_the_options_table():
    # The plug-in declares no default of the table's: an empty section builds the table's
    # estimators (verl's own keys at verl's defaults).
    assert plugin.MPOOptions() == plugin.MPOOptions.from_config(algo_config())
    mae = plugin.estimator_options("mpo_mae", algo_config())
    assert mae.estimator == mpo_rs.Estimator("mae", gamma=1.0) and mae.whiten is False and mae.group is None
    assert plugin.estimator_options("mpo_grpo", algo_config()).estimator == mpo_rs.Estimator("grpo")
    gae = plugin.estimator_options("mpo_gae", None)
    assert gae.estimator == mpo_rs.Estimator("gae", gamma=1.0, lam=1.0, lam_critic=1.0) and gae.whiten is True
    mae_rloo = plugin.estimator_options("mpo_mae_rloo", None)
    assert mae_rloo.group == mpo_rs.Estimator("grpo", leave_one_out=True)
    # Every numeric option is judged by the table; the error names the config key.
    rewards, values, mask, uid = rollout_batch(15)
    for name in ("lam", "lam_intra", "lam_critic", "beta"):
        with pytest.raises(
            mpo_rs.InvalidOptionError, match=rf"`algorithm\.mpo\.{name}`.*takes a float.*got the string"
        ):
            plugin.compute_mpo_mae_advantage(rewards, mask, algo_config(**{name: "high"}), uid, values=values)
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`algorithm\.mpo\.eps`.*takes a float.*got the string"):
        plugin.compute_mpo_grpo_advantage(rewards, mask, algo_config(eps="high"), uid)


def test_unknown_or_out_of_range_options_are_refused():
    rewards, values, mask, uid = rollout_batch(15)
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"unknown `algorithm\.mpo` option.*'lam_intr'"):
        plugin.compute_mpo_mae_advantage(rewards, mask, algo_config(lam_intr=0.9), uid, values=values)
    # Ranges are the Rust estimator's: its error names the option and its domain.
    with pytest.raises(
        mpo_rs.InvalidOptionError,
        match=r"`algorithm\.mpo\.lam_intra` \(adv_estimator mpo_mae\): `lam_intra` = 1.5 is out of range: it must be in \[0, 1\]",
    ):
        plugin.compute_mpo_mae_advantage(rewards, mask, algo_config(lam_intra=1.5), uid, values=values)
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`algorithm\.mpo\.eps`.*`eps` = 0 is out of range"):
        plugin.compute_mpo_mae_grpo_advantage(rewards, mask, algo_config(eps=0.0), uid)
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`algorithm\.mpo\.whiten` .*must be true, false or null"):
        plugin.compute_mpo_gae_advantage(rewards, mask, algo_config(whiten="yes"), uid, values=values)
    with pytest.raises(plugin.InvalidConfigError, match=r"`algorithm\.mpo` must be a mapping"):
        plugin.compute_mpo_grpo_advantage(rewards, mask, OmegaConf.create({"mpo": 3}), uid)
    with pytest.raises(mpo_rs.InvalidBatchError, match="`values` has shape"):
        plugin.compute_mpo_mae_advantage(rewards, mask, algo_config(), uid, values=values[:, :-1])


def test_a_string_norm_adv_by_std_is_refused_not_read_as_true():
    """Defect 7: `algorithm.norm_adv_by_std_in_grpo: "false"` (a YAML override's string) was
    truthy, so the plug-in ran GRPO instead of Dr. GRPO. The table judges the value."""
    rewards, _, mask, uid = rollout_batch(16)
    for name in ("mpo_grpo", "mpo_mae_grpo"):
        fn = plugin._ESTIMATOR_FUNCTIONS[name]
        for spelling in ("false", "False", "true", "0"):
            config = algo_config(norm_adv_by_std_in_grpo=spelling)
            with pytest.raises(
                mpo_rs.InvalidOptionError, match=r"`algorithm\.norm_adv_by_std_in_grpo` .*takes a bool.*got the string"
            ):
                fn(rewards, mask, config, uid)
        # The real booleans still select GRPO and Dr. GRPO.
        dr, _ = fn(rewards, mask, algo_config(norm_adv_by_std_in_grpo=False), uid)
        grpo, _ = fn(rewards, mask, algo_config(norm_adv_by_std_in_grpo=True), uid)
        assert not torch.equal(dr, grpo)


def test_string_numbers_are_refused_for_every_key():
    """Defect 12: `algorithm.lam: "0.9"` was accepted (float()) where `mpo.lam: "0.9"` was
    refused; now every key's value is the table's to judge, and a string is refused."""
    rewards, values, mask, uid = rollout_batch(17)
    cases = [
        ("mpo_gae", OmegaConf.create({"lam": "0.9"}), "algorithm.lam"),
        ("mpo_gae", OmegaConf.create({"gamma": "0.9"}), "algorithm.gamma"),
        ("mpo_mae", OmegaConf.create({"gamma": "1"}), "algorithm.gamma"),
        ("mpo_mae", algo_config(lam="0.9"), "algorithm.mpo.lam"),
        ("mpo_mae_grpo", algo_config(beta="0"), "algorithm.mpo.beta"),
    ]
    for name, config, key in cases:
        kwargs = {"values": values} if name in plugin.CRITIC_ESTIMATORS else {}
        with pytest.raises(mpo_rs.InvalidOptionError, match=rf"`{key}` \(adv_estimator {name}\).*got the string"):
            plugin._ESTIMATOR_FUNCTIONS[name](rewards, mask, config, uid, **kwargs)
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`algorithm\.lam`.*got the string"):
        plugin.compute_gae_advantage_return(rewards, values, mask, 1.0, "0.9")


def test_a_null_verl_key_means_verls_default():
    """Defect 12: `algorithm.lam: null` raised a raw TypeError (float(None))."""
    rewards, values, mask, uid = rollout_batch(18)
    nulls = OmegaConf.create({"gamma": None, "lam": None, "norm_adv_by_std_in_grpo": None, "mpo": {"lam": None}})
    defaults = OmegaConf.create({})
    tokens = torch.arange(mask.numel()).reshape(mask.shape) % 3  # mpo_gigpo's anchor states
    for name, fn in plugin._ESTIMATOR_FUNCTIONS.items():
        kwargs = {"values": values} if name in plugin.CRITIC_ESTIMATORS else {}
        kwargs |= {"token_ids": tokens} if name == "mpo_gigpo" else {}
        got = fn(rewards, mask, nulls, uid, **kwargs)
        want = fn(rewards, mask, defaults, uid, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), name


def test_an_option_the_estimator_does_not_use_is_refused_unless_default():
    """Defect 12: `mpo.eps=0` was refused for `mpo_rloo` (which never uses eps) by a range
    check, while `mpo.lam=1.5` under `mpo_grpo` was silently ignored. Now a non-default
    value of an `algorithm.mpo` option the estimator does not use is refused, saying so;
    the default written out is accepted (a shared config may spell it)."""
    rewards, values, mask, uid = rollout_batch(19)
    refused = [
        ("mpo_rloo", algo_config(eps=0.0), "eps"),
        ("mpo_rloo", algo_config(eps=1e-3), "eps"),
        ("mpo_grpo", algo_config(lam=1.5), "lam"),
        ("mpo_grpo", algo_config(lam=0.5), "lam"),
        ("mpo_grpo", algo_config(eps=1e-3, norm_adv_by_std_in_grpo=False), "eps"),  # Dr. GRPO: no std
        ("mpo_mae_rloo", algo_config(eps=1e-3), "eps"),
        ("mpo_mae_grpo", algo_config(lam_critic=0.5), "lam_critic"),
        ("mpo_mae", algo_config(eps=1e-3), "eps"),
        ("mpo_gae", algo_config(lam=0.5), "lam"),
    ]
    for name, config, option in refused:
        kwargs = {"values": values} if name in plugin.CRITIC_ESTIMATORS else {}
        with pytest.raises(
            mpo_rs.InvalidOptionError, match=rf"`algorithm\.mpo\.{option}` = .* does not apply to adv_estimator {name}"
        ):
            plugin._ESTIMATOR_FUNCTIONS[name](rewards, mask, config, uid, **kwargs)
    table = mpo_rs.Estimator("mae").options
    spelled = algo_config(eps=1e-6, lam=table["lam"], lam_critic=table["lam_critic"], whiten=False)
    for name in ("mpo_rloo", "mpo_grpo", "mpo_mae_rloo"):
        got = plugin._ESTIMATOR_FUNCTIONS[name](rewards, mask, spelled, uid)
        want = plugin._ESTIMATOR_FUNCTIONS[name](rewards, mask, algo_config(), uid)
        assert torch.equal(got[0], want[0]), name


# --------------------------------------------------------------------------- the values hook


def test_values_hook_feeds_the_critic_to_mpo_estimators_through_verls_compute_advantage():
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    from verl import DataProto

    plugin.install_values_hook()
    assert getattr(ray_trainer.compute_advantage, "__mpo_rs_values_hook__", False)
    rewards, values, mask, uid = rollout_batch(30)
    config = OmegaConf.create({"gamma": 1.0, "lam": 0.95, "mpo": {"lam": 0.8, "beta": 0.5}})

    def batch(with_values: bool):
        tensors = {"token_level_rewards": rewards, "response_mask": mask}
        if with_values:
            tensors["values"] = values
        return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})

    out = ray_trainer.compute_advantage(batch(True), adv_estimator="mpo_mae", config=config)
    want, want_ret = plugin.compute_mpo_mae_advantage(rewards, mask, config, uid, values=values)
    torch.testing.assert_close(out.batch["advantages"], want)
    torch.testing.assert_close(out.batch["returns"], want_ret)

    # mpo_gae refuses MAE's options (they do not apply to it): its own config.
    gae_config = OmegaConf.create({"gamma": 1.0, "lam": 0.95})
    out = ray_trainer.compute_advantage(batch(True), adv_estimator="mpo_gae", gamma=1.0, lam=0.95, config=gae_config)
    verl_gae = ray_trainer.compute_advantage(batch(True), adv_estimator="gae", gamma=1.0, lam=0.95, config=gae_config)
    torch.testing.assert_close(
        on_llm_tokens(out.batch["advantages"], mask),
        on_llm_tokens(verl_gae.batch["advantages"], mask),
        rtol=1e-4,
        atol=2e-5,
    )
    # Without a critic (critic.enable unset) the batch has no values: a clear error.
    with pytest.raises(plugin.MissingCriticValuesError, match=r"critic\.enable=True"):
        ray_trainer.compute_advantage(batch(False), adv_estimator="mpo_mae", config=config)
    # The values are visible only during the call.
    assert values_hook._CRITIC_VALUES.get() is None


def test_values_hook_rebinds_modules_that_imported_compute_advantage_by_name():
    def compute_advantage(data, adv_estimator, **kwargs):
        return ("verl", adv_estimator, values_hook._CRITIC_VALUES.get())

    trainer = types.ModuleType("fake_ray_trainer")
    trainer.compute_advantage = compute_advantage
    user = types.ModuleType("verl._mpo_rs_test_user")
    user.compute_advantage = compute_advantage  # as `from ...ray_trainer import compute_advantage`
    sys.modules[user.__name__] = user
    try:
        values_hook._patch_compute_advantage(trainer)
        values_hook._patch_compute_advantage(trainer)  # idempotent
        assert user.compute_advantage is trainer.compute_advantage is not compute_advantage
        data = types.SimpleNamespace(batch={"values": "V"})
        assert trainer.compute_advantage(data, "grpo") == ("verl", "grpo", None)
        assert trainer.compute_advantage(data, "mpo_mae") == ("verl", "mpo_mae", "V")
        assert trainer.compute_advantage.__wrapped__ is compute_advantage
    finally:
        del sys.modules[user.__name__]


# --------------------------------------------------------------------------- the entry point


def test_the_package_declares_the_verl_plugin_entry_point():
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["verl.plugins"] == {"mpo_rs": "mpo_rs.integrations.verl"}
    assert "verl" in project["optional-dependencies"]


def test_verl_loads_the_plugin_by_itself_in_a_fresh_process():
    installed = [ep for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.name == "mpo_rs"]
    if not installed:
        pytest.skip("the installed mpo-rs metadata predates the entry point; rebuild the package")
    assert installed[0].value == "mpo_rs.integrations.verl"
    script = (
        "import sys, verl\n"
        "assert 'mpo_rs.integrations.verl' in sys.modules, 'plug-in not loaded'\n"
        "from verl.trainer.ppo import core_algos as c\n"
        f"assert all(n in c.ADV_ESTIMATOR_REGISTRY for n in {plugin.ESTIMATORS!r})\n"
        f"assert all(n in c.POLICY_LOSS_REGISTRY for n in {plugin.LOSS_MODES!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# --------------------------------------------------------------------------- the example


def leaf_paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaf_paths(value, (*prefix, key))
    else:
        yield prefix


def test_the_verl_example_config_matches_verls_config_and_the_plugin():
    import verl

    example = OmegaConf.to_container(OmegaConf.load(ROOT / "examples" / "verl_mpo.yaml"))
    assert example.pop("defaults") == ["ppo_trainer", "_self_"]
    example.pop("hydra")
    verl_config = OmegaConf.to_container(
        OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    )
    for path in leaf_paths(example):
        if path[:2] == ("algorithm", "mpo"):
            continue  # the plug-in's own section, added to verl's
        node = verl_config
        for key in path:
            assert isinstance(node, dict) and key in node, f"verl has no config key {'.'.join(path)}"
            node = node[key]
    algorithm = OmegaConf.create(example["algorithm"])
    assert algorithm.adv_estimator in plugin.ESTIMATORS
    assert example["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] in plugin.LOSS_MODES
    options = plugin.estimator_options(algorithm.adv_estimator, algorithm)
    mpo = dict(example["algorithm"]["mpo"])
    assert options.whiten is mpo.pop("whiten") is False
    assert options.estimator == mpo_rs.Estimator("mae", gamma=example["algorithm"]["gamma"], **mpo)


def test_mpo_bilevel_gae_is_ragens_bilevel_gae_whitened():
    """`mpo_bilevel_gae` reads RAGEN's keys (algorithm.gamma, lam, high_level_gamma), whitens
    like RAGEN and returns the unwhitened advantages + values."""
    rewards, values, mask, uid = rollout_batch(31)
    config = OmegaConf.create({"gamma": 0.99, "lam": 0.95, "high_level_gamma": 0.9})
    fn = core_algos.get_adv_estimator_fn("mpo_bilevel_gae")
    adv, ret = fn(rewards, mask, config, uid, values=values)
    options = dict(gamma=0.99, lam=0.95, high_level_gamma=0.9)
    want_adv, want_ret = mpo_rs.torch.bilevel_advantages(values, mask, rewards, whiten=True, **options)
    raw, _ = mpo_rs.torch.bilevel_advantages(values, mask, rewards, **options)
    assert torch.equal(adv, want_adv) and torch.equal(ret, want_ret)
    torch.testing.assert_close(on_llm_tokens(ret, mask), on_llm_tokens(raw + values, mask))
    assert abs(float(on_llm_tokens(adv, mask).mean())) < 1e-5
    est = plugin.estimator_options("mpo_bilevel_gae", OmegaConf.create({})).estimator
    assert est == mpo_rs.Estimator("bilevel")  # verl's gamma = lam = 1 are RAGEN's defaults too
    with pytest.raises(
        mpo_rs.InvalidOptionError, match=r"`algorithm\.high_level_gamma` \(adv_estimator mpo_bilevel_gae\)"
    ):
        fn(rewards, mask, OmegaConf.create({"high_level_gamma": 1.5}), uid, values=values)
    with pytest.raises(mpo_rs.InvalidOptionError, match=r"`algorithm\.mpo\.beta` = 0\.5 does not apply"):
        fn(rewards, mask, algo_config(beta=0.5), uid, values=values)
