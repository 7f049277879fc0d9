"""mpo_lab.envs: transitions and rewards of hand-checked episodes, seeded determinism, the
vector wrapper, the oracles, random-policy success against chance_success, bad input."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import numpy as np
import pytest

from mpo_lab.envs import (
    ENVIRONMENTS,
    CoinCollector,
    FrozenLake,
    GuessNumber,
    KeyDoor,
    MultiHop,
    MultiTurnEnv,
    Search,
    Sokoban,
    TokenizedTextEnv,
    VectorEnv,
    chance_success,
    make,
    render_episode,
    run_episode,
)
from mpo_rs import InvalidConfigError, InvalidRolloutError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "envs.md"

# KeyDoor ids: start 0, corridor 1, door 2, open 3, keys from 4, then noise.
START, CORRIDOR, DOOR, OPEN, KEY0 = 0, 1, 2, 3, 4


def small_key_door() -> KeyDoor:
    # vocab: start corridor door open key0 key1 noise0 noise1 noise2
    return KeyDoor(max_turns=4, action_tokens=3, num_keys=2, vocab_size=9, max_noise=2)


# ---------------------------------------------------------------- hand-checked episodes


def test_key_door_hand_checked_success():
    env = small_key_door()
    assert env.reset(1) == [START, KEY0 + 1]  # seed 1: key1 opens the door
    assert env.step([KEY0 + 1, 8, 7]) == ([CORRIDOR, 6], 0.0, False)  # takes key1 (position 0)
    assert env.step([OPEN, OPEN, OPEN]) == ([CORRIDOR, 6, 8], 0.0, False)  # distractor: nothing counts
    assert env.step([0, 0, 0]) == ([DOOR], 0.0, False)
    assert env.step([OPEN, 0, 0]) == ([], 1.0, True)


def test_key_door_hand_checked_failures():
    env = small_key_door()
    # The right key, but `open` not at position 0 of the last turn.
    env.reset(1)
    for action in ([KEY0 + 1, 0, 0], [0, 0, 0], [0, 0, 0]):
        assert env.step(action)[1:] == (0.0, False)
    assert env.step([0, OPEN, OPEN]) == ([], 0.0, True)
    # The wrong key: the last turn cannot succeed, and the episode still runs all turns.
    env.reset(1)
    observations = [env.step(action)[0] for action in ([KEY0, 0, 0], [0, 0, 0], [0, 0, 0])]
    assert observations == [[CORRIDOR, 6], [CORRIDOR, 6, 8], [DOOR]]
    assert env.step([OPEN, 0, 0]) == ([], 0.0, True)
    # Seed 2: key0, corridors of other lengths.
    assert env.reset(2) == [START, KEY0]
    assert env.step([KEY0, 0, 0])[0] == [CORRIDOR, 6, 6]
    assert env.step([0, 0, 0])[0] == [CORRIDOR, 6]


def test_key_door_positions_are_parameters():
    env = KeyDoor(max_turns=3, action_tokens=4, num_keys=2, vocab_size=7, key_position=2, open_position=3)
    key = env.reset(0)[1]
    env.step([key, key, 0, key])  # the key is not at position 2
    env.step([0, 0, 0, 0])
    assert env.step([0, 0, 0, OPEN])[1] == 0.0
    env.reset(0)
    env.step([0, 0, key, 0])
    env.step([0, 0, 0, 0])
    assert env.step([OPEN, 0, 0, OPEN]) == ([], 1.0, True)
    assert env.decisive_positions == ((0, 2), (2, 3))


def test_key_door_sum_rule_names_the_key_as_a_sum_of_two():
    """``key_rule="sum"``: the prompt shows two keys and the door opens to their sum modulo
    ``num_keys``, not to either key shown; the copy rule's episodes are unchanged."""
    env = KeyDoor(max_turns=2, action_tokens=1, num_keys=5, vocab_size=12, key_rule="sum")
    copy_rule = KeyDoor(max_turns=2, action_tokens=1, num_keys=5, vocab_size=12)
    sums = set()
    for seed in range(40):
        start, a, b = env.reset(seed)
        assert start == START and KEY0 <= a < KEY0 + 5 and KEY0 <= b < KEY0 + 5
        key = KEY0 + (a - KEY0 + b - KEY0) % 5
        assert env.door_key([start, a, b]) == key == env.oracle_action([[start, a, b]])[0]
        sums.add(key)
        for taken in range(KEY0, KEY0 + 5):
            env.reset(seed)
            env.step([taken])
            assert env.step([OPEN]) == ([], 1.0 if taken == key else 0.0, True)
        assert copy_rule.reset(seed)[1] == KEY0 + copy_rule.target_key  # the copy rule shows its key
    assert len(sums) == 5
    with pytest.raises(InvalidConfigError, match="key_rule must be one of copy, sum, got 'product'"):
        KeyDoor(key_rule="product")


