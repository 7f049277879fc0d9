"""mpo_rs.torch.learner on a toy multi-turn task with a tiny randomly initialised transformer."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from mpo_rs import (  # noqa: E402
    Estimator,
    InvalidOptionError,
    mae_advantages,
)
from mpo_rs.torch import learner as learner_module  # noqa: E402
from mpo_rs.torch import losses, whiten  # noqa: E402
from mpo_rs.torch.learner import (  # noqa: E402
    Learner,
    LearnerConfig,
    RolloutBatch,
    explained_variance,
    token_log_probs,
    token_log_probs_and_entropy,
)

VOCAB, BOS, SEP = 8, 0, 1
TURNS, TOKENS_PER_TURN = 3, 2


class TinyCausalLM(nn.Module):
    """A one-layer causal transformer: logits (B, L, VOCAB), or values (B, L, 1)."""

    def __init__(self, out_features: int = VOCAB, width: int = 32, max_len: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(max_len, width)
        layer = nn.TransformerEncoderLayer(width, 2, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(width, out_features)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        h = self.embed(input_ids) + self.position(positions)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=input_ids.device)
        # Right padding only: causal attention never looks at the padding after a token.
        return self.head(self.body(h, mask=causal, is_causal=True))


@torch.no_grad()
def echo_rollout(policy: nn.Module, n_prompts: int, per_prompt: int, gen: torch.Generator) -> RolloutBatch:
    """The echo task: each turn the environment shows [SEP, key]; the policy answers with
    TOKENS_PER_TURN tokens and scores the fraction of its tokens equal to the turn's key,
    paid once at the end. Rollouts of one prompt share the keys (a GRPO group)."""
    rows = n_prompts * per_prompt
    device = next(policy.parameters()).device
    keys = torch.randint(2, VOCAB, (n_prompts, TURNS), generator=gen).repeat_interleave(per_prompt, 0)
    ids = torch.full((rows, 1), BOS)
    mask = torch.zeros(rows, 1, dtype=torch.bool)
    log_probs = torch.zeros(rows, 1)
    hits = torch.zeros(rows)
    for turn in range(TURNS):
        observation = torch.stack([torch.full((rows,), SEP), keys[:, turn]], 1)
        ids = torch.cat([ids, observation], 1)
        mask = torch.cat([mask, torch.zeros(rows, 2, dtype=torch.bool)], 1)
        log_probs = torch.cat([log_probs, torch.zeros(rows, 2)], 1)
        for _ in range(TOKENS_PER_TURN):
            logits = policy(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device))[:, -1]
            logp = torch.log_softmax(logits.float().cpu(), -1)
            token = torch.multinomial(logp.exp(), 1, generator=gen)
            ids = torch.cat([ids, token], 1)
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.bool)], 1)
            log_probs = torch.cat([log_probs, logp.gather(1, token)], 1)
            hits += (token[:, 0] == keys[:, turn]).float()
    length = ids.shape[1]
    return RolloutBatch(
        token_ids=ids.reshape(-1),
        mask=mask.reshape(-1),
        offsets=np.arange(rows + 1) * length,
        old_log_probs=log_probs.reshape(-1),
        scores=hits / (TURNS * TOKENS_PER_TURN),
        group_ids=np.repeat(np.arange(n_prompts), per_prompt),
    )


def make_learner(estimator: str | Estimator = "mae", seed: int = 0, **config) -> Learner:
    torch.manual_seed(seed)
    policy = TinyCausalLM()
    family = (estimator if isinstance(estimator, Estimator) else Estimator(estimator)).family
    critic = None if family == "group" else TinyCausalLM(out_features=1)
    config = {"ppo_epochs": 2, "minibatch_size": 32, "seed": seed} | config
    return Learner(
        policy,
        torch.optim.Adam(policy.parameters(), lr=3e-3),
        LearnerConfig(estimator=estimator, **config),
        critic=critic,
        critic_optimizer=None if critic is None else torch.optim.Adam(critic.parameters(), lr=3e-3),
    )


def ragged_batch(seed: int = 0) -> RolloutBatch:
    """Trajectories of different lengths and turn structures, token-level rewards."""
    rng = np.random.default_rng(seed)
    masks = []
    for _ in range(7):
        mask = [False] * int(rng.integers(1, 4))
        for _ in range(int(rng.integers(1, 4))):
            mask += [True] * int(rng.integers(1, 5)) + [False] * int(rng.integers(0, 3))
        masks.append(mask)
    mask = np.concatenate(masks)
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in masks])])
    rewards = np.where(mask, rng.standard_normal(mask.size), 0.0).astype(np.float32)
    return RolloutBatch(
        token_ids=rng.integers(0, VOCAB, mask.size),
        mask=mask,
        offsets=offsets,
        old_log_probs=np.where(mask, -rng.random(mask.size) * 2, 0.0),
        rewards=rewards,
        group_ids=np.array([0, 0, 0, 1, 1, 2, 2]),
    )


def _host_learner(config: LearnerConfig) -> Learner:
    module = nn.Linear(1, 1)
    return Learner(module, torch.optim.SGD(module.parameters(), lr=0.1), config)


# --------------------------------------------------------------------------- learning


@pytest.mark.parametrize(
    ("estimator", "config"),
    [
        ("mae", {}),  # MPO: MAE + turn IS
        ("gae", {"ratio": "token"}),  # PPO
        ("grpo", {"ratio": "token", "agg": "seq-mean-token-mean"}),  # GRPO
    ],
)
def test_mean_reward_rises_on_the_echo_task(one_thread, estimator, config):
    learner = make_learner(estimator, seed=0, **config)
    gen = torch.Generator().manual_seed(1)
    rewards = []
    for _ in range(40):
        metrics = learner.step(echo_rollout(learner.policy, n_prompts=16, per_prompt=4, gen=gen))
        rewards.append(metrics["batch/score_mean"])
        assert all(np.isfinite(v) for v in metrics.values()), metrics
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    # A random policy echoes the key with probability 1/8; every seed tried reaches > 0.6.
    assert first < 0.2
    assert last > first + 0.3, rewards


def test_first_minibatch_ratio_is_one_with_sampler_log_probs(one_thread):
    """The learner scores token q with the output at q-1, as the sampler did: before any
    update every ratio is 1 and no clip is active."""
    learner = make_learner("mae", ppo_epochs=1, minibatch_size=64)
    batch = echo_rollout(learner.policy, 8, 8, torch.Generator().manual_seed(3))
    metrics = learner.step(batch)
    assert metrics["actor/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/clip_frac"] == 0.0
    assert metrics["batch/num_turns"] == 64 * TURNS
    assert metrics["batch/num_policy_tokens"] == 64 * TURNS * TOKENS_PER_TURN


def test_recomputed_old_log_probs_match_the_sampler(one_thread):
    learner = make_learner("grpo")
    batch = echo_rollout(learner.policy, 4, 4, torch.Generator().manual_seed(5))
    recomputed = copy.copy(batch)
    recomputed.old_log_probs = None
    values, log_probs = learner._fill_in(recomputed)
    assert values is None
    np.testing.assert_allclose(log_probs[batch.mask], batch.old_log_probs[batch.mask], atol=1e-5)


def test_advantages_come_from_the_rust_estimator(one_thread):
    learner = make_learner(Estimator("mae", lam=0.9, beta=0.5))
    batch = echo_rollout(learner.policy, 2, 4, torch.Generator().manual_seed(2))
    values, _ = learner._fill_in(batch)
    advantages, returns = learner.compute_advantages(batch, values)
    expected = mae_advantages(values, batch.mask, batch.offsets, scores=batch.scores, lam=0.9, beta=0.5)
    np.testing.assert_array_equal(advantages, expected.advantages)
    np.testing.assert_array_equal(returns, expected.returns)


# --------------------------------------------------------------------------- experiment metrics


def test_explained_variance_is_nan_when_the_returns_do_not_vary(one_thread):
    learner = make_learner("mae", ppo_epochs=1)
    batch = echo_rollout(learner.policy, 4, 4, torch.Generator().manual_seed(0))
    batch.scores = np.ones(batch.n_trajectories, np.float32)  # every return is 1
    metrics = learner.step(batch)
    assert np.isnan(metrics["critic/explained_variance"])
    assert all(np.isfinite(v) for k, v in metrics.items() if k != "critic/explained_variance"), metrics
    batch.scores = np.linspace(0, 1, batch.n_trajectories, dtype=np.float32)
    assert np.isfinite(learner.step(batch)["critic/explained_variance"])


def test_explained_variance_formula():
    g = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    assert explained_variance(g, g) == 1.0
    assert explained_variance(np.full(4, g.mean(), np.float32), g) == pytest.approx(0.0)
    v = np.array([0.5, 0.5, 2.5, 2.0], np.float32)
    assert explained_variance(v, g) == pytest.approx(1 - np.var(g - v) / np.var(g))
    assert np.isnan(explained_variance(np.zeros(3, np.float32), np.full(3, 0.7, np.float32)))
    assert np.isnan(explained_variance(np.zeros(0, np.float32), np.zeros(0, np.float32)))


def hand_entropy(policy: nn.Module, batch: RolloutBatch, temperature: float) -> list[np.ndarray]:
    """Per trajectory, the entropy of pi(. | tokens < q) at each policy token q."""
    out = []
    with torch.no_grad():
        for j in range(batch.n_trajectories):
            span = slice(batch.offsets[j], batch.offsets[j + 1])
            ids = torch.from_numpy(batch.token_ids[span])[None]
            probs = torch.softmax(policy(input_ids=ids, attention_mask=torch.ones_like(ids))[0] / temperature, -1)
            entropy = -(probs * probs.log()).sum(-1).numpy()  # position q-1 scores token q
            out.append(entropy[:-1][batch.mask[span][1:]])
    return out


@pytest.mark.parametrize("agg", losses.AGGREGATIONS)
def test_entropy_metric_equals_a_hand_computation(one_thread, agg):
    batch = ragged_batch(3)
    torch.manual_seed(0)
    policy = TinyCausalLM()
    cfg = LearnerConfig(estimator="grpo", agg=agg, temperature=0.7, minibatch_size=7, micro_batch_size=3)
    metrics = Learner(policy, torch.optim.SGD(policy.parameters(), lr=0.0), cfg).step(batch)
    per_seq = hand_entropy(policy, batch, 0.7)
    if agg == "token-mean":
        expected = np.concatenate(per_seq).mean()
    elif agg == "seq-mean-token-mean":
        expected = np.mean([e.mean() for e in per_seq])
    else:
        expected = np.mean([e.sum() for e in per_seq])
    assert metrics["actor/entropy"] == pytest.approx(expected, rel=1e-5)


def test_token_log_probs_and_entropy_agree_with_token_log_probs():
    torch.manual_seed(0)
    policy = TinyCausalLM()
    ids = torch.randint(0, VOCAB, (3, 6))
    attention = torch.ones_like(ids)
    lp, entropy = token_log_probs_and_entropy(policy, ids, attention, temperature=1.3)
    torch.testing.assert_close(lp, token_log_probs(policy, ids, attention, temperature=1.3), rtol=0, atol=0)
    probs = torch.softmax(policy(input_ids=ids, attention_mask=attention)[:, :-1] / 1.3, -1)
    torch.testing.assert_close(entropy[:, 1:], -(probs * probs.log()).sum(-1))
    assert torch.all(entropy[:, 0] == 0) and entropy.requires_grad
    assert not token_log_probs_and_entropy(policy, ids, attention, entropy_grad=False)[1].requires_grad


def test_entropy_bonus_is_the_gradient_of_the_entropy(one_thread):
    """With zero advantages (every score equal under GRPO) the surrogate has no gradient:
    one SGD step with lr=1 moves the policy by exactly coef * grad(mean entropy)."""
    torch.manual_seed(0)
    policy = TinyCausalLM()
    batch = echo_rollout(policy, 2, 4, torch.Generator().manual_seed(4))
    batch.scores = np.ones(batch.n_trajectories, np.float32)
    reference = copy.deepcopy(policy)
    ids = torch.from_numpy(batch.token_ids.reshape(batch.n_trajectories, -1))
    mask = torch.from_numpy(batch.mask.reshape(ids.shape))
    _, entropy = token_log_probs_and_entropy(reference, ids, torch.ones_like(ids))
    (0.1 * losses.aggregate(entropy, mask)).backward()
    cfg = LearnerConfig(estimator="grpo", entropy_coef=0.1, minibatch_size=8, max_grad_norm=None, shuffle=False)
    metrics = Learner(policy, torch.optim.SGD(policy.parameters(), lr=1.0), cfg).step(batch)
    assert metrics["advantages/abs_max"] == 0.0
    assert metrics["actor/loss"] == pytest.approx(-0.1 * metrics["actor/entropy"], rel=1e-5)
    for moved, before in zip(policy.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(moved.detach() - before.detach(), before.grad, rtol=1e-4, atol=1e-6)


def test_entropy_bonus_raises_the_entropy(one_thread):
    gen = torch.Generator().manual_seed(6)
    entropies = {}
    for coef in (0.0, 0.05):
        learner = make_learner("grpo", entropy_coef=coef, ppo_epochs=1)
        batch = echo_rollout(learner.policy, 4, 4, gen)
        batch.scores = np.ones(batch.n_trajectories, np.float32)  # no policy gradient
        entropies[coef] = [learner.step(batch)["actor/entropy"] for _ in range(5)]
    assert entropies[0.0][-1] == pytest.approx(entropies[0.0][0], abs=1e-6)
    assert entropies[0.05][-1] > entropies[0.05][0] + 1e-3


@pytest.mark.parametrize(("estimator", "ratio"), [("mae", "turn"), ("gae", "token"), ("grpo", "token")])
def test_the_policy_loss_gets_the_natural_ratio(one_thread, monkeypatch, estimator, ratio):
    seen = []
    original = learner_module.policy_loss

    def spy(*args, **kwargs):
        seen.append(kwargs["ratio"])
        return original(*args, **kwargs)

    monkeypatch.setattr(learner_module, "policy_loss", spy)
    learner = make_learner(estimator, ppo_epochs=1)
    learner.step(echo_rollout(learner.policy, 2, 4, torch.Generator().manual_seed(0)))
    learner.config.ratio = "sequence"
    learner.step(echo_rollout(learner.policy, 2, 4, torch.Generator().manual_seed(0)))
    assert seen == [ratio, "sequence"]


def test_grpo_with_a_critic_trains_it_on_monte_carlo_returns(one_thread):
    torch.manual_seed(0)
    policy, critic = TinyCausalLM(), TinyCausalLM(out_features=1)
    learner = Learner(
        policy, torch.optim.Adam(policy.parameters(), lr=1e-3), LearnerConfig(estimator="grpo", minibatch_size=16),
        critic=critic, critic_optimizer=torch.optim.Adam(critic.parameters(), lr=1e-2),
    )  # fmt: skip
    batch = echo_rollout(policy, 4, 4, torch.Generator().manual_seed(7))
    values, _ = learner._fill_in(batch)
    advantages, returns = learner.compute_advantages(batch, values)
    critic_free, no_returns = learner.compute_advantages(batch, None)
    np.testing.assert_array_equal(advantages, critic_free)  # the critic never touches them
    assert no_returns is None
    expected_returns = np.repeat(batch.scores, batch.lengths)  # gamma = 1: the score
    np.testing.assert_array_equal(returns[batch.mask], expected_returns[batch.mask])
    first = [p.detach().clone() for p in critic.parameters()]
    history = [learner.step(batch) for _ in range(30)]
    assert all("critic/loss" in m and "critic/grad_norm" in m for m in history)
    assert any(not torch.equal(a, b) for a, b in zip(first, critic.parameters(), strict=True))
    assert history[-1]["critic/loss"] < history[0]["critic/loss"] / 4
    assert history[-1]["critic/explained_variance"] > max(0.5, history[0]["critic/explained_variance"])


# --------------------------------------------------------------------------- critic epochs


def _two_steps(batches: list[RolloutBatch], **config) -> tuple[Learner, list[dict[str, float]]]:
    learner = make_learner("mae", seed=4, minibatch_size=8, micro_batch_size=3, **config)
    metrics = [learner.step(copy.deepcopy(b)) for b in batches]
    return learner, [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in metrics]


def _echo_batches(n: int = 2) -> list[RolloutBatch]:
    torch.manual_seed(11)
    policy, gen = TinyCausalLM(), torch.Generator().manual_seed(12)
    return [echo_rollout(policy, 4, 4, gen) for _ in range(n)]


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_critic_epochs_unset_or_equal_to_ppo_epochs_train_as_before(one_thread, ppo_epochs):
    """Issue 20: critic_epochs=None (the default) is ppo_epochs, and then the step is the
    joint loop of before: same parameters and metrics over two seeded steps."""
    batches = _echo_batches()
    default, default_metrics = _two_steps(batches, ppo_epochs=ppo_epochs)
    explicit, explicit_metrics = _two_steps(batches, ppo_epochs=ppo_epochs, critic_epochs=ppo_epochs)
    assert LearnerConfig(ppo_epochs=ppo_epochs).critic_passes == ppo_epochs
    assert default_metrics == explicit_metrics
    assert all(m["critic/epochs"] == float(ppo_epochs) for m in default_metrics)
    assert _same_parameters(default.policy, explicit.policy)
    assert _same_parameters(default.critic, explicit.critic)


@pytest.mark.parametrize("ppo_epochs", [1, 3])
def test_critic_epochs_give_k_critic_updates_per_actor_update(one_thread, monkeypatch, ppo_epochs):
    """Issue 20 (slime #2329): 16 trajectories in minibatches of 8 are 2 optimizer steps a
    pass; the critic makes critic_epochs passes, the actor ppo_epochs."""
    calls = {"actor": 0, "critic": 0}
    learner = make_learner("mae", seed=4, minibatch_size=8, ppo_epochs=ppo_epochs, critic_epochs=2)
    for name, optimizer in (("actor", learner.policy_optimizer), ("critic", learner.critic_optimizer)):
        step = optimizer.step

        def counted(*args, _name=name, _step=step, **kwargs):
            calls[_name] += 1
            return _step(*args, **kwargs)

        monkeypatch.setattr(optimizer, "step", counted)
    metrics = learner.step(_echo_batches(1)[0])
    assert calls == {"actor": 2 * ppo_epochs, "critic": 2 * 2}
    assert metrics["critic/epochs"] == 2.0
    assert all(math.isfinite(metrics[k]) for k in ("critic/loss", "critic/grad_norm", "actor/loss", "actor/grad_norm"))


def test_critic_epochs_do_not_change_the_actors_update(one_thread):
    """Issue 20: advantages are computed once, before the updates, and the critic's extra
    passes shuffle with a generator of their own: the actor ends a step the same for any
    critic_epochs, and over several steps too when the batch brings its values (the critic
    then only trains). The critic itself does train more."""
    batches = _echo_batches()
    one, _ = _two_steps(batches[:1], critic_epochs=1)
    three, metrics = _two_steps(batches[:1], critic_epochs=3)
    assert _same_parameters(one.policy, three.policy)
    assert not _same_parameters(one.critic, three.critic)
    assert metrics[0]["critic/epochs"] == 3.0
    rng = np.random.default_rng(5)
    for batch in batches:
        batch.values = rng.standard_normal(batch.mask.size).astype(np.float32)
    runs = {k: _two_steps(batches, ppo_epochs=2, critic_epochs=k) for k in (1, 2, 4)}
    for k in (1, 4):
        assert _same_parameters(runs[k][0].policy, runs[2][0].policy)
        assert not _same_parameters(runs[k][0].critic, runs[2][0].critic)
        actor = [{n: v for n, v in m.items() if n.startswith("actor/")} for m in runs[k][1]]
        assert actor == [{n: v for n, v in m.items() if n.startswith("actor/")} for m in runs[2][1]]


def test_critic_epochs_without_a_critic_are_refused(one_thread):
    """critic_epochs on a learner without a critic would change nothing (GRPO then trains
    the policy alone): it is refused when the learner is built, as an option that does
    nothing is (tests/test_input_rules.py); unset, the learner trains as before."""
    with pytest.raises(InvalidOptionError, match=r"critic_epochs=3 .* no critic"):
        make_learner("grpo", seed=4, critic_epochs=3)
    assert "critic/epochs" not in make_learner("grpo", seed=4).step(_echo_batches(1)[0])


@pytest.mark.parametrize("estimator", ["mae", "grpo"])
def test_whitening_scales_the_advantages_over_the_policy_tokens(one_thread, estimator):
    batch = echo_rollout(make_learner().policy, 4, 4, torch.Generator().manual_seed(8))
    metrics = {}
    for scale in ("none", "whiten"):
        learner = make_learner(estimator, advantage_scale=scale, ppo_epochs=1)
        values, _ = learner._fill_in(batch)
        advantages, _ = learner.compute_advantages(batch, values)
        metrics[scale] = learner.step(batch)
        adv = advantages[batch.mask]
        assert metrics[scale]["advantages/mean"] == pytest.approx(adv.mean(), abs=1e-6)
        assert metrics[scale]["advantages/std"] == pytest.approx(adv.std(), rel=1e-5)
        assert metrics[scale]["advantages/abs_max"] == pytest.approx(np.abs(adv).max(), rel=1e-6)
        if scale == "whiten":
            raw, _ = make_learner(estimator).compute_advantages(batch, values)
            expected = whiten(torch.from_numpy(raw), torch.from_numpy(batch.mask)).numpy()
            np.testing.assert_array_equal(advantages, expected)
    n = int(batch.mask.sum())
    assert metrics["whiten"]["advantages/mean"] == pytest.approx(0.0, abs=1e-6)
    # Unbiased variance in the whitening: the population std of the result is sqrt((n-1)/n).
    assert metrics["whiten"]["advantages/std"] == pytest.approx(np.sqrt((n - 1) / n), rel=1e-4)
    assert metrics["none"]["advantages/std"] != pytest.approx(metrics["whiten"]["advantages/std"], rel=1e-2)


def test_timing_splits_the_step(one_thread):
    learner = make_learner("mae", ppo_epochs=2, minibatch_size=8)
    metrics = learner.step(echo_rollout(learner.policy, 4, 4, torch.Generator().manual_seed(9)))
    phases = [metrics[f"timing/{p}_s"] for p in ("estimation", "forward", "backward", "optimizer")]
    assert all(t > 0 for t in phases), metrics
    assert sum(phases) <= metrics["timing/step_s"]


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bf16", [False, True])
def test_learner_step_on_cuda(bf16):
    learner = make_learner("mae", bf16=bf16, device="cuda")
    assert all(p.is_cuda for p in learner.policy.parameters())
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        metrics = learner.step(echo_rollout(learner.policy, 8, 4, gen))
    assert np.isfinite(metrics["actor/loss"]) and np.isfinite(metrics["critic/loss"])
