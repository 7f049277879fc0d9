"""The sampler's fast paths (issue 19, speed): TinyCausalLM's preallocated KV cache, the
one-column decoding steps, and the reproduction's critic-free arms. Each is checked against
the slow path it replaces, bitwise: the concatenating cache, the generic sampler step, and
a learner that trains a critic beside GRPO."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_sampler import recomputed_log_probs  # noqa: E402
from torch import nn  # noqa: E402

from mpo_lab.train.models import KVCache, TinyCausalLM  # noqa: E402
from mpo_lab.train.sampler import sample  # noqa: E402

VOCAB, BOS, SEP, STOP = 12, 0, 1, 2


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


class RaggedEnv:
    """Episodes of 1 + seed % 4 turns (they end early, at different turns), prompts of
    1 + seed % 3 tokens and observations of 1..3 tokens; any action length is accepted;
    reward 1 per action of more than two tokens."""

    vocab_size, action_tokens, max_turns = VOCAB, 5, 6

    def reset(self, seed: int) -> list[int]:
        self.rng = np.random.default_rng(seed)
        self.turns, self.turn = 1 + seed % 4, 0
        return [BOS] * (1 + seed % 3)

    def step(self, action: list[int]) -> tuple[list[int], float, bool]:
        self.turn += 1
        observation = [int(x) for x in self.rng.integers(3, VOCAB, int(self.rng.integers(1, 4)))]
        return [SEP, *observation[1:]], float(len(action) > 2), self.turn >= self.turns


class ConcatenatingCache(nn.Module):
    """TinyCausalLM run with autograd on, so it takes its concatenating cache path (the
    one before the preallocated KVCache); outputs detached, cache as plain tuples."""

    def __init__(self, inner: TinyCausalLM) -> None:
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self) -> nn.Embedding:
        return self.inner.embed

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        with torch.enable_grad():
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, use_cache=use_cache)  # fmt: skip
        cache = out.past_key_values
        assert cache is None or not isinstance(cache, KVCache)
        if cache is not None:
            cache = tuple((k.detach(), v.detach()) for k, v in cache)
        return SimpleNamespace(logits=out.logits.detach(), past_key_values=cache)


def model(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    return TinyCausalLM(VOCAB, width=32, layers=2, heads=2, max_len=128)


# --------------------------------------------------------------------------- the KV cache


def test_the_preallocated_cache_gives_the_concatenating_caches_logits_bitwise():
    m = model()
    ids = torch.randint(0, VOCAB, (3, 40))
    mask = (torch.rand(3, 40) < 0.8).long()
    mask[:, 0] = 1
    with torch.no_grad():
        fast = m(input_ids=ids[:, :5], attention_mask=mask[:, :5], use_cache=True)
        assert isinstance(fast.past_key_values, KVCache)
        fast_logits, fast_cache = [fast.logits], fast.past_key_values
    with torch.enable_grad():
        slow = m(input_ids=ids[:, :5], attention_mask=mask[:, :5], use_cache=True)
        slow_logits, slow_cache = [slow.logits.detach()], slow.past_key_values
    # One column at a time (decoding), then chunks (observations), past the first buffer size.
    stops = [*range(6, 20), 27, 33, 40]
    start = 5
    for stop in stops:
        kwargs = dict(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop], use_cache=True)
        with torch.no_grad():
            out = m(**kwargs, past_key_values=fast_cache)
            fast_logits.append(out.logits)
            fast_cache = out.past_key_values
        with torch.enable_grad():
            out = m(**kwargs, past_key_values=slow_cache)
            slow_logits.append(out.logits.detach())
            slow_cache = out.past_key_values
        start = stop
    for a, b in zip(fast_logits, slow_logits, strict=True):
        assert torch.equal(a, b)
    assert fast_cache.length == 40 and len(fast_cache) == 2
    for (k, v), (k2, v2) in zip(fast_cache, slow_cache, strict=True):
        assert k.shape == k2.shape == (3, 2, 40, 16)
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_a_cache_stays_valid_after_later_calls_and_can_branch():
    m = model()
    ids = torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        prefix = m(input_ids=ids[:, :4], use_cache=True).past_key_values
        keys_before = prefix[0][0].clone()
        a = m(input_ids=ids[:, 4:6], past_key_values=prefix, use_cache=True)
        # A branch from the same prefix: it must not see (or overwrite) branch a's columns.
        b = m(input_ids=ids[:, 6:8], past_key_values=prefix, use_cache=True)
        a_again = m(input_ids=ids[:, 6:8], past_key_values=a.past_key_values, use_cache=True)
        whole = m(input_ids=ids)
        branch = m(input_ids=torch.cat([ids[:, :4], ids[:, 6:8]], 1))
    assert torch.equal(prefix[0][0], keys_before) and prefix.length == 4
    torch.testing.assert_close(a_again.logits, whole.logits[:, 6:8], atol=1e-5, rtol=0)
    torch.testing.assert_close(b.logits, branch.logits[:, 4:6], atol=1e-5, rtol=0)
    # A plain tuple of pairs (a cache saved from elsewhere) is taken too.
    plain = tuple((k.clone(), v.clone()) for k, v in prefix)
    with torch.no_grad():
        c = m(input_ids=ids[:, 4:6], past_key_values=plain, use_cache=True)
    assert torch.equal(c.logits, a.logits)


def test_with_autograd_the_cache_is_concatenated_and_gradients_flow():
    m = model()
    ids = torch.randint(0, VOCAB, (2, 6))
    out = m(input_ids=ids[:, :3], use_cache=True)
    assert not isinstance(out.past_key_values, KVCache)
    more = m(input_ids=ids[:, 3:], past_key_values=out.past_key_values, use_cache=True)
    more.logits.sum().backward()
    assert m.embed.weight.grad is not None and torch.isfinite(m.embed.weight.grad).all()


# --------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize("stop_token", [None, STOP])
def test_fast_sampling_equals_the_concatenating_path_bitwise(stop_token):
    """Ragged prompts and observations, episodes that end early, with and without a stop
    token: the preallocated cache and one-column steps give the very same batch."""
    m = model(3)
    kwargs = dict(group_size=3, stop_token=stop_token, use_cache=True)
    fast = sample(m, RaggedEnv, [0, 1, 2, 5], generator=torch.Generator().manual_seed(7), **kwargs)
    slow = sample(ConcatenatingCache(m), RaggedEnv, [0, 1, 2, 5], generator=torch.Generator().manual_seed(7), **kwargs)
    assert fast.stats.used_cache and slow.stats.used_cache
    for name in ("token_ids", "mask", "offsets", "scores", "group_ids", "old_log_probs"):
        np.testing.assert_array_equal(getattr(fast.batch, name), getattr(slow.batch, name), err_msg=name)
    np.testing.assert_array_equal(fast.stats.turns, slow.stats.turns)
    assert len(set(fast.stats.turns.tolist())) > 1  # episodes ended at different turns
    if stop_token is not None:
        assert (fast.batch.token_ids[fast.batch.mask] == STOP).any()  # some turns stopped early


@pytest.mark.parametrize("stop_token", [None, STOP])
def test_fast_sampling_log_probs_equal_a_teacher_forced_recomputation(stop_token):
    m = model(4)
    batch = sample(m, RaggedEnv, range(8), group_size=2, stop_token=stop_token,
                   generator=torch.Generator().manual_seed(1)).batch  # fmt: skip
    recomputed = recomputed_log_probs(m, batch, temperature=1.0)
    np.testing.assert_allclose(batch.old_log_probs[batch.mask], recomputed[batch.mask], atol=1e-5, rtol=0)
    assert (batch.old_log_probs[~batch.mask] == 0).all()


def test_a_non_finite_log_prob_is_still_refused_in_its_turn():
    class NaNAfterPrompt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model()

        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, use_cache=use_cache)  # fmt: skip
            if past_key_values is not None:  # decoding: episode 1's logits turn NaN
                out.logits[1] = float("nan")
            return out

    env = RaggedEnv()
    with pytest.raises(FloatingPointError, match="episode 1"):
        sample(NaNAfterPrompt(), [RaggedEnv(), env], [1, 1])
    assert env.turn == 0  # refused before the environment saw the turn


# --------------------------------------------------------------------------- critic-free arms


def test_grpo_without_a_critic_updates_the_policy_as_with_one():
    """Why run.py trains no critic for GRPO/GSPO: the actor's update is bitwise the same."""
    from mpo_lab.envs import make
    from mpo_lab.reproduce import QUICK
    from mpo_lab.reproduce.run import Learner, learner_config
    from mpo_rs.torch.critic import value_head_critic

    env = lambda: make("key_door", max_turns=3, action_tokens=4)  # noqa: E731
    params = {}
    for with_critic in (True, False):
        torch.manual_seed(0)
        policy = TinyCausalLM(env().vocab_size, width=32, layers=1, heads=2, max_len=64)
        critic = value_head_critic(policy)
        for arm in ("grpo", "gspo"):
            cfg = learner_config(QUICK.arm(arm), QUICK, 0)
            extra = {}
            if with_critic:
                extra = dict(critic=critic, critic_optimizer=torch.optim.Adam(critic.parameters(), 1e-3))
            learner = Learner(policy, torch.optim.Adam(policy.parameters(), 1e-3), cfg, **extra)
            for step in range(2):
                batch = sample(policy, env, range(4 * step, 4 * step + 4), group_size=4,
                               generator=torch.Generator().manual_seed(step)).batch  # fmt: skip
                if with_critic:
                    values = np.zeros(batch.token_ids.shape[0], np.float32)
                    batch = dataclasses.replace(batch, values=values)
                learner.step(batch)
        params[with_critic] = [p.detach().clone() for p in policy.parameters()]
    for a, b in zip(params[True], params[False], strict=True):
        assert torch.equal(a, b)