def test_key_door_saturating_demonstrator_adds_without_the_wrap():
    """``demonstrator="saturate"`` changes the demonstrator's key only: below ``num_keys`` it
    is the sum (the door's key), from ``num_keys`` on the last key; the task and its optimal
    oracle are the exact rule's."""
    env = KeyDoor(max_turns=2, action_tokens=1, num_keys=5, vocab_size=12, key_rule="sum", demonstrator="saturate")
    exact = KeyDoor(max_turns=2, action_tokens=1, num_keys=5, vocab_size=12, key_rule="sum")
    for a in range(5):
        for b in range(5):
            first = [START, KEY0 + a, KEY0 + b]
            assert env.door_key(first) == exact.door_key(first) == env.oracle_action([first])[0]
            assert env.demonstrated_key(first) == KEY0 + (a + b if a + b < 5 else 4)
            assert exact.demonstrated_key(first) == exact.door_key(first)
    assert [env.reset(s) for s in range(10)] == [exact.reset(s) for s in range(10)]
    assert repr(env).endswith("key_rule='sum', demonstrator='saturate')")
    for bad in ({"demonstrator": "wrap"}, {"demonstrator": "saturate", "key_rule": "copy"}):
        with pytest.raises(InvalidConfigError, match="demonstrator must be one of exact, saturate"):
            KeyDoor(**bad)


def test_key_door_defaults_decay_token_gae_by_100x():
    env = KeyDoor()
    assert env.vocab_size <= 24 and env.max_turns * env.action_tokens >= 100
    (key_turn, key_position), _ = env.decisive_positions
    # Policy tokens from the decisive token to the last one (where the reward sits).
    distance = (env.max_turns - key_turn) * env.action_tokens - 1 - key_position
    assert 0.95**distance < 0.01
    assert env.chance_success() == pytest.approx(1 / 256)


def test_guess_number_hand_checked():
    env = GuessNumber()  # 0..15 numbers, 16 start, 17 lower, 18 higher, 19 nan
    assert env.vocab_size == 20
    assert env.reset(7) == [16]  # seed 7 hides 7
    assert env.step([3, 0]) == ([18], 0.0, False)  # higher
    assert env.step([12, 19]) == ([17], 0.0, False)  # lower
    assert env.step([19, 7]) == ([19], 0.0, False)  # not a number; position 1 does not count
    assert env.step([7, 0]) == ([], 1.0, True)  # correct at turn 4: done early
    # Budget exhausted: done at turn 6 with reward 0 and an empty observation.
    assert env.reset(0) == [16]  # seed 0 hides 15
    for _ in range(5):
        assert env.step([0, 0]) == ([18], 0.0, False)
    assert env.step([14, 0]) == ([], 0.0, True)
    assert env.reset(6) == [16]  # seed 6 hides 0: a first guess of 0 ends it at once
    assert env.step([0, 5]) == ([], 1.0, True)


def test_guess_number_oracle_is_binary_search():
    env = GuessNumber()
    episode = run_episode(env, lambda obs, acts: env.oracle_action(obs), seed=7)
    assert [a[0] for a in episode.actions] == [7]
    episode = run_episode(env, lambda obs, acts: env.oracle_action(obs), seed=0)  # hides 15
    assert [a[0] for a in episode.actions] == [7, 11, 13, 14, 15]
    assert episode.observations == [[16], [18], [18], [18], [18], []]
    assert env.oracle_turns() == 5


