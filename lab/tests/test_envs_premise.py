"""The tasks where MPO's premise should hold (search, multi_hop, frozen_lake, sokoban, coin_collector) and the premise
measurement (mpo_lab.envs.premise): hand-checked episodes, malformed turns, the protocol and
bad parameters, and the between-turn share on a small run (>= 0.8 on search, < 0.5 on
key_door). The oracles, chance and the exact values against Monte Carlo are
lab/tests/test_envs_beliefs.py."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from mpo_lab.envs import (
    ENVIRONMENTS,
    CoinCollector,
    FrozenLake,
    KeyDoor,
    MultiHop,
    MultiTurnEnv,
    Search,
    Sokoban,
    make,
    run_episode,
)
from mpo_lab.envs import coin_collector as cc
from mpo_lab.envs import frozen_lake as fl
from mpo_lab.envs import multi_hop as mh
from mpo_lab.envs import search as se
from mpo_lab.envs.premise import (
    TARGET_SUCCESS,
    NoisyOracle,
    belief_model,
    boundary_fraction,
    exact_success,
    main,
    rollout,
    share_statistics,
)
from mpo_rs import InvalidConfigError, InvalidRolloutError

NEW = ("search", "multi_hop", "frozen_lake", "sokoban", "coin_collector")


def _oracle(env):
    return lambda observations, actions: env.oracle_action(observations)


def _close(successes: float, episodes: int, p: float, sigmas: float = 4.5) -> bool:
    sigma = math.sqrt(max(episodes * p * (1 - p), 1.0))
    return abs(successes - episodes * p) < sigmas * sigma


# ---------------------------------------------------------------- hand-checked episodes


def test_search_hand_checked():
    env = Search()  # ids: question 0, result 1, none 2, error 3, search 4, answer 5, end 6, topics 7-10, ans 11-26
    assert (env.vocab_size, env.action_tokens, env.max_turns) == (27, 3, 10)
    assert env.reset(0) == [se.QUESTION, 10]  # seed 0: topic3, hidden answer ans4 (id 15)
    assert env.step([se.SEARCH, 7, se.END]) == ([se.RESULT, 7, se.NONE], 0.0, False)  # another topic: nothing
    assert env.step([se.SEARCH, 10, 5]) == ([se.ERROR], 0.0, False)  # no `end`: malformed, the turn is spent
    assert env.step([se.END, 10, se.SEARCH]) == ([se.ERROR], 0.0, False)
    observations = [env.step([se.SEARCH, 10, se.END])[0] for _ in range(6)]
    assert observations == [[se.RESULT, 10, se.NONE]] * 4 + [[se.RESULT, 10, 17, 15], [se.RESULT, 10, se.NONE]]
    assert env.step([se.ANSWER, 15, se.END]) == ([], 1.0, True)
    env.reset(0)
    assert env.step([se.ANSWER, 16, se.END]) == ([], 0.0, True)  # a wrong answer ends it too
    env.reset(0)
    for _ in range(9):
        assert env.step([0, 0, 0]) == ([se.ERROR], 0.0, False)
    assert env.step([0, 0, 0]) == ([], 0.0, True)  # the budget


def test_search_oracle_answers_the_last_candidate():
    env = Search()
    episode = run_episode(env, _oracle(env), 0)
    assert episode.observations[9] == [se.RESULT, 10, 18, 15]  # the second hit leaves ans4 alone
    assert episode.actions[-1] == [se.ANSWER, 15, se.END] and episode.score == 1.0 and episode.turns == 10
    assert env.candidates([[se.QUESTION, 10], [se.RESULT, 10, 17, 15], [se.RESULT, 7, 12, 13]]) == [4, 6]


def test_multi_hop_hand_checked():
    env = MultiHop(max_turns=11)  # fixed ids 0-9, entities 10-21, answers 22-25
    assert (env.vocab_size, env.action_tokens, env.hops) == (26, 3, 5) and MultiHop().max_turns == 9
    assert env.reset(0) == [mh.QUESTION, 17]
    assert env.chain == [17, 21, 20, 18, 13, 12] and env.hidden == 1
    assert env.step([mh.LOOKUP, 21, mh.END]) == ([mh.NOT_FOUND, 21], 0.0, False)  # not seen yet
    assert env.step([mh.LOOKUP, 17, mh.END]) == ([mh.PAGE, 17, mh.LINKS, 21, 19], 0.0, False)
    assert env.step([mh.LOOKUP, 19, mh.END]) == ([mh.PAGE, 19, mh.DEAD_END], 0.0, False)  # the decoy
    assert env.step([mh.LOOKUP, 21, 0]) == ([mh.ERROR], 0.0, False)  # malformed
    assert env.step([mh.LOOKUP, 21, mh.END]) == ([mh.PAGE, 21, mh.LINKS, 10, 20], 0.0, False)
    assert env.step([mh.LOOKUP, 20, mh.END])[0] == [mh.PAGE, 20, mh.LINKS, 16, 18]
    assert env.step([mh.LOOKUP, 18, mh.END])[0] == [mh.PAGE, 18, mh.LINKS, 15, 13]
    assert env.step([mh.LOOKUP, 13, mh.END])[0] == [mh.PAGE, 13, mh.LINKS, 14, 12]
    assert env.step([mh.LOOKUP, 12, mh.END]) == ([mh.PAGE, 12, mh.FACT, 23], 0.0, False)
    assert env.step([mh.ANSWER, 23, mh.END]) == ([], 1.0, True)


def test_multi_hop_oracle_backtracks_after_a_dead_end():
    env = MultiHop(max_turns=12)
    episode = run_episode(env, _oracle(env), 0)  # seed 0: the decoy is listed first at hops 2-5
    looked = [a[1] for a in episode.actions[:-1]]
    assert looked == [17, 21, 10, 20, 16, 18, 15, 13, 14, 12]
    assert episode.observations[3] == [mh.PAGE, 10, mh.DEAD_END] and episode.score == 1.0
    # With the default budget of 9 turns the same seed fails: four dead ends do not fit.
    assert run_episode(MultiHop(), _oracle(MultiHop()), 0).score == 0.0
    assert env.oracle_turns() == 12


def test_coin_collector_hand_checked():
    """Seed 3: the oracle's first pick in room11 (north) is a dead end; it walks back (the way it
    came in is listed first) and takes the other exit; a wall, a take without the coin and a
    malformed turn each spend a turn."""
    env = CoinCollector()
    episode = run_episode(env, _oracle(env), 3)
    rooms = [o[1] for o in episode.observations[:-1]]
    assert rooms == [22, 23, 24, 15, 24, 18, 20] and env.chain == [22, 23, 24, 18, 20]
    assert episode.observations[3] == [cc.ROOM, 15, cc.EXITS, cc.SOUTH]  # the dead end: only the way back
    assert episode.observations[4] == [cc.ROOM, 24, cc.EXITS, cc.NORTH, cc.EAST, cc.SOUTH]
    assert episode.observations[6][-1] == cc.COIN and episode.actions[-1] == [cc.TAKE, cc.COIN, cc.END]
    assert episode.score == 1.0 and episode.turns == 7
    first = env.reset(3)
    assert first == [cc.ROOM, 22, cc.EXITS, cc.NORTH, cc.SOUTH]
    assert env.step([cc.GO, cc.EAST, cc.END]) == ([cc.BLOCKED], 0.0, False)
    assert env.step([cc.TAKE, cc.COIN, cc.END]) == ([cc.NOTHING], 0.0, False)
    assert env.step([cc.GO, cc.GO, cc.GO]) == ([cc.ERROR], 0.0, False)
    # Every map is TextWorld's simple mode: a chain with one dead end beside each of its rooms.
    for seed in range(50):
        env.reset(seed)
        dead = [room for room in env.exits if room not in env.chain]
        assert len(dead) == len(env.chain) and all(len(env.exits[room]) == 1 for room in dead)
        assert all(cc.reverse(d) in env.exits[env.exits[r][d]] for r in env.exits for d in env.exits[r])
    assert env.oracle_turns() == 13 and exact_success(env, 0.0, range(64)) == pytest.approx(11 / 16)


@pytest.mark.parametrize(
    "env",
    [
        CoinCollector(),
        CoinCollector(quest_length=1, distractors=0, num_names=1, max_turns=40),
        CoinCollector(quest_length=3, distractors=2, max_turns=20),
        CoinCollector(length_choices=[1, 3], distractors=0, num_names=3, max_turns=30),
    ],
    ids=repr,
)
def test_coin_collector_chance_is_the_belief_models_random_walk(env):
    """chance_success()'s walk over (chain room, in a dead end) is the dynamic programme of the
    belief model under uniformly random tokens; on a one-room chain, against Monte Carlo too."""
    seeds = range(40)
    lengths = []
    for seed in seeds:
        env.reset(seed)
        lengths.append(env.task_length)
    # Over these seeds' own mix of levels (chance_success() weighs the levels alike).
    walk = float(np.mean([env._chance_walk(float(env.vocab_size) ** -3, n) for n in lengths]))
    assert exact_success(env, 1.0, seeds, well_formed=0.0) == pytest.approx(walk, rel=1e-9)
    if env.length_choices is None:
        assert walk == pytest.approx(env.chance_success(), rel=1e-12)
    if env.quest_length == 1:
        rng = np.random.default_rng(2)
        wins = 0.0
        for seed in range(20000):
            env.reset(seed)
            done = False
            while not done:
                _, reward, done = env.step(rng.integers(env.vocab_size, size=3))
            wins += reward
        assert _close(wins, 20000, env.chance_success())


def test_frozen_lake_hand_checked():
    env = FrozenLake()
    assert (env.vocab_size, env.action_tokens, env.max_turns) == (12, 3, 10)
    grid = env.reset(0)
    # seed 0: row 1 holds the player (col 1) and the goal (col 2); holes at (2,2), (3,1), (3,3)
    _, o, g, p, nl = fl.FROZEN, fl.HOLE, fl.GOAL, fl.PLAYER, fl.NEWLINE
    assert grid == [_, _, _, _, nl, _, p, g, _, nl, _, _, o, _, nl, _, o, _, o]
    assert env.step([fl.ANSWER, fl.RIGHT, 0]) == ([fl.ERROR], 0.0, False)  # malformed: the turn is spent
    assert env.step([fl.RIGHT, fl.ANSWER, fl.END]) == ([fl.ERROR], 0.0, False)
    # Right from (1,1): the goal, or a slip up to (0,1) or down to (2,1); this seed slips down.
    slipped = [_, _, _, _, nl, _, _, g, _, nl, _, p, o, _, nl, _, o, _, o]
    assert env.step([fl.ANSWER, fl.RIGHT, fl.END]) == (slipped, 0.0, False)
    # Down from (2,1) lands in a hole unless it slips left: a hole here, the end with reward 0.
    assert env.step([fl.ANSWER, fl.DOWN, fl.END]) == ([], 0.0, True)
    env.reset(0)
    assert env.parse_grid(grid) == (env.desc, 5)
    assert env.parse_grid([fl.ERROR]) is None


def test_frozen_lake_maps_follow_ragen_generation():
    env = FrozenLake()
    holes = []
    for seed in range(300):
        desc, start, _ = env.generate(seed)
        assert desc.count(fl.GOAL) == 1 and desc[start] == fl.FROZEN
        assert env._reachable(list(desc), start)
        holes.append(desc.count(fl.HOLE))
    # 14 cells other than start and goal, each a hole with probability 0.2, before the redraw of
    # unreachable maps (which removes some hole-heavy ones).
    assert 2.0 < np.mean(holes) < 2.8
    slips = set()
    for seed in range(200):
        env.reset(seed)
        start = env.player
        env.step([fl.ANSWER, fl.DOWN, fl.END])
        slips.add((env.player - start) if env.desc[env.player] != fl.GOAL else None)
    assert {-1, 1, 4} <= slips and -4 not in slips  # Down slips to Left or Right, never Up


def test_new_envs_conform_to_the_protocol():
    for name in NEW:
        env = make(name)
        assert type(env) is ENVIRONMENTS[name] and isinstance(env, MultiTurnEnv)
        assert len(env.token_names) == env.vocab_size and 8 <= env.max_turns <= 16 and env.action_tokens == 3
        for action in env.well_formed_actions():
            assert len(action) == env.action_tokens and all(0 <= t < env.vocab_size for t in action)
        for seed in range(30):  # every prompt is within the vocabulary and every episode ends in time
            episode = run_episode(env, _oracle(env), seed)
            assert episode.done and episode.turns <= env.max_turns
            assert all(0 <= t < env.vocab_size for o in episode.observations for t in o)


@pytest.mark.parametrize(
    ("error", "message", "call"),
    [
        (InvalidConfigError, r"Search: hit_prob must be a number in \[0, 1\], got 1.5", lambda: Search(hit_prob=1.5)),
        (
            InvalidConfigError,
            r"MultiHop: num_entities must be >= 2 \* hops \+ 1 = 11, got 10",
            lambda: MultiHop(num_entities=10),
        ),
        (InvalidConfigError, r"FrozenLake: slippery must be a bool, got 1", lambda: FrozenLake(slippery=1)),  # type: ignore[arg-type]
        (
            InvalidConfigError,
            r"frozen_lake: unknown parameter\(s\) p; accepted: size",
            lambda: make("frozen_lake", p=0.8),
        ),
        (
            InvalidRolloutError,
            r"MultiHop.oracle_action: 10 observations, expected 1..9",
            lambda: MultiHop().oracle_action([[mh.QUESTION, 10]] * 10),
        ),
        (
            InvalidRolloutError,
            r"Search.oracle_action: unexpected first observation \[1\]",
            lambda: Search().oracle_action([[1]]),
        ),
        (
            InvalidRolloutError,
            r"FrozenLake.oracle_action: no grid among the observations",
            lambda: FrozenLake().oracle_action([[fl.ERROR]]),
        ),
        (InvalidConfigError, r"Sokoban: size must be an int >= 4, got 3", lambda: Sokoban(size=3)),
        (
            InvalidConfigError,
            r"CoinCollector: distractors must be <= 2 \(TextWorld's simple mode\), got 3",
            lambda: CoinCollector(distractors=3),
        ),
        (
            InvalidConfigError,
            r"CoinCollector: num_names must be >= \(1 \+ distractors\) \* quest_length = 12, got 11",
            lambda: CoinCollector(quest_length=6, num_names=11),
        ),
        (
            InvalidConfigError,
            r"CoinCollector: length_choices must be a list of at least two chain lengths, got \[3\]",
            lambda: CoinCollector(length_choices=[3]),
        ),
        (
            InvalidRolloutError,
            r"CoinCollector.oracle_action: unexpected first observation \[9\]",
            lambda: CoinCollector().oracle_action([[cc.NORTH]]),
        ),
        (
            InvalidRolloutError,
            r"CoinCollector.oracle_action: no way on from room id 13: not a history of this task",
            lambda: CoinCollector().oracle_action([[cc.ROOM, 13, cc.EXITS]]),
        ),
        (InvalidConfigError, r"Sokoban: num_boxes must be an int >= 1, got 0", lambda: Sokoban(num_boxes=0)),
        (InvalidConfigError, r"Sokoban: max_turns must be an int >= 1, got 1.5", lambda: Sokoban(max_turns=1.5)),  # type: ignore[arg-type]
        (
            InvalidConfigError,
            r"Sokoban: search_depth must be <= max_turns = 6, got 10",
            lambda: Sokoban(max_turns=6, search_depth=10),
        ),
        (
            InvalidConfigError,
            r"sokoban: unknown parameter\(s\) dim_room; accepted: size",
            lambda: make("sokoban", dim_room=6),
        ),
        (
            InvalidConfigError,
            r"no room with a box to move after 1000 draws",
            lambda: Sokoban(size=4, num_boxes=3).reset(0),
        ),  # a 2x2 floor cannot hold three boxes, a target free and a player
    ],
)
def test_new_envs_bad_parameters(error, message, call):
    with pytest.raises(error, match=message):
        call()


# ---------------------------------------------------------------- the premise statistic


def _shares(name: str, eps: float, n: int):
    env = make(name)
    values = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(0)
    return share_statistics([rollout(env, values, 10**6 + i, rng) for i in range(n)])


def test_premise_holds_on_search_and_fails_on_key_door():
    search = _shares("search", 0.21, 48)
    assert search["median_between_share"] >= 0.8
    key_door = _shares("key_door", 0.59, 160)
    assert key_door["median_between_share"] < 0.5
    # On KeyDoor every value step sits inside a turn (at the key and at `open`).
    assert key_door["median_boundary_fraction"] == 0.0
    assert search["median_boundary_fraction"] > 0.2


def test_boundary_fraction_counts_steps_across_observations():
    from mpo_lab.envs.premise import Rollout

    r = Rollout(tokens=[0, 1, 1, 0, 1, 1], mask=[0, 1, 1, 0, 1, 1], values=[0, 0.2, 0.4, 0, 0.8, 0.8], score=1, turns=2)
    assert boundary_fraction(r) == pytest.approx(0.16 / (0.04 + 0.16))


def test_premise_command_prints_the_table(capsys):
    assert main(["--tasks", "key_door", "--exact-seeds", "2", "--rollouts", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| task |") and "`key_door` | 8 × 16" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["--tasks", "maze"])
    assert exit_info.value.code == 2
    assert "--tasks: no belief model for maze; known: search" in capsys.readouterr().err


def test_eps_target_is_documented_and_key_door_is_unchanged():
    assert TARGET_SUCCESS == 0.2
    assert repr(KeyDoor()) == (
        "KeyDoor(max_turns=8, action_tokens=16, num_keys=4, vocab_size=16, key_position=0, open_position=0, max_noise=3)"
    )


def test_docs_premise_table_is_current():
    """docs/envs.md's table is the output of `mpo-lab premise`; its exact columns
    (chance, oracle, eps, exact base success) are recomputed here for the tasks whose exact
    values are quick (all but frozen_lake)."""
    from pathlib import Path

    from mpo_lab.envs.premise import choose_eps

    text = (Path(__file__).resolve().parents[1] / "docs" / "envs.md").read_text()
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `") and " × " in line:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    assert sorted(rows) == sorted(ENVIRONMENTS)
    seeds = range(512)
    for name in ("search", "multi_hop", "guess_number", "key_door"):
        env = make(name)
        _, shape, chance, oracle, eps, base = rows[name][:6]
        assert shape == f"{env.max_turns} × {env.action_tokens}"
        assert float(chance) == pytest.approx(exact_success(env, 1.0, seeds, well_formed=0.0), rel=0.05)  # 2 digits
        assert f"{exact_success(env, 0.0, seeds):.3f}" == oracle
        assert f"{choose_eps(env, seeds):.2f}" == eps
        assert f"{exact_success(env, float(eps), seeds):.3f}" == base


def test_vector_env_runs_the_new_envs():
    from mpo_lab.envs import VectorEnv

    for name in NEW:
        vec = VectorEnv(lambda name=name: make(name), 3)
        observations = vec.reset([0, 0, 1])
        assert observations[0] == observations[1]
        history = [[o] for o in observations]
        while not vec.done.all():
            actions = [None if vec.done[i] else vec.envs[i].oracle_action(history[i]) for i in range(3)]
            observations, _, _ = vec.step(actions)
            for i, o in enumerate(observations):
                history[i].append(o)
        assert vec.turns.max() <= vec.max_turns


def test_docs_premise_json_is_the_table_of_docs_envs_md():
    """docs/premise.json (`mpo-lab premise --json docs/premise.json`, read by the
    reproduction page's design section) renders as the table of docs/envs.md, row for row."""
    import json
    from pathlib import Path

    from mpo_lab.envs.premise import PREMISE_SHARE, premise_verdict, table

    docs = Path(__file__).resolve().parents[1] / "docs"
    results = json.loads((docs / "premise.json").read_text())
    rendered = table(results).splitlines()
    envs = (docs / "envs.md").read_text().splitlines()
    start = envs.index(rendered[0])
    assert envs[start : start + len(rendered)] == rendered
    assert premise_verdict(PREMISE_SHARE) == "holds" and premise_verdict(PREMISE_SHARE - 1e-9) == "fails"
    assert premise_verdict(None) == "fails"


# ---------------------------------------------------------------- Search with a spread of difficulty


SPREAD = (0.05, 0.9)


def test_search_difficulty_is_drawn_per_task_and_shown_in_the_prompt():
    env = Search(hit_probs=list(SPREAD))
    assert env.vocab_size == Search().vocab_size + 2 and env.token_names[-2:] == ["level0", "level1"]
    levels, hits = [], {0: [0, 0], 1: [0, 0]}
    for seed in range(400):
        first = env.reset(seed)
        assert len(first) == 3 and first[2] == env.first_level + env.level
        levels.append(env.level)
        observation, _, _ = env.step([se.SEARCH, first[1], se.END])
        hits[env.level][0] += len(observation) == 4
        hits[env.level][1] += 1
    assert 0.4 < np.mean(levels) < 0.6  # uniform over the levels
    assert hits[0][0] / hits[0][1] < 0.15 and hits[1][0] / hits[1][1] > 0.8
    # The topic and the answer are the seed's as without the spread (the level is drawn after them).
    plain = Search()
    for seed in range(50):
        assert plain.reset(seed) == env.reset(seed)[:2] and plain.hidden == env.hidden


def test_search_without_a_spread_draws_what_it_always_drew():
    env, rng = make("search"), np.random.default_rng(0)
    values = NoisyOracle(belief_model(env), 0.3)
    digest = hashlib.sha256()
    for seed in range(300):
        r = rollout(env, values, seed, rng)
        digest.update(repr((r.tokens, r.score, [round(v, 9) for v in r.values])).encode())
    assert digest.hexdigest()[:16] == "0766cd4daf3d4c3b"  # measured before the spread existed


def test_search_with_a_spread_model_oracle_is_the_env_oracle():
    env = make("search", hit_probs=list(SPREAD))
    values = NoisyOracle(belief_model(env), 0.2)
    for seed in range(20):
        observations = [env.reset(seed)]
        b = values.model.initial(observations[0])
        assert b[3] == env.level and list(values.model.oracle(b)) == env.oracle_action(observations)


def test_search_spread_bad_parameters():
    with pytest.raises(InvalidConfigError, match=r"Search: hit_probs must be a list of at least two probabilities"):
        Search(hit_probs=[0.5])
    with pytest.raises(InvalidConfigError, match=r"Search: hit_probs\[1\] must be a number in \[0, 1\], got 2"):
        Search(hit_probs=[0.5, 2])


# ---------------------------------------------------------------- Search with long turns (thinking tokens)


def test_search_thinking_tokens_are_read_and_ignored():
    plain, env = Search(), Search(think_tokens=3, think_vocab=2)
    assert env.action_tokens == 6 and env.vocab_size == plain.vocab_size + 2
    assert env.token_names[-2:] == ["think0", "think1"] and list(env.think_ids) == [
        env.first_think,
        env.first_think + 1,
    ]
    assert Search(think_vocab=3).vocab_size == plain.vocab_size  # no thinking ids without thinking
    for seed in range(40):
        first = env.reset(seed)
        assert first == plain.reset(seed)
        thought = [env.first_think + (seed + i) % 2 for i in range(3)]
        for call in ([se.SEARCH, first[1], se.END], [se.ANSWER, env.first_answer + plain.hidden, se.END]):
            env.reset(seed), plain.reset(seed)
            assert env.step(thought + call) == plain.step(call)
        env.reset(seed)
        # A non-thinking token where a thought goes spends the turn, even before a right answer.
        bad = [env.first_think, se.ANSWER, env.first_think, se.ANSWER, env.first_answer + env.hidden, se.END]
        assert env.step(bad) == ([se.ERROR], 0.0, False)
    observations = [env.reset(0)]
    assert env.oracle_action(observations)[:3] == [env.first_think] * 3
    assert env.oracle_action(observations)[3:] == plain.oracle_action([plain.reset(0)])


def test_search_thinking_chance_formula_counts_every_action():
    """The chance formula against an enumeration of every action of one turn."""
    env = Search(num_topics=1, num_answers=2, max_turns=3, think_tokens=2, think_vocab=2)
    v, k = env.vocab_size, env.action_tokens
    answered = right = 0
    for seed in range(4):
        for action in np.ndindex(*(v,) * k):
            env.reset(seed)
            _, reward, done = env.step(list(action))
            answered += done
            right += reward == 1.0
    a, c = answered / (4 * v**k), right / (4 * v**k)
    assert env.chance_success() == pytest.approx(c * sum((1 - a) ** t for t in range(3)), rel=1e-12)


def test_search_thinking_prefix_values():
    """Thoughts leave the value at the turn's; a wrong one is a malformed turn; after them the
    call's first token splits the value as the noisy oracle draws it."""
    env = make("search", hit_probs=list(SPREAD), think_tokens=4)
    values = NoisyOracle(belief_model(env), 0.3)
    m = values.model
    b = m.initial(env.reset(3))
    thought = (env.first_think,) * 4
    for i in range(5):
        assert values.prefix_value(b, thought[:i]) == pytest.approx(values.value(b), abs=1e-12)
    assert values.prefix_value(b, (env.first_think, se.SEARCH)) == pytest.approx(values.q(b, None), abs=1e-12)
    total = 0.0
    for token in range(m.V):
        p = 0.7 * (m.oracle(b)[0] == token) + 0.3 * 0.5 / m.V + 0.3 * 0.5 * sum(a[0] == token for a in m.W) / len(m.W)
        total += p * values.prefix_value(b, (*thought, token))
    assert total == pytest.approx(values.value(b), abs=1e-12)
    # The noisy oracle thinks uniformly over the thinking ids and noises only the call.
    rng = np.random.default_rng(0)
    actions = [values.act(b, rng) for _ in range(200)]
    assert all(len(a) == 7 and set(a[:4]) <= set(env.think_ids) for a in actions)
    assert {a[0] for a in actions} == set(env.think_ids)


# ---------------------------------------------------------------- MultiHop with a spread of hops


def test_multi_hop_hops_are_drawn_per_task_and_shown_in_the_prompt():
    env = MultiHop(hop_choices=[2, 5])
    assert env.hops == 5 and env.vocab_size == MultiHop().vocab_size + 2 and env.token_names[-1] == "level1"
    drawn = []
    for seed in range(300):
        first = env.reset(seed)
        level = first[2] - env.first_level
        assert len(first) == 3 and env.task_hops == (2, 5)[level] and len(env.chain) == env.task_hops + 1
        drawn.append(level)
        # The oracle walks the task's chain: hops + 2 turns plus one per decoy taken.
        long = MultiHop(hop_choices=[2, 5], max_turns=12)
        assert run_episode(long, _oracle(long), seed).score == 1.0
    assert 0.4 < np.mean(drawn) < 0.6
    # Without the spread every draw is what it always was.
    plain = MultiHop()
    assert [plain.reset(s) for s in range(5)] == [MultiHop(hops=5).reset(s) for s in range(5)]
    assert plain.reset(0) == [mh.QUESTION, plain.chain[0]]
    with pytest.raises(InvalidConfigError, match=r"MultiHop: hop_choices must be a list of at least two hop counts"):
        MultiHop(hop_choices=[3])
    with pytest.raises(InvalidConfigError, match=r"MultiHop: hop_choices\[1\] must be an int >= 1, got 0"):
        MultiHop(hop_choices=[2, 0])


def test_multi_hop_spread_belief_reads_the_tasks_hops_from_the_prompt():
    env = make("multi_hop", hop_choices=[2, 5])
    model = belief_model(env)
    for seed in range(30):
        assert model.initial(env.reset(seed))[7] == env.task_hops


def test_frozen_lake_success_rate_weighs_the_slip():
    """gym's and RAGEN's success_rate: the intended move with p, either perpendicular one with
    (1 - p) / 2 (the episodes against the exact values: test_exact_values_match_monte_carlo);
    without it the draws are what they always were (1/3 each)."""
    assert FrozenLake().move_weights() == (1 / 3, 1 / 3, 1 / 3) and FrozenLake(slippery=False).move_weights() == (1.0,)
    env = FrozenLake(success_rate=0.8)
    assert env.move_weights() == pytest.approx((0.1, 0.8, 0.1))
    plain = FrozenLake()
    assert [plain.reset(s) for s in range(5)] == [FrozenLake(success_rate=None).reset(s) for s in range(5)]
    with pytest.raises(InvalidConfigError, match=r"FrozenLake: success_rate must be a number in \[0, 1\], got 1.5"):
        FrozenLake(success_rate=1.5)