def test_run_one_trains_no_critic_for_a_critic_free_arm():
    from mpo_lab.reproduce import QUICK
    from mpo_lab.reproduce.run import run_one

    config = dataclasses.replace(QUICK, budget=dataclasses.replace(QUICK.budget, updates=2, eval_every=10))
    grpo, ppo = run_one(config, "grpo", 0), run_one(config, "ppo", 0)
    assert not grpo["critic_trained"] and ppo["critic_trained"]
    assert all(np.isnan(row["explained_variance"]) and row["values_s"] < 1e-3 for row in grpo["curve"])
    assert all("critic_explained_variance" not in row for row in grpo["curve"])
    assert all("critic_explained_variance" in row for row in ppo["curve"])


def test_right_padding_takes_the_causal_kernel_with_the_same_outputs_and_gradients(monkeypatch):
    """The learner's right-padded layout skips the explicit mask; at real positions the
    logits and every parameter's gradient are bitwise those of the masked kernel."""
    from mpo_lab.train import models

    lengths = torch.tensor([30, 22, 27, 30])
    mask = (torch.arange(30)[None] < lengths[:, None]).long()
    ids = torch.randint(0, VOCAB, (4, 30)) * mask
    assert models._right_padded(mask.bool()) and not models._right_padded(torch.tensor([[1, 0, 1]]).bool())
    results = []
    for causal in (True, False):
        if not causal:
            monkeypatch.setattr(models, "_right_padded", lambda attended: False)
        m = model(5)
        logits = m(input_ids=ids, attention_mask=mask).logits
        (logits.log_softmax(-1)[..., 3] * mask).sum().backward()
        results.append((logits.detach()[mask.bool()], [p.grad.clone() for p in m.parameters()]))
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert torch.equal(a, b)