# ---------------------------------------------------------------- determinism


def _random_policy(env, rng):
    return lambda observations, actions: rng.integers(env.vocab_size, size=env.action_tokens).tolist()


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_same_seed_same_episode(name):
    env = make(name)
    first = run_episode(env, _random_policy(env, np.random.default_rng(5)), seed=123)
    again = run_episode(make(name), _random_policy(env, np.random.default_rng(5)), seed=123)
    assert first == again
    # The first episode's actions replayed from the same seed give the same observations.
    env.reset(123)
    assert [env.step(action)[0] for action in first.actions] == first.observations[1:]


def test_different_seeds_differ():
    key_door = KeyDoor()
    episodes = {
        tuple(map(tuple, run_episode(key_door, lambda o, a: key_door.oracle_action(o), s).observations))
        for s in range(20)
    }
    assert len(episodes) > 10
    keys = {key_door.reset(s)[1] for s in range(40)}
    assert keys == {KEY0 + k for k in range(key_door.num_keys)}
    guess = GuessNumber()
    hidden = {(guess.reset(s), guess.hidden)[1] for s in range(200)}
    assert hidden == set(range(16))


# ---------------------------------------------------------------- vector wrapper


def test_vector_env_skips_finished_envs():
    vec = VectorEnv(GuessNumber, 3)
    assert (vec.vocab_size, vec.action_tokens, vec.max_turns) == (20, 2, 6)
    # Seeds 6, 7, 0 hide 0, 7, 15.
    assert vec.reset([6, 7, 0]) == [[16], [16], [16]]
    observations, rewards, dones = vec.step([[0, 0], [3, 0], [15, 0]])
    assert observations == [[], [18], []]
    assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 0.0, 1.0]
    assert dones.dtype == np.bool_ and dones.tolist() == [True, False, True]
    observations, rewards, dones = vec.step([None, [7, 1], None])
    assert observations == [[], [], []]
    assert rewards.tolist() == [0.0, 1.0, 0.0] and dones.tolist() == [True, True, True]
    assert vec.turns.tolist() == [1, 2, 1]
    # Everything finished: a step with only Nones is a no-op.
    observations, rewards, dones = vec.step([None, None, None])
    assert observations == [[], [], []] and not rewards.any() and dones.all()


def test_vector_env_lockstep_array_ignores_finished_rows():
    vec = VectorEnv(GuessNumber, 2)
    vec.reset([6, 0])
    vec.step(np.array([[0, 0], [1, 0]]))
    observations, rewards, dones = vec.step(np.array([[99, 99], [15, 0]]))  # row 0 finished: ignored
    assert observations == [[], []] and rewards.tolist() == [0.0, 1.0] and dones.all()


def test_vector_env_groups_share_a_seed_and_key_door_runs_full_length():
    vec = VectorEnv(KeyDoor, 4)
    observations = vec.reset([9, 9, 9, 9])
    assert all(o == observations[0] for o in observations)
    env = vec.envs[0]
    for turn in range(env.max_turns):
        actions = [env.oracle_action([observations[0]] * (turn + 1)) if i % 2 == 0 else [0] * 16 for i in range(4)]
        _, rewards, dones = vec.step(actions)
        assert dones.all() == (turn == env.max_turns - 1)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]


def _states(vec: VectorEnv):
    return vec.done.tolist(), vec.turns.tolist(), [copy.deepcopy(vars(env)) for env in vec.envs]


def test_vector_env_reset_with_a_bad_seed_changes_nothing():
    """Defect 9: `reset([5, -1, 6])` mid-episode raised, but env 0 had already been reset,
    so the next step mixed a new episode with running ones. Reset is all or nothing."""
    vec = VectorEnv(GuessNumber, 3)
    vec.reset([1, 2, 3])
    vec.step([[19, 0], [19, 0], [19, 0]])  # a not-a-number guess: every episode keeps running
    before = _states(vec)
    for seeds in ([5, -1, 6], [5, 6, "7"], [5, 6, 1.5], [5, 6, None]):
        with pytest.raises(InvalidConfigError, match=r"VectorEnv env (1|2): GuessNumber.reset: seed must be"):
            vec.reset(seeds)
        assert _states(vec) == before
    with pytest.raises(InvalidConfigError, match="seeds must be a sequence"):
        vec.reset(5)
    assert _states(vec) == before
    # The running episodes go on where they were: after turn 1 of 6.
    assert vec.turns.tolist() == [1, 1, 1] and not vec.done.any()
    assert vec.step([[19, 0], [19, 0], [19, 0]])[0] == [[19], [19], [19]]
    assert vec.turns.tolist() == [2, 2, 2]


