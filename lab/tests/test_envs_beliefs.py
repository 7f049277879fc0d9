"""The premise tasks' oracles and belief models (mpo_lab.envs.beliefs): each oracle's success
equals its exact value, the model's oracle is the env's on noisy histories, chance and the
exact values agree with Monte Carlo, and the prefix values are consistent."""

from __future__ import annotations

import numpy as np
import pytest
from test_envs_premise import NEW, _close, _oracle

from mpo_lab.envs import (
    FrozenLake,
    KeyDoor,
    MultiHop,
    Search,
    Sokoban,
    make,
    run_episode,
)
from mpo_lab.envs.premise import (
    NoisyOracle,
    belief_model,
    exact_success,
    play,
)

# ---------------------------------------------------------------- oracles, chance, exact values


@pytest.mark.parametrize("name", NEW)
def test_oracle_success_matches_its_exact_value(name):
    env = make(name)
    seeds = range(300)
    scores = [run_episode(env, _oracle(env), s).score for s in seeds]
    exact = exact_success(env, 0.0, seeds)
    # The exact value is the expectation over what the seed hides; the episodes draw it.
    assert _close(sum(scores), len(scores), exact), (sum(scores), exact)
    if name == "multi_hop":
        assert exact == pytest.approx(0.5)  # P(at most 2 dead ends of 5)


def test_saturating_demonstrator_is_the_model_oracle_and_fails_where_the_sum_wraps():
    """The belief model's oracle is the demonstrator's (``env.demonstrated_key``), and its
    exact value at eps 0 is 1 where the pair does not wrap and 0 where it does."""
    env = make("key_door", key_rule="sum", num_keys=4, vocab_size=10, demonstrator="saturate", max_turns=3)
    values = NoisyOracle(belief_model(env), 0.0)
    seen = set()
    for seed in range(60):
        first = env.reset(seed)
        b = values.model.initial(first)
        wraps = (first[1] - 4) + (first[2] - 4) >= 4  # key ids start at 4
        assert values.model.oracle(b)[env.key_position] == env.demonstrated_key(first)
        assert values.value(b) == (0.0 if wraps else 1.0)
        seen.add(wraps)
    assert seen == {False, True}


def test_model_oracle_is_the_env_oracle_on_noisy_histories():
    rng = np.random.default_rng(3)
    for name, params in [(n, {}) for n in (*NEW, "key_door")] + [
        ("multi_hop", {"hop_choices": [2, 5]}),
        ("key_door", {"key_rule": "sum", "num_keys": 8, "vocab_size": 24}),
    ]:
        env = make(name, **params)
        values = NoisyOracle(belief_model(env), 0.5)
        for seed in range(40):
            observations = [env.reset(seed)]
            b = values.model.initial(observations[0])
            for _ in range(env.max_turns):
                assert list(values.model.oracle(b)) == env.oracle_action(observations), (name, seed, observations)
                action = values.act(b, rng)
                observation, _, done = env.step(list(action))
                if done:
                    break
                observations.append(observation)
                b = values.model.update(b, action, observation)


@pytest.mark.parametrize(
    "env",
    [
        Search(num_topics=1, num_answers=2, max_turns=8),
        MultiHop(hops=1, num_entities=3, num_answers=2, max_turns=8),
        FrozenLake(size=2, frozen_prob=1.0, max_turns=8),
        Sokoban(size=5, max_turns=40, search_depth=1),  # one-move rooms with a long budget
        KeyDoor(max_turns=2, action_tokens=1, num_keys=3, vocab_size=8, key_rule="sum"),
    ],
    ids=repr,
)
def test_chance_success_matches_monte_carlo(env):
    """On small vocabularies, where random tokens succeed often enough to count."""
    rng = np.random.default_rng(11)
    episodes = 10000
    successes = 0.0
    for seed in range(episodes):
        env.reset(seed)
        done = False
        while not done:
            _, reward, done = env.step(rng.integers(env.vocab_size, size=env.action_tokens))
        successes += reward
    p = env.chance_success()
    assert p > 0.002
    assert _close(successes, episodes, p), (successes, episodes * p)
    # The formula against the dynamic programme of the belief model (Sokoban's per room: test_sokoban.py).
    if not isinstance(env, (FrozenLake, Sokoban)):
        assert exact_success(env, 1.0, range(5), well_formed=0.0) == pytest.approx(p, rel=1e-9)


def test_default_chance_formulas_match_the_dynamic_programme():
    for name in ("search", "multi_hop"):
        env = make(name)
        assert exact_success(env, 1.0, range(3), well_formed=0.0) == pytest.approx(env.chance_success(), rel=1e-9)
    assert 0 < make("frozen_lake").chance_success() < 0.01


@pytest.mark.parametrize(
    ("name", "eps", "params"),
    [
        ("frozen_lake", 0.5, {}),
        ("search", 0.21, {}),
        ("multi_hop", 0.18, {}),
        ("search", 0.2, {"hit_probs": [0.05, 0.9]}),
        ("search", 0.4, {"hit_probs": [0.05, 0.9]}),
        ("search", 0.3, {"hit_probs": [0.05, 0.9], "think_tokens": 2}),
        ("multi_hop", 0.2, {"hop_choices": [2, 5]}),
        ("frozen_lake", 0.4, {"success_rate": 0.8}),
        ("sokoban", 0.3, {}),
        ("sokoban", 0.5, {"num_boxes": 2, "size": 5}),
        ("coin_collector", 0.3, {}),
        ("coin_collector", 0.5, {"distractors": 2, "quest_length": 4, "max_turns": 12}),
        ("coin_collector", 0.3, {"length_choices": [2, 6], "max_turns": 10}),
        ("key_door", 0.5, {"key_rule": "sum", "max_turns": 2, "num_keys": 8, "vocab_size": 24}),
        ("key_door", 0.3, {"key_rule": "sum", "num_keys": 4, "vocab_size": 10, "demonstrator": "saturate"}),
    ],
)
def test_exact_values_match_monte_carlo(name, eps, params):
    """The belief model's exact success of the noisy oracle against episodes of the real env,
    one per seed (a seed fixes the map, the answer and every later draw, so the exact value is
    an expectation over seeds); on FrozenLake this is the dynamic programme over (cell, turn) of
    each map; on Search with a spread of difficulty, over the levels too."""
    env = make(name, **params)
    values = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(5)
    seeds = range(1000)
    exact = float(np.mean([values.value(values.model.initial(env.reset(s))) for s in seeds]))
    successes = sum(play(env, values, s, rng) for s in seeds)
    assert _close(successes, len(seeds), exact), (successes / len(seeds), exact)


def test_prefix_values_are_consistent():
    """The value before a turn is the policy-weighted mean of the values after its first token."""
    for name in (*NEW, "key_door", "guess_number"):
        env = make(name)
        values = NoisyOracle(belief_model(env), 0.3)
        m = values.model
        b = m.initial(env.reset(1))
        w = 0.0 if m.W is None else 0.5
        total = 0.0
        for token in range(m.V):
            p = (1 - 0.3) * (m.oracle(b)[0] == token) + 0.3 * (1 - w) / m.V
            if m.W is not None:
                p += 0.3 * w * sum(a[0] == token for a in m.W) / len(m.W)
            total += p * values.prefix_value(b, (token,))
        assert total == pytest.approx(values.value(b), abs=1e-12), name
