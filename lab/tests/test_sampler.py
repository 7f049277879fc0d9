"""mpo_lab.train.sampler, models and critic: batched multi-turn rollouts of tiny causal LMs in
toy token environments defined here (the protocol of mpo_lab.train.sampler)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from mpo_lab.train.models import TinyCausalLM, tiny_hf_model  # noqa: E402
from mpo_lab.train.sampler import sample  # noqa: E402
from mpo_rs import InvalidConfigError, InvalidOptionError, InvalidRolloutError, estimators  # noqa: E402
from mpo_rs.torch.critic import value_head_critic  # noqa: E402
from mpo_rs.torch.learner import Learner, LearnerConfig, token_log_probs, token_values  # noqa: E402

VOCAB, BOS, SEP, STOP = 12, 0, 1, 2  # keys are 5..11; 3 and 4 are free for the toy LMs


class EchoEnv:
    """Each turn shows [SEP] * (turn % 3) + [key]; reward 1 per turn whose first action token
    is the key. The episode lasts 1 + seed % 3 turns, so episodes finish at different
    turns; it records what it showed and received, and refuses a step after done."""

    vocab_size, action_tokens, max_turns = VOCAB, 3, 5

    def reset(self, seed: int) -> list[int]:
        self.rng = np.random.default_rng(seed)
        self.n_turns = 1 + seed % 3
        self.key = int(self.rng.integers(5, VOCAB))
        self.actions: list[list[int]] = []
        self.observations: list[list[int]] = []
        self.done = False
        self.prompt = [BOS] + [SEP] * (seed % 2) + [self.key]
        return self.prompt

    def step(self, action: list[int]) -> tuple[list[int], float, bool]:
        assert not self.done, "step() after done"
        assert all(isinstance(t, int) for t in action)
        self.actions.append(action)
        reward = float(bool(action) and action[0] == self.key)
        turn = len(self.actions)
        self.key = int(self.rng.integers(5, VOCAB))
        observation = [SEP] * (turn % 3) + [self.key]
        self.observations.append(observation)
        self.done = turn >= self.n_turns
        return observation, reward, self.done


class NextTokenLM(nn.Module):
    """Deterministic toy LM: after token x it puts (almost) all mass on rule(x). Optionally
    takes a fake KV cache, so both layouts of the sampler can be hand-checked."""

    def __init__(self, rule: dict[int, int], default: int, cache: bool) -> None:
        super().__init__()
        table = torch.full((VOCAB,), default)
        for x, y in rule.items():
            table[x] = y
        self.register_buffer("table", table)
        self.cache = cache
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, **kwargs):
        logits = nn.functional.one_hot(self.table[input_ids], VOCAB).float() * 60.0
        if not self.cache:
            return logits
        past = kwargs.get("past_key_values") or 0
        return SimpleNamespace(logits=logits, past_key_values=past + 1 if kwargs.get("use_cache") else None)


class FixedLogits(nn.Module):
    """The same next-token distribution everywhere (a plain module: no cache)."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))

    def forward(self, input_ids, attention_mask):
        return self.logits.expand(*input_ids.shape, -1)