def test_vector_env_reset_failing_inside_an_env_leaves_no_episode_running():
    class Fussy(GuessNumber):
        def reset(self, seed: int) -> list[int]:
            if seed == 13:
                raise RuntimeError("unlucky seed")
            return super().reset(seed)

    vec = VectorEnv(Fussy, 2)
    vec.reset([1, 2])
    with pytest.raises(RuntimeError, match="unlucky seed") as caught:
        vec.reset([5, 13])
    assert any("VectorEnv env 1 (Fussy).reset(13)" in note for note in caught.value.__notes__)
    # Env 0 was reset already: no episode counts as running, so no step can mix them.
    assert vec.done.all() and vec.turns.tolist() == [0, 0]
    with pytest.raises(InvalidRolloutError, match="env 0 has no episode running"):
        vec.step([[0, 0], [0, 0]])
    vec.reset([5, 6])
    assert not vec.done.any()


def test_vector_env_bad_input():
    vec = VectorEnv(GuessNumber, 2)
    with pytest.raises(InvalidRolloutError, match="env 0 has no episode running"):
        vec.step([[0, 0], None])
    vec.reset([6, 0])
    with pytest.raises(InvalidRolloutError, match=r"1 actions for 2 environments"):
        vec.step([[0, 0]])
    with pytest.raises(InvalidRolloutError, match=r"env 1 is running \(turn 0\); its action is None"):
        vec.step([[1, 0], None])
    with pytest.raises(InvalidRolloutError, match=r"VectorEnv env 1 \(GuessNumber\) turn 0: .*outside \[0, 20\)"):
        vec.step([[0, 0], [20, 0]])
    # A rejected batch changed nothing: env 0 is still at turn 0 and can finish now.
    assert vec.turns.tolist() == [0, 0]
    assert vec.step([[0, 0], [15, 0]])[1].tolist() == [1.0, 1.0]
    with pytest.raises(InvalidConfigError, match="2 seeds for 3"):
        VectorEnv(GuessNumber, 3).reset([1, 2])
    with pytest.raises(
        InvalidConfigError, match=r"VectorEnv env 1: GuessNumber.reset: seed must be a non-negative int"
    ):
        VectorEnv(GuessNumber, 2).reset([1, -1])
    with pytest.raises(InvalidConfigError, match="distinct"):
        env = GuessNumber()
        VectorEnv(lambda: env, 2)
    with pytest.raises(InvalidConfigError, match=r"env 1 has \(vocab_size, action_tokens, max_turns\)"):
        VectorEnv([GuessNumber(), GuessNumber(max_turns=3)])
    with pytest.raises(InvalidConfigError, match="n must be an int >= 1"):
        VectorEnv(GuessNumber, 0)
    with pytest.raises(InvalidConfigError, match="lacks the MultiTurnEnv protocol"):
        VectorEnv([object()])


# ---------------------------------------------------------------- oracles and chance


@pytest.mark.parametrize(
    "env",
    [
        KeyDoor(),
        KeyDoor(max_turns=3, action_tokens=5, key_position=4, open_position=2),
        GuessNumber(),
        GuessNumber(num_values=100, max_turns=7),
        GuessNumber(num_values=2, max_turns=2, action_tokens=1),
    ],
    ids=repr,
)
def test_oracle_always_succeeds(env):
    scores = [run_episode(env, lambda obs, acts: env.oracle_action(obs), seed).score for seed in range(400)]
    assert scores == [1.0] * 400


