"""The learner's configuration: bad batches and settings refused with typed errors, every
estimator of the options table a LearnerConfig estimator (the old settings give the same bits),
the removed fields naming where their option went, and the settings' kinds and defaults."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_learner import TinyCausalLM, _host_learner, echo_rollout, make_learner  # noqa: E402
from torch import nn  # noqa: E402

from mpo_rs import (  # noqa: E402
    Estimator,
    InvalidOptionError,
    InvalidRolloutError,
    bilevel_advantages,
    broadcast_to_tokens,
    gae_advantages,
    gigpo_advantages,
    group_advantages,
    mae_advantages,
)
from mpo_rs.torch import learner as learner_module  # noqa: E402
from mpo_rs.torch.learner import (  # noqa: E402
    Learner,
    LearnerConfig,
    RolloutBatch,
)

# --------------------------------------------------------------------------- errors


def test_bad_batches_and_configs_are_rejected():
    good = dict(token_ids=np.zeros(4, np.int64), mask=np.array([0, 1, 0, 1], bool), offsets=np.array([0, 2, 4]))
    with pytest.raises(InvalidRolloutError, match="trajectory 1 starts with a policy token"):
        RolloutBatch(
            token_ids=np.zeros(4), mask=np.array([0, 1, 1, 1], bool), offsets=np.array([0, 2, 4]), scores=np.zeros(2)
        )
    with pytest.raises(InvalidRolloutError, match="exactly one of"):
        RolloutBatch(**good)
    with pytest.raises(InvalidRolloutError, match="exactly one of"):
        RolloutBatch(**good, scores=np.zeros(2), rewards=np.zeros(4))
    with pytest.raises(InvalidRolloutError, match="`scores` has shape"):
        RolloutBatch(**good, scores=np.zeros(3))
    with pytest.raises(InvalidRolloutError, match="`offsets`"):
        RolloutBatch(**(good | {"offsets": np.array([0, 3, 2])}), scores=np.zeros(2))
    with pytest.raises(InvalidRolloutError, match="`old_log_probs` has shape"):
        RolloutBatch(**good, scores=np.zeros(2), old_log_probs=np.zeros(3))
    with pytest.raises(InvalidOptionError, match="estimator"):
        LearnerConfig(estimator="vapo")
    with pytest.raises(InvalidOptionError, match="ratio"):
        LearnerConfig(ratio="turns")
    with pytest.raises(InvalidOptionError, match="advantage_scale"):
        LearnerConfig(advantage_scale="group")
    policy = TinyCausalLM()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    batch = RolloutBatch(**good, scores=np.ones(2))
    with pytest.raises(InvalidRolloutError, match="needs a critic"):
        Learner(policy, optimizer, LearnerConfig(estimator="mae")).step(batch)
    with pytest.raises(InvalidRolloutError, match="group_ids"):
        Learner(policy, optimizer, LearnerConfig(estimator="grpo")).step(batch)


# The estimator's settings before LearnerConfig took an Estimator (main 4b9aa35), as the
# old fields, and the sha256 (first 16 hex digits) of the advantages and critic targets
# that compute_advantages returned for them on seeded_estimation_batch(); the same
# settings as an Estimator must give the same bits.
OLD_SETTINGS = {
    "mae_default": ({}, Estimator("mae")),
    "mae_knobs": (
        {"lam": 0.9, "lam_intra": 0.9, "beta": 0.5, "gamma": 0.99, "lam_critic": 0.95},
        Estimator("mae", lam=0.9, lam_intra=0.9, beta=0.5, gamma=0.99, lam_critic=0.95),
    ),
    "mae_whiten": ({"advantage_scale": "whiten"}, Estimator("mae")),
    "gae_default": ({}, Estimator("gae")),
    "gae_knobs": (
        {"lam": 0.9, "gamma": 0.99, "lam_critic": 0.9, "gae_length_adaptive_alpha": 2.0},
        Estimator("gae", lam=0.9, gamma=0.99, lam_critic=0.9, length_adaptive_alpha=2.0),
    ),
    "grpo_default": ({}, Estimator("grpo")),
    "grpo_nostd": ({"grpo_norm_std": False}, Estimator("grpo", norm_std=False)),
    "grpo_loo": ({"grpo_leave_one_out": True}, Estimator("grpo", leave_one_out=True)),
    "grpo_eps": ({"grpo_eps": 1e-3, "advantage_scale": "whiten"}, Estimator("grpo", eps=1e-3)),
}
RECORDED_AT_4B9AA35 = {
    "mae_default-scores": "794ab20c997e7693",
    "mae_knobs-scores": "2e695428357343ee",
    "mae_whiten-scores": "e34352ee6e0f94fb",
    "gae_default-scores": "ac8b48e68bed8af4",
    "gae_knobs-scores": "6a2dc88d51d68f97",
    "grpo_default-scores": "f96d77d633219fee",
    "grpo_nostd-scores": "f13e3ac13a4dc46b",
    "grpo_loo-scores": "72cb86be0fb4ec25",
    "grpo_eps-scores": "e16a6afcde57d93b",
    "mae_default-rewards": "3ae9e121a00ca6c1",
    "mae_knobs-rewards": "dd1365f2d15b3a9c",
    "mae_whiten-rewards": "3ab8eec6ec956632",
    "gae_default-rewards": "ba23a36b58ae37f9",
    "gae_knobs-rewards": "c817c43997057e28",
    "grpo_default-rewards": "261bfe1c36703ee8",
    "grpo_nostd-rewards": "19c7b68d4aa4dcc0",
    "grpo_loo-rewards": "2a8ade15d007ba16",
    "grpo_eps-rewards": "7eba32e757f54910",
}


def seeded_estimation_batch(reward: str, seed: int = 18) -> tuple[RolloutBatch, np.ndarray]:
    """12 ragged trajectories in 4 groups, with critic values; ``reward`` is ``"scores"`` or
    ``"rewards"`` (sparse token rewards)."""
    rng = np.random.default_rng(seed)
    n = 12
    offsets = np.concatenate([[0], np.cumsum(rng.integers(3, 20, size=n))]).astype(np.int64)
    n_tokens = int(offsets[-1])
    mask = rng.random(n_tokens) < 0.6
    mask[offsets[:-1]] = False
    token_ids = rng.integers(0, 50, size=n_tokens)
    values = rng.normal(size=n_tokens).astype(np.float32)
    scores = rng.normal(size=n).astype(np.float32)
    rewards = np.zeros(n_tokens, np.float32)
    n_policy = int(mask.sum())
    rewards[mask] = rng.normal(size=n_policy).astype(np.float32) * (rng.random(n_policy) < 0.3)
    source = {"scores": scores} if reward == "scores" else {"rewards": rewards}
    batch = RolloutBatch(token_ids, mask, offsets, group_ids=np.repeat(np.arange(4), 3), **source)
    return batch, values


def _digest(advantages: np.ndarray, returns: np.ndarray | None) -> str:
    return hashlib.sha256(advantages.tobytes() + (b"" if returns is None else returns.tobytes())).hexdigest()[:16]


@pytest.mark.parametrize("reward", ["scores", "rewards"])
@pytest.mark.parametrize("case", list(OLD_SETTINGS))
def test_old_estimator_settings_as_an_estimator_give_the_same_bits(case, reward):
    """Deliverable 2: the re-declared fields are gone; the same settings carried by an
    Estimator give advantages and targets bitwise equal to what 4b9aa35 computed."""
    old_fields, estimator = OLD_SETTINGS[case]
    scale = {"advantage_scale": old_fields["advantage_scale"]} if "advantage_scale" in old_fields else {}
    batch, values = seeded_estimation_batch(reward)
    advantages, returns = _host_learner(LearnerConfig(estimator=estimator, **scale)).compute_advantages(batch, values)
    assert _digest(advantages, returns) == RECORDED_AT_4B9AA35[f"{case}-{reward}"]
    if estimator == Estimator(estimator.name):  # the name alone is the same config
        by_name = LearnerConfig(estimator=estimator.name, **scale)
        assert by_name == LearnerConfig(estimator=estimator, **scale)
        assert _digest(*_host_learner(by_name).compute_advantages(batch, values)) == _digest(advantages, returns)


@pytest.mark.parametrize("name", Estimator.names())
def test_every_estimator_of_the_table_is_a_learner_estimator(name):
    """mae, gae, grpo, drgrpo, rloo, bilevel and gigpo, by name or as an Estimator; the advantages
    are the core's, and a critic-free estimator's critic targets are Monte-Carlo returns (the
    group family's gamma 1; gigpo's discounted once per turn)."""
    config = LearnerConfig(estimator=name)
    assert config.estimator == Estimator(name) and LearnerConfig(estimator=Estimator(name)) == config
    batch, values = seeded_estimation_batch("scores")
    advantages, returns = _host_learner(config).compute_advantages(batch, values)
    if Estimator(name).family == "group":
        per_trajectory = group_advantages(batch.scores, batch.group_ids, estimator=name)
        np.testing.assert_array_equal(advantages, broadcast_to_tokens(per_trajectory, batch.mask, batch.offsets))
        expected = gae_advantages(values, batch.mask, batch.offsets, scores=batch.scores, lam=1.0, lam_critic=1.0)
        np.testing.assert_array_equal(returns, expected.returns)
        np.testing.assert_array_equal(returns[batch.mask], np.repeat(batch.scores, batch.lengths)[batch.mask])
        assert _host_learner(config).compute_advantages(batch, None)[1] is None
    elif name == "gigpo":
        # The learner hands the batch's token ids over as the anchor states.
        expected = gigpo_advantages(
            batch.mask, batch.offsets, group_ids=batch.group_ids, scores=batch.scores, token_ids=batch.token_ids
        )
        np.testing.assert_array_equal(advantages, expected.advantages)
        targets = mae_advantages(values, batch.mask, batch.offsets, scores=batch.scores, lam=1.0, gamma=0.95)
        np.testing.assert_array_equal(returns, targets.returns)
        assert _host_learner(config).compute_advantages(batch, None)[1] is None
    else:
        run = {"mae": mae_advantages, "gae": gae_advantages, "bilevel": bilevel_advantages}[Estimator(name).family]
        expected = run(values, batch.mask, batch.offsets, scores=batch.scores)
        np.testing.assert_array_equal(advantages, expected.advantages)
        np.testing.assert_array_equal(returns, expected.returns)


@pytest.mark.parametrize("name", ["drgrpo", "rloo", "gigpo"])
def test_the_group_presets_train(one_thread, name):
    learner = make_learner(name, ppo_epochs=1)
    metrics = learner.step(echo_rollout(learner.policy, 2, 4, torch.Generator().manual_seed(0)))
    assert all(np.isfinite(v) for v in metrics.values()), metrics


def test_bilevel_trains_with_its_critic(one_thread):
    learner = make_learner(Estimator("bilevel", lam=0.95), ppo_epochs=1)
    assert learner.critic is not None
    metrics = learner.step(echo_rollout(learner.policy, 2, 4, torch.Generator().manual_seed(0)))
    assert all(np.isfinite(v) for v in metrics.values()), metrics


def test_critic_targets_take_the_estimators_gamma_or_one():
    from mpo_rs.torch.estimation import critic_targets_estimator

    for name in ("grpo", "drgrpo", "rloo"):
        assert critic_targets_estimator(Estimator(name)) == Estimator("gae", gamma=1.0, lam=1.0, lam_critic=1.0)
    discounted = critic_targets_estimator(Estimator("mae", gamma=0.9))
    assert discounted == Estimator("gae", gamma=0.9, lam=1.0, lam_critic=1.0)
    # GiGPO discounts once per turn: MAE's Monte-Carlo returns.
    per_turn = critic_targets_estimator(Estimator("gigpo", gamma=0.9))
    assert per_turn == Estimator("mae", gamma=0.9, lam=1.0, lam_critic=1.0)


@pytest.mark.parametrize("field", ["lam", "lam_intra", "beta", "gamma", "lam_critic", "gae_length_adaptive_alpha",
                                   "grpo_norm_std", "grpo_leave_one_out", "grpo_eps"])  # fmt: skip
def test_the_removed_estimator_fields_say_where_the_option_went(field):
    with pytest.raises(InvalidOptionError, match=rf"takes no `{field}`.*estimator=mpo_rs\.Estimator\("):
        LearnerConfig(**{field: 0.5})


def test_an_unknown_setting_is_an_invalid_option_error():
    with pytest.raises(InvalidOptionError, match="no setting `minibatch`"):
        LearnerConfig(minibatch=4)
    with pytest.raises(InvalidOptionError, match=r"no setting `clip_hgh` \(did you mean `clip_high`\?\)"):
        LearnerConfig(clip_hgh=0.3)


def test_a_setting_assigned_after_construction_is_refused_as_at_construction():
    config = LearnerConfig()
    config.clip_high = 0.3
    assert config.clip_high == 0.3
    with pytest.raises(
        InvalidOptionError, match=r'no setting `normalize_advantages` \(write advantage_scale="whiten"\)'
    ):
        config.normalize_advantages = True  # type: ignore[attr-defined]
    assert not hasattr(config, "normalize_advantages") and not config.whitens


def test_the_removed_whitening_flag_names_its_replacement():
    with pytest.raises(
        InvalidOptionError, match=r'no setting `normalize_advantages` \(write advantage_scale="whiten"\)'
    ):
        LearnerConfig(normalize_advantages=True)
    with pytest.raises(InvalidOptionError, match=r"Estimator\('gae', lam=\.\.\.\)"):
        LearnerConfig(estimator="gae", lam=0.9)
    with pytest.raises(InvalidOptionError, match="`estimator` twice"):
        LearnerConfig("gae", estimator="mae")
    with pytest.raises(InvalidOptionError, match="at most"):
        LearnerConfig(*range(40))


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("max_grad_norm", -0.5, id="max_grad_norm-negative-trained-by-gradient-ascent"),
        pytest.param("max_grad_norm", 0.0, id="max_grad_norm-zero-froze-learning"),
        pytest.param("max_grad_norm", NAN, id="max_grad_norm-nan-made-every-parameter-nan"),
        pytest.param("max_grad_norm", INF, id="max_grad_norm-inf"),
        pytest.param("minibatch_size", 2.5, id="minibatch_size-float-failed-at-the-first-step"),
        pytest.param("ppo_epochs", NAN, id="ppo_epochs-nan"),
        pytest.param("ppo_epochs", INF, id="ppo_epochs-inf"),
        pytest.param("micro_batch_size", NAN, id="micro_batch_size-nan"),
        ("ppo_epochs", True),
        ("minibatch_size", "16"),
        ("minibatch_size", 0),
        ("micro_batch_size", 16.0),
        ("seed", -1),
        ("seed", 1.5),
        ("seed", False),
        ("temperature", NAN),
        ("temperature", True),
        pytest.param("temperature", 10**400, id="temperature-10**400"),
        ("temperature", "1.0"),
        ("entropy_coef", INF),
        ("log_ratio_clamp", INF),
        ("value_clip", NAN),
        ("clip_low", NAN),
        ("clip_low", -0.1),
        ("clip_high", INF),
        pytest.param("clip_high", 3.5e38, id="clip_high-beyond-float32-failed-in-clamp"),
        ("clip_high", -0.1),
        ("dual_clip", NAN),
        ("dual_clip", 1.0),
        ("shuffle", 1),
        ("bf16", "yes"),
        ("estimator", 5),
        ("estimator", None),
        ("estimator", "vapo"),
        ("ratio", 1),
        ("turn_ratio", "mean"),
        ("agg", None),
        ("advantage_scale", ["whiten"]),
        ("device", 3),
        ("device", "gpu0"),
        ("critic_epochs", 0),
        ("critic_epochs", True),
        ("critic_epochs", 2.0),
        ("critic_epochs", NAN),
        ("critic_epochs", "3"),
    ],
)
def test_bad_learner_settings_are_refused_at_construction(field, value):
    """Defect 4: every field is checked when the config is built, naming the field."""
    with pytest.raises(InvalidOptionError, match=re.escape(field)):
        LearnerConfig(**{field: value})


@pytest.mark.skipif(hasattr(torch, "xpu") and torch.xpu.is_available(), reason="this machine has an XPU")
def test_a_device_torch_cannot_use_is_an_invalid_option_error():
    policy = nn.Linear(1, 1)
    with pytest.raises(InvalidOptionError, match=r"LearnerConfig\.device='xpu' cannot be used here"):
        Learner(policy, torch.optim.SGD(policy.parameters(), lr=0.1), LearnerConfig(device="xpu"))


def test_valid_numbers_are_stored_as_their_kind():
    config = LearnerConfig(clip_low=0, max_grad_norm=np.float32(0.5), minibatch_size=np.int64(8), shuffle=np.True_)
    assert type(config.clip_low) is float and config.clip_low == 0.0
    assert type(config.max_grad_norm) is float and config.max_grad_norm == 0.5
    assert type(config.minibatch_size) is int and config.minibatch_size == 8
    assert config.shuffle is True
    assert LearnerConfig(max_grad_norm=None, micro_batch_size=None, ratio=None, device="cpu").device == "cpu"


def test_the_estimator_names_are_the_options_table():
    assert (
        learner_module.ESTIMATORS == Estimator.names() == ("mae", "gae", "grpo", "drgrpo", "rloo", "bilevel", "gigpo")
    )
    assert LearnerConfig().estimator == Estimator("mae")
    assert not any(hasattr(LearnerConfig(), name) for name in ("_mae", "_gae", "_group", "estimator_lam"))


def test_ratio_defaults_to_the_estimators_natural_one():
    assert LearnerConfig(estimator="mae").policy_ratio == "turn"
    assert LearnerConfig(estimator=Estimator("mae", lam=0.9)).policy_ratio == "turn"
    for name in ("gae", "grpo", "drgrpo", "rloo", "bilevel"):
        assert LearnerConfig(estimator=name).policy_ratio == "token", name
    assert LearnerConfig(estimator="grpo", ratio="sequence").policy_ratio == "sequence"
    assert LearnerConfig(estimator="gae", ratio="turn").policy_ratio == "turn"
    assert LearnerConfig().ratio is None


def test_whitening_is_the_advantage_scale():
    assert LearnerConfig().advantage_scale == "none" and not LearnerConfig().whitens
    assert LearnerConfig(advantage_scale="whiten").whitens