def make_policy(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "tiny":
        return TinyCausalLM(VOCAB, width=32)
    return tiny_hf_model(VOCAB, kind=kind, width=32)


def recomputed_log_probs(policy: nn.Module, batch, temperature: float) -> np.ndarray:
    """The learner's scoring of the flat batch: right-padded rows, token_log_probs."""
    width = int(batch.lengths.max())
    ids = torch.zeros(batch.n_trajectories, width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for j in range(batch.n_trajectories):
        tokens = batch.token_ids[batch.offsets[j] : batch.offsets[j + 1]]
        ids[j, : tokens.size], attention[j, : tokens.size] = torch.from_numpy(tokens), 1
    with torch.no_grad():
        lp = token_log_probs(policy, ids.to(policy_device(policy)), attention.to(policy_device(policy)), temperature)
    lp = lp.cpu().numpy()
    return np.concatenate([lp[j, : batch.lengths[j]] for j in range(batch.n_trajectories)])


def policy_device(policy: nn.Module) -> torch.device:
    return next(policy.parameters()).device


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# --------------------------------------------------------------------------- hand-checked


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_hand_checked_episode(use_cache):
    """After 3 the model says STOP, after anything else 3: each turn is [3, STOP], the env
    gets [3]; the observation that comes with done is not appended."""
    env = EchoEnv()
    policy = NextTokenLM({3: STOP}, default=3, cache=use_cache)
    out = sample(policy, [env], [2], stop_token=STOP, use_cache=use_cache)  # seed 2: 3 turns
    assert out.stats.used_cache is use_cache
    assert env.actions == [[3], [3], [3]]
    o1, o2 = env.observations[:2]
    assert o1[:-1] == [SEP] and o2[:-1] == [SEP, SEP]
    expected = [*env.prompt, 3, STOP, *o1, 3, STOP, *o2, 3, STOP]
    mask = [False] * len(env.prompt) + [True, True, False, False, True, True, False, False, False, True, True]
    batch = out.batch
    np.testing.assert_array_equal(batch.token_ids, expected)
    np.testing.assert_array_equal(batch.mask, mask)
    np.testing.assert_array_equal(batch.offsets, [0, len(expected)])
    np.testing.assert_allclose(batch.old_log_probs[batch.mask], 0.0, atol=1e-6)
    assert np.all(batch.old_log_probs[~batch.mask] == 0)
    assert out.stats.turns.tolist() == [3] and out.stats.response_tokens.tolist() == [6]
    assert estimators.segment_turns(batch.mask, batch.offsets).n_turns == 3


@pytest.mark.parametrize("use_cache", [True, False])
def test_without_a_stop_token_each_turn_is_k_tokens(use_cache):
    env = EchoEnv()
    policy = NextTokenLM({3: 4, 4: STOP}, default=3, cache=use_cache)
    out = sample(policy, [env], [1], use_cache=use_cache)  # seed 1: 2 turns
    assert env.actions == [[3, 4, STOP], [3, 4, STOP]]  # STOP is an ordinary token here
    expected = env.prompt + [3, 4, STOP] + env.observations[0] + [3, 4, STOP]
    np.testing.assert_array_equal(out.batch.token_ids, expected)


# --------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("kind", ["tiny", "llama", "gpt2"])
def test_recorded_log_probs_equal_the_learners_recomputation(kind, use_cache):
    policy = make_policy(kind)
    out = sample(
        policy, EchoEnv, [0, 1, 2, 5], group_size=3, temperature=0.7, stop_token=STOP,
        generator=torch.Generator().manual_seed(0), use_cache=use_cache,
    )  # fmt: skip
    assert out.stats.used_cache is use_cache
    batch = out.batch
    assert batch.mask.sum() > 30 and len(set(batch.lengths.tolist())) > 1  # ragged: holes were exercised
    recomputed = recomputed_log_probs(policy, batch, temperature=0.7)
    np.testing.assert_allclose(batch.old_log_probs[batch.mask], recomputed[batch.mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["tiny", "llama"])
def test_cache_and_recompute_give_the_same_tokens(kind):
    policy = make_policy(kind)
    runs = [
        sample(
            policy,
            EchoEnv,
            [3, 4, 7],
            group_size=4,
            stop_token=STOP,
            use_cache=use_cache,
            generator=torch.Generator().manual_seed(11),
        ).batch
        for use_cache in (True, False)
    ]
    for name in ("token_ids", "mask", "offsets", "scores", "group_ids"):
        np.testing.assert_array_equal(getattr(runs[0], name), getattr(runs[1], name), err_msg=name)
    np.testing.assert_allclose(runs[0].old_log_probs, runs[1].old_log_probs, atol=1e-5, rtol=0)


def test_the_same_generator_seed_gives_the_same_rollouts():
    policy = make_policy("tiny")
    a, b, c = (
        sample(policy, EchoEnv, [1, 2], group_size=4, generator=torch.Generator().manual_seed(s)).batch
        for s in (5, 5, 6)
    )
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    assert a.token_ids.shape != c.token_ids.shape or not np.array_equal(a.token_ids, c.token_ids)


def test_tiny_causal_lm_is_independent_of_padding():
    torch.manual_seed(0)
    model = TinyCausalLM(VOCAB, width=32)
    ids = torch.randint(0, VOCAB, (1, 6))
    plain = model(input_ids=ids).logits
    holes = torch.tensor([[1, 1, 0, 1, 0, 1, 1, 1, 0]])
    spread = torch.zeros(1, 9, dtype=torch.long)
    spread[holes.bool()] = ids[0]
    got = model(input_ids=spread, attention_mask=holes).logits[holes.bool()]
    torch.testing.assert_close(got, plain[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="max_len"):
        TinyCausalLM(VOCAB, max_len=4)(input_ids=ids)


# --------------------------------------------------------------------------- turns and episodes


@pytest.mark.parametrize("use_cache", [True, False])
def test_masks_and_turns_line_up_with_the_environment(use_cache):
    policy = make_policy("tiny")
    envs = [EchoEnv() for _ in range(12)]
    seeds = [0, 1, 2, 4]
    out = sample(policy, envs, seeds, group_size=3, stop_token=STOP, use_cache=use_cache,
                 generator=torch.Generator().manual_seed(2))  # fmt: skip
    batch, stats = out.batch, out.stats
    turns = estimators.segment_turns(batch.mask, batch.offsets)
    assert turns.n_turns == sum(len(env.actions) for env in envs)
    for b, env in enumerate(envs):
        tokens = batch.token_ids[batch.offsets[b] : batch.offsets[b + 1]]
        mask = batch.mask[batch.offsets[b] : batch.offsets[b + 1]]
        assert env.done and len(env.actions) == 1 + seeds[b // 3] % 3 == stats.turns[b]
        assert not stats.truncated[b]
        assert mask[-1], "an episode ends with the policy's last action"
        # Split into runs of policy / environment tokens and compare with what the env saw.
        edges = np.flatnonzero(np.diff(mask.astype(int))) + 1
        runs = np.split(tokens, edges)
        kinds = [bool(m[0]) for m in np.split(mask, edges)]
        assert kinds == [False, True] * len(env.actions)
        assert runs[0].tolist() == env.prompt
        for t, action in enumerate(env.actions):
            run = runs[1 + 2 * t].tolist()
            if run[-1] == STOP:
                assert run[:-1] == action and STOP not in action and len(run) <= EchoEnv.action_tokens
            else:
                assert run == action and len(run) == EchoEnv.action_tokens and STOP not in run
            if t + 1 < len(env.actions):
                assert runs[2 + 2 * t].tolist() == env.observations[t]
        assert stats.response_tokens[b] == mask.sum()
        assert stats.lengths[b] == tokens.size
        keys = [env.prompt[-1]] + [o[-1] for o in env.observations]
        expected_score = sum(float(bool(a) and a[0] == k) for a, k in zip(env.actions, keys[:-1], strict=True))
        assert batch.scores[b] == stats.scores[b] == expected_score
        assert stats.success[b] == (expected_score > 0)


def test_max_turns_cuts_episodes_off():
    envs = [EchoEnv() for _ in range(3)]
    out = sample(make_policy("tiny"), envs, [0, 1, 2], max_turns=2, generator=torch.Generator().manual_seed(0))
    assert out.stats.turns.tolist() == [1, 2, 2]
    assert out.stats.truncated.tolist() == [False, False, True]
    assert [len(e.actions) for e in envs] == [1, 2, 2]
    summary = out.stats.summary()
    assert summary["truncated_rate"] == pytest.approx(1 / 3) and summary["turns_mean"] == pytest.approx(5 / 3)
    assert summary["tokens_per_second"] > 0


def test_groups_share_their_task():
    out = sample(make_policy("tiny"), EchoEnv, [11, 12, 13], group_size=4, generator=torch.Generator().manual_seed(0))
    batch = out.batch
    np.testing.assert_array_equal(batch.group_ids, np.repeat([0, 1, 2], 4))
    prompts = [tuple(batch.token_ids[batch.offsets[b] : batch.offsets[b] + 2]) for b in range(12)]
    for g in range(3):
        assert len(set(prompts[4 * g : 4 * g + 4])) == 1
    assert len({prompts[0], prompts[4], prompts[8]}) > 1
    assert len({batch.token_ids[batch.offsets[b] : batch.offsets[b + 1]].tobytes() for b in range(4)}) > 1


# --------------------------------------------------------------------------- temperature, stop


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_log_probs_are_recorded_at_the_sampling_temperature(temperature):
    logits = [0.0, 0.0, 0.0, 2.0, 1.0, -1.0] + [-2.0] * (VOCAB - 6)
    policy = FixedLogits(logits)
    out = sample(policy, EchoEnv, list(range(40)), temperature=temperature, generator=torch.Generator().manual_seed(1))
    batch = out.batch
    expected = torch.log_softmax(torch.tensor(logits) / temperature, -1).numpy()
    np.testing.assert_allclose(batch.old_log_probs[batch.mask], expected[batch.token_ids[batch.mask]], atol=1e-6)
    share_of_best = np.mean(batch.token_ids[batch.mask] == 3)
    best = np.exp(expected[3])
    assert abs(share_of_best - best) < 4 * np.sqrt(best * (1 - best) / batch.mask.sum()) + 0.01


def test_stop_token_ends_the_turn():
    logits = [-9.0, -9.0, 0.0, 0.5, 0.5] + [-9.0] * (VOCAB - 5)  # STOP about a quarter of the time
    envs = [EchoEnv() for _ in range(30)]
    out = sample(
        FixedLogits(logits), envs, list(range(30)), stop_token=STOP, generator=torch.Generator().manual_seed(0)
    )
    lengths = []
    for env in envs:
        for action in env.actions:
            assert STOP not in action
            lengths.append(len(action))
    assert 0 in lengths and EchoEnv.action_tokens in lengths and 1 in lengths
    policy_tokens = out.batch.token_ids[out.batch.mask]
    assert (policy_tokens == STOP).sum() == sum(1 for n in lengths if n < EchoEnv.action_tokens)


# --------------------------------------------------------------------------- critic and learner


@pytest.mark.parametrize("kind", ["tiny", "llama", "gpt2"])
def test_value_head_critic_runs_through_token_values(kind):
    policy = make_policy(kind)
    before = [p.detach().clone() for p in policy.parameters()]
    critic = value_head_critic(policy)
    policy_ids = {id(p) for p in policy.parameters()}
    assert not any(id(p) in policy_ids for p in critic.parameters())
    ids = torch.randint(0, VOCAB, (3, 7))
    values = token_values(critic, ids, torch.ones_like(ids))
    assert values.shape == (3, 7) and torch.all(values == 0)
    with torch.no_grad():
        critic.get_output_embeddings().bias.fill_(0.5)
    assert torch.all(token_values(critic, ids, torch.ones_like(ids))[:, 1:] == 0.5)
    assert policy(input_ids=ids).logits.shape[-1] == VOCAB  # the policy keeps its LM head
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))


@pytest.mark.parametrize("kind", ["tiny", "llama"])
def test_the_learner_trains_on_sampled_rollouts(kind):
    policy = make_policy(kind)
    critic = value_head_critic(policy)
    learner = Learner(
        policy, torch.optim.Adam(policy.parameters(), lr=1e-3), LearnerConfig(estimator="mae", temperature=0.8,
        minibatch_size=64), critic=critic, critic_optimizer=torch.optim.Adam(critic.parameters(), lr=1e-3),
    )  # fmt: skip
    out = sample(policy, EchoEnv, [0, 1, 2, 3], group_size=4, temperature=0.8, stop_token=STOP,
                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    metrics = learner.step(out.batch)
    # The first minibatch scores the sampler's tokens with the same weights: every ratio is 1.
    assert metrics["actor/ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["actor/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert all(np.isfinite(v) for v in metrics.values()), metrics


# --------------------------------------------------------------------------- errors


class EmptyObservationEnv(EchoEnv):
    def step(self, action):
        observation, reward, done = super().step(action)
        return ([] if not done else observation), reward, done


class OutOfVocabEnv(EchoEnv):
    def reset(self, seed):
        return [0, VOCAB + 3]


def test_bad_input_is_a_clear_error():
    policy = make_policy("tiny")
    with pytest.raises(InvalidRolloutError, match="empty observation at turn 1"):
        sample(policy, EmptyObservationEnv, [2])
    with pytest.raises(InvalidRolloutError, match=r"token 15 outside the vocabulary \[0, 12\)"):
        sample(policy, OutOfVocabEnv, [0])
    with pytest.raises(InvalidConfigError, match="one per episode, 4"):
        sample(policy, [EchoEnv()], [0, 1], group_size=2)
    with pytest.raises(InvalidConfigError, match="factory"):
        sample(policy, EchoEnv(), [0])
    with pytest.raises(InvalidOptionError, match="temperature"):
        sample(policy, EchoEnv, [0], temperature=0.0)
    with pytest.raises(InvalidOptionError, match="group_size"):
        sample(policy, EchoEnv, [0], group_size=0)
    with pytest.raises(InvalidOptionError, match="seeds"):
        sample(policy, EchoEnv, [-1])
    with pytest.raises(InvalidOptionError, match="use_cache"):
        sample(policy, EchoEnv, [0], use_cache="yes")
    with pytest.raises(InvalidOptionError, match="stop_token 99"):
        sample(policy, EchoEnv, [0], stop_token=99)
    with pytest.raises(InvalidOptionError, match="use_cache=False"):
        sample(FixedLogits([0.0] * VOCAB), EchoEnv, [0], use_cache=True)
    with pytest.raises(InvalidConfigError, match="vocab_size 12, more than the policy's 8"):
        sample(TinyCausalLM(8), EchoEnv, [0])
    with pytest.raises(ValueError, match="unknown kind"):
        tiny_hf_model(VOCAB, kind="bert")
    assert sample(policy, EchoEnv, []).batch.n_trajectories == 0


def test_auto_falls_back_when_the_model_returns_no_cache():
    class NoCache(NextTokenLM):
        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
            return SimpleNamespace(logits=super().forward(input_ids, attention_mask), past_key_values=None)

    policy = NoCache({3: 4}, default=3, cache=False)
    env = EchoEnv()
    out = sample(policy, [env], [1])
    assert not out.stats.used_cache and env.actions == [[3, 4, 3], [3, 4, 3]]
    with pytest.raises(InvalidRolloutError, match="returned no past_key_values"):
        sample(policy, EchoEnv, [1], use_cache=True)


def test_tiny_hf_model_without_transformers_names_the_extra():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from mpo_lab.train.models import tiny_hf_model\n"
        "try:\n    tiny_hf_model(8)\n"
        "except ImportError as e:\n    print(type(e).__name__, e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    expected = (
        "MissingDependencyError `mpo_lab.train.models.tiny_hf_model` needs transformers: pip install 'mpo-lab[hf]'"
    )
    assert r.stdout.strip() == expected


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["tiny", "llama"])
def test_sampling_on_cuda_shares_the_cpu_code(kind):
    policy = make_policy(kind)
    runs = {}
    for device in ("cpu", "cuda"):
        for use_cache in (True, False):
            out = sample(policy, EchoEnv, [0, 1, 2, 5], group_size=4, temperature=0.7, stop_token=STOP,
                         device=device, use_cache=use_cache, generator=torch.Generator().manual_seed(0))  # fmt: skip
            runs[device, use_cache] = out.batch
        batch = runs[device, True]
        recomputed = recomputed_log_probs(policy, batch, temperature=0.7)
        np.testing.assert_allclose(batch.old_log_probs[batch.mask], recomputed[batch.mask], atol=1e-4, rtol=0)
    # One CPU generator: the same uniforms on both devices, so the same tokens unless a
    # draw falls within float error of a bucket edge.
    for use_cache in (True, False):
        np.testing.assert_array_equal(runs["cuda", use_cache].token_ids, runs["cpu", use_cache].token_ids)