@pytest.mark.parametrize(
    "env", [KeyDoor(), KeyDoor(vocab_size=10, num_keys=3, max_turns=3, action_tokens=4), GuessNumber()], ids=repr
)
def test_random_policy_success_matches_chance(env):
    rng = np.random.default_rng(2024)
    n, batches = 2000, 10
    vec = VectorEnv(lambda: type(env)(**_params(env)), n)
    successes = 0
    turns = []
    for batch in range(batches):
        vec.reset(range(batch * n, (batch + 1) * n))
        total = np.zeros(n, dtype=np.float32)
        while not vec.done.all():
            _, rewards, _ = vec.step(rng.integers(vec.vocab_size, size=(n, vec.action_tokens)))
            total += rewards
        successes += int(total.sum())
        turns.extend(vec.turns.tolist())
    p = env.chance_success()
    episodes = n * batches
    sigma = math.sqrt(episodes * p * (1 - p))
    assert abs(successes - episodes * p) < 4.5 * sigma, (successes, episodes * p, sigma)
    assert max(turns) == env.max_turns


def _params(env):
    if isinstance(env, KeyDoor):
        keys = ("max_turns", "action_tokens", "num_keys", "vocab_size", "key_position", "open_position", "max_noise")
    else:
        keys = ("num_values", "max_turns", "action_tokens")
    return {k: getattr(env, k) for k in keys}


def test_chance_success_formulas():
    assert chance_success("key_door", vocab_size=20) == pytest.approx(1 / 400)
    assert chance_success("guess_number") == pytest.approx(1 - (19 / 20) ** 6)
    assert chance_success("guess_number", num_values=6, max_turns=1) == pytest.approx(0.1)


# ---------------------------------------------------------------- bad input


class _SizedNotIterable:
    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_invalid_actions_name_env_and_turn(name):
    env = make(name)
    title = type(env).__name__
    k, v = env.action_tokens, env.vocab_size
    with pytest.raises(InvalidRolloutError, match=rf"{title} turn 0: step\(\) called with no episode running"):
        env.step([0] * k)
    env.reset(0)
    env.step([v - 1] * k)  # a wrong but valid action: turn 1 next (neither env ends here)
    cases = [
        ([0] * (k + 1), rf"{title} turn 1: action has {k + 1} tokens, expected exactly {k}"),
        ([0] * (k - 1), rf"{title} turn 1: action has {k - 1} tokens, expected exactly {k}"),
        ([v] + [0] * (k - 1), rf"{title} turn 1: token id {v} at position 0 is outside \[0, {v}\)"),
        ([0] * (k - 1) + [-1], rf"{title} turn 1: token id -1 at position {k - 1} is outside"),
        ([0.0] * k, rf"{title} turn 1: action position 0 is not an integer token id"),
        (np.zeros(k, dtype=np.float32), rf"{title} turn 1: action token ids must be integers"),
        (np.zeros((1, k), dtype=np.int64), rf"{title} turn 1: action must be 1-D"),
        ("ab", rf"{title} turn 1: action must be a sequence"),
        (7, rf"{title} turn 1: action must be a sequence"),
        (_SizedNotIterable(), rf"{title} turn 1: action must be an iterable of {k} token ids"),
    ]
    for action, message in cases:
        with pytest.raises(InvalidRolloutError, match=message):
            env.step(action)
    # Rejected actions do not advance the episode; numpy ints are accepted.
    assert env.step(np.full(k, v - 1, dtype=np.int32))[2] is False
    with pytest.raises(InvalidConfigError, match=r"seed must be a non-negative int, got -1"):
        env.reset(-1)
    with pytest.raises(InvalidConfigError, match=r"seed must be a non-negative int"):
        env.reset(1.5)


def test_step_after_done_is_refused():
    env = GuessNumber()
    env.reset(6)
    env.step([0, 0])
    with pytest.raises(InvalidRolloutError, match=r"GuessNumber turn 1: step\(\) called with no episode running"):
        env.step([0, 0])


