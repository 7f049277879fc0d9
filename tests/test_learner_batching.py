"""The learner's batches: micro-batches accumulate to the minibatch gradient, padded rows keep
the attended tokens in order, group ids as given, one flat-to-padded gather; the model calls
(log-probs and values from the previous position, typed errors), values from the batch, bf16."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_learner import VOCAB, TinyCausalLM, _host_learner, echo_rollout, make_learner, ragged_batch  # noqa: E402
from torch import nn  # noqa: E402

from mpo_rs import (  # noqa: E402
    InvalidOptionError,
    InvalidRolloutError,
    group_advantages,
)
from mpo_rs.torch import learner as learner_module  # noqa: E402
from mpo_rs.torch import losses  # noqa: E402
from mpo_rs.torch.learner import (  # noqa: E402
    Learner,
    LearnerConfig,
    RolloutBatch,
    explained_variance,
    token_log_probs,
    token_values,
)

# --------------------------------------------------------------------------- batching


@pytest.mark.parametrize("agg", losses.AGGREGATIONS)
def test_micro_batches_accumulate_to_the_minibatch_gradient(one_thread, agg):
    batch = ragged_batch()
    torch.manual_seed(0)
    policy, critic = TinyCausalLM(), TinyCausalLM(out_features=1)
    params = {}
    for micro in (None, 2):
        p, c = copy.deepcopy(policy), copy.deepcopy(critic)
        cfg = LearnerConfig(minibatch_size=7, micro_batch_size=micro, max_grad_norm=None, shuffle=False, agg=agg)
        learner = Learner(p, torch.optim.SGD(p.parameters(), lr=0.5), cfg, critic=c,
                          critic_optimizer=torch.optim.SGD(c.parameters(), lr=0.5))  # fmt: skip
        metrics = learner.step(batch)
        params[micro] = [t.detach().clone() for t in [*p.parameters(), *c.parameters()]]
    assert any(
        not torch.equal(a, b) for a, b in zip(params[None], [*policy.parameters(), *critic.parameters()], strict=True)
    )
    for full, accumulated in zip(params[None], params[2], strict=True):
        torch.testing.assert_close(accumulated, full, rtol=1e-5, atol=1e-6)
    assert np.isfinite(metrics["actor/loss"]) and np.isfinite(metrics["critic/loss"])


def test_from_padded_keeps_the_attended_tokens_in_order():
    flat = ragged_batch(1)
    lengths = flat.lengths
    width = int(lengths.max()) + 2
    rows = flat.n_trajectories
    ids = np.full((rows, width), 99)
    attention = np.zeros((rows, width), dtype=np.int64)
    response = np.zeros((rows, width), dtype=bool)
    old = np.full((rows, width), np.nan, dtype=np.float32)
    rewards = np.zeros((rows, width), dtype=np.float32)
    for j in range(rows):  # left padding, as a batched sampler returns it
        span = slice(flat.offsets[j], flat.offsets[j + 1])
        cols = slice(width - lengths[j], width)
        ids[j, cols], attention[j, cols], response[j, cols] = flat.token_ids[span], 1, flat.mask[span]
        old[j, cols], rewards[j, cols] = flat.old_log_probs[span], flat.rewards[span]
    padded = RolloutBatch.from_padded(
        torch.from_numpy(ids), attention, response, old_log_probs=old, rewards=rewards, group_ids=flat.group_ids
    )
    for name in ("token_ids", "mask", "offsets", "old_log_probs", "rewards"):
        np.testing.assert_array_equal(getattr(padded, name), getattr(flat, name), err_msg=name)


def test_group_ids_one_and_string_one_are_two_groups():
    """Defect 5: numpy stringified [1, "1", 1, "1"] into one group; by the group-id rule
    (numbers and strings are different kinds) they are two."""
    batch = RolloutBatch(
        token_ids=np.zeros(8, np.int64),
        mask=np.array([0, 1] * 4, bool),
        offsets=np.arange(0, 9, 2),
        scores=np.array([1.0, 0.0, 1.0, 0.0], np.float32),
        group_ids=[1, "1", 1, "1"],
    )
    assert batch.group_ids.tolist() == [1, "1", 1, "1"]
    assert [type(x) for x in batch.group_ids] == [int, str, int, str]
    advantages, _ = _host_learner(LearnerConfig(estimator="grpo")).compute_advantages(batch, None)
    # Group 1 scored (1, 1) and group "1" (0, 0): nothing to prefer inside either group.
    np.testing.assert_array_equal(advantages, np.zeros(8, np.float32))
    two_groups = group_advantages(batch.scores, [1, "1", 1, "1"])
    np.testing.assert_array_equal(advantages[batch.mask], two_groups)
    with pytest.raises(InvalidRolloutError, match="1-D"):
        RolloutBatch(**{**batch.__dict__, "group_ids": [[1], [2], [3], [4]]})


def test_pad_rows_is_the_one_flat_to_padded_gather():
    from mpo_rs.torch.batching import pad_rows

    flat = ragged_batch(3)
    rows = np.array([4, 0, 2])
    padded = pad_rows({"token_ids": flat.token_ids, "mask": flat.mask}, flat.offsets, rows)
    lengths = flat.lengths[rows]
    assert padded.arrays["token_ids"].shape == (3, lengths.max())
    np.testing.assert_array_equal(padded.arrays["attention_mask"].sum(1), lengths)
    expected = np.concatenate([np.arange(flat.offsets[r], flat.offsets[r + 1]) for r in rows])
    np.testing.assert_array_equal(padded.positions, expected)
    np.testing.assert_array_equal(padded.arrays["token_ids"][padded.valid], flat.token_ids[expected])
    assert not padded.arrays["token_ids"][~padded.valid].any()
    assert padded.n_policy_tokens == int(flat.mask[expected].sum())


def test_explained_variance_is_one_function_with_one_nan_rule():
    from mpo_rs.torch import metrics

    assert learner_module.explained_variance is metrics.explained_variance
    tiny = np.array([0.0, 1e-5, 0.0, 1e-5])  # Var(G) = 2.5e-11 <= 1e-8: NaN everywhere
    assert np.isnan(explained_variance(np.zeros(4), tiny))
    g = torch.tensor([0.0, 1e-5, 0.0, 1e-5])
    _, m = losses.value_loss(torch.zeros(4, requires_grad=True), torch.zeros(4), g, torch.ones(4, dtype=torch.bool))
    assert torch.isnan(m["explained_variance"])  # the torch metric of value_loss agrees


def test_the_learner_names_stay_importable_from_their_old_places():
    import mpo_rs.torch as mt
    from mpo_rs.torch import batching, estimation, learner_config, metrics, model_io

    assert learner_module.LearnerConfig is learner_config.LearnerConfig is mt.LearnerConfig
    assert learner_module.Learner is mt.Learner
    for name in ("token_log_probs", "token_log_probs_and_entropy", "token_values"):
        assert getattr(learner_module, name) is getattr(model_io, name)
    assert learner_module.explained_variance is metrics.explained_variance
    assert learner_module.RolloutBatch is mt.RolloutBatch
    assert estimation.estimate and batching.pad_rows


def test_token_log_probs_and_values_use_the_previous_position():
    torch.manual_seed(0)
    policy, critic = TinyCausalLM(), TinyCausalLM(out_features=1)
    ids = torch.randint(0, VOCAB, (3, 6))
    attention = torch.ones_like(ids)
    lp = token_log_probs(policy, ids, attention, temperature=0.7)
    logits = policy(input_ids=ids, attention_mask=attention) / 0.7
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp[:, 1:], expected)
    assert torch.all(lp[:, 0] == 0)
    v = token_values(critic, ids, attention)
    torch.testing.assert_close(v[:, 1:], critic(input_ids=ids, attention_mask=attention)[:, :-1, 0])


def test_model_errors_are_typed():
    from mpo_rs.torch.critic import value_head_critic

    with pytest.raises(InvalidOptionError, match="no linear LM head"):
        value_head_critic(nn.Sequential())

    class Dict(nn.Module):
        def forward(self, input_ids, attention_mask):
            return {"values": input_ids}

    with pytest.raises(InvalidRolloutError, match="Dict returned dict"):
        token_values(Dict(), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_values_from_the_batch_train_the_policy_without_a_critic(one_thread):
    batch = ragged_batch(2)
    batch.values = np.random.default_rng(0).standard_normal(batch.mask.size).astype(np.float32)
    torch.manual_seed(0)
    policy = TinyCausalLM()
    learner = Learner(policy, torch.optim.Adam(policy.parameters()), LearnerConfig(estimator="gae"))
    metrics = learner.step(batch)
    assert "actor/loss" in metrics and not any(k.startswith("critic/") for k in metrics)


def test_bf16_autocast_step(one_thread):
    learner = make_learner("mae", bf16=True, ppo_epochs=1)
    metrics = learner.step(echo_rollout(learner.policy, 4, 4, torch.Generator().manual_seed(0)))
    assert np.isfinite(metrics["actor/loss"]) and np.isfinite(metrics["critic/loss"])