def test_bad_parameters():
    with pytest.raises(
        InvalidConfigError,
        match=r"unknown environment 'maze'; known: coin_collector, frozen_lake, guess_number, key_door, multi_hop, search, sokoban",
    ):
        make("maze")
    with pytest.raises(InvalidConfigError, match=r"key_door: unknown parameter\(s\) horizon; accepted: max_turns"):
        make("key_door", horizon=3)
    with pytest.raises(InvalidConfigError, match=r"KeyDoor: max_turns must be an int >= 2, got 1"):
        KeyDoor(max_turns=1)
    with pytest.raises(InvalidConfigError, match=r"KeyDoor: vocab_size must be an int >= 9, got 8"):
        KeyDoor(vocab_size=8)
    with pytest.raises(InvalidConfigError, match=r"KeyDoor: open_position must be < action_tokens = 4, got 4"):
        KeyDoor(action_tokens=4, open_position=4)
    with pytest.raises(InvalidConfigError, match=r"GuessNumber: num_values must be an int >= 2, got 1.5"):
        GuessNumber(num_values=1.5)
    with pytest.raises(InvalidRolloutError, match=r"KeyDoor.oracle_action: 9 observations, expected 1..8"):
        KeyDoor().oracle_action([[0]] * 9)


# ---------------------------------------------------------------- protocol, text adapter, docs


def test_registry_and_protocol():
    assert ENVIRONMENTS == {
        "key_door": KeyDoor,
        "guess_number": GuessNumber,
        "search": Search,
        "multi_hop": MultiHop,
        "frozen_lake": FrozenLake,
        "sokoban": Sokoban,
        "coin_collector": CoinCollector,
    }
    for name, cls in ENVIRONMENTS.items():
        env = make(name)
        assert type(env) is cls and isinstance(env, MultiTurnEnv)
        assert len(env.token_names) == env.vocab_size
    assert make("guess_number", num_values=8).vocab_size == 12


class _Spelling:
    """A text env: spell the word shown, one reply per turn; reward 1 if all replies match."""

    words = ("ab", "ba", "bb")

    def reset(self, seed: int) -> str:
        self.word, self.turn, self.ok = self.words[seed % 3], 0, True
        return f"say {self.word}"

    def step(self, reply: str) -> tuple[str, float, bool]:
        self.ok &= reply == self.word
        self.turn += 1
        if self.turn == 2:
            return "", float(self.ok), True
        return "again", 0.0, False


def test_tokenized_text_env():
    alphabet = " abginsy"
    encode = lambda text: [alphabet.index(c) for c in text]  # noqa: E731
    decode = lambda tokens: "".join(alphabet[t] for t in tokens)  # noqa: E731
    env = TokenizedTextEnv(_Spelling(), encode, decode, vocab_size=len(alphabet), action_tokens=2, max_turns=5)
    assert isinstance(env, MultiTurnEnv)
    assert decode(env.reset(1)) == "say ba"
    observation, reward, done = env.step(encode("ba"))
    assert (decode(observation), reward, done) == ("again", 0.0, False)
    assert env.step(encode("ba")) == ([], 1.0, True)
    with pytest.raises(InvalidRolloutError, match=r"TokenizedTextEnv\(_Spelling\) turn 0: token id 8 at position 1"):
        env.reset(0)
        env.step([1, 8])
    # The turn budget cuts an episode the text env would continue.
    short = TokenizedTextEnv(_Spelling(), encode, decode, vocab_size=8, action_tokens=2, max_turns=1)
    short.reset(0)
    assert short.step(encode("ab")) == (encode("again"), 0.0, True)
    with pytest.raises(InvalidConfigError, match=r"the tokenizer produced ids \[8\] outside \[0, 8\)"):
        TokenizedTextEnv(_Spelling(), lambda text: [8], decode, vocab_size=8, action_tokens=2, max_turns=1).reset(0)


def test_docs_sample_episodes_are_current():
    """docs/envs.md shows episodes rendered by render_episode; they must match the code."""
    text = DOCS.read_text()
    blocks = re.findall(r"<!-- episode: (.+?) -->\n```text\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    for spec, rendered in blocks:
        name, policy, seed, *params = spec.split()
        env = make(name, **{k: int(v) for k, v in (p.split("=") for p in params)})
        if policy == "oracle":
            episode = run_episode(env, lambda obs, acts, env=env: env.oracle_action(obs), int(seed))
        else:
            episode = run_episode(env, _random_policy(env, np.random.default_rng(0)), int(seed))
        assert render_episode(episode, env.token_names) + "\n" == rendered, spec
