"""Sokoban (mpo_lab.envs.sokoban) and its belief model: rooms by seed, every room solvable in
the budget, the solver on hand rooms and against a forward search, malformed turns, chance
by room, and the noisy oracle's exact values against Monte-Carlo rollouts of one
room (the shared checks of every premise task are in test_envs_premise.py, bad parameters
among them; chance against Monte Carlo is in test_envs_beliefs.py)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from mpo_lab.envs import Sokoban, make, run_episode
from mpo_lab.envs import sokoban as sk
from mpo_lab.envs.premise import NoisyOracle, belief_model, exact_success, play
from mpo_rs import InvalidRolloutError

CHARS = {
    "#": sk.WALL,
    "_": sk.FLOOR,
    "O": sk.TARGET,
    "√": sk.BOX_ON_TARGET,
    "X": sk.BOX,
    "P": sk.PLAYER,
    "S": sk.PLAYER_ON_TARGET,
}
SETTINGS = [{}, {"num_boxes": 2}, {"size": 5}, {"size": 5, "num_boxes": 2, "max_turns": 6}, {"max_turns": 15}]


def _grid(*rows: str) -> list[int]:
    """A room written as text rows, as the observation the env would show."""
    tokens: list[int] = []
    for i, row in enumerate(rows):
        tokens += ([sk.NEWLINE] if i else []) + [CHARS[c] for c in row]
    return tokens


def _forward_distance(env: Sokoban, desc: tuple[int, ...], start: sk.State) -> int | None:
    """The fewest moves to a solution by breadth-first search forward (independent of the
    backward search of :func:`sokoban.distances`)."""
    targets = tuple(c for c, k in enumerate(desc) if k == sk.TARGET)
    seen, frontier = {start: 0}, deque([start])
    while frontier:
        state = frontier.popleft()
        if state[1] == targets:
            return seen[state]
        for d in range(4):
            nxt = sk.move(desc, env.size, state, d)
            if nxt not in seen:
                seen[nxt] = seen[state] + 1
                frontier.append(nxt)
    return None


def _sigmas(successes: float, episodes: int, p: float) -> float:
    return abs(successes - episodes * p) / math.sqrt(max(episodes * p * (1 - p), 1.0))


def test_rooms_are_drawn_by_seed():
    env = Sokoban()
    assert (env.vocab_size, env.action_tokens, env.max_turns, len(env.token_names)) == (15, 3, 10, 15)
    assert [env.generate(s) for s in range(20)] == [Sokoban().generate(s) for s in range(20)]
    rooms = {env.generate(s) for s in range(100)}
    assert len(rooms) > 95
    for desc, (player, boxes) in rooms:
        n = env.size
        border = [c for c in range(n * n) if c // n in (0, n - 1) or c % n in (0, n - 1)]
        assert all(desc[c] == sk.WALL for c in border)
        assert desc.count(sk.TARGET) == len(boxes) == 1 and player not in boxes
        assert desc[player] != sk.WALL and all(desc[b] != sk.WALL for b in boxes)
        assert boxes != tuple(c for c, k in enumerate(desc) if k == sk.TARGET)  # never solved at the start


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_every_room_is_solvable_within_the_budget(params):
    env = make("sokoban", **params)
    lengths = []
    for seed in range(150):
        desc, start = env.generate(seed)
        d = sk.distances(desc, env.size)[start]
        assert d == _forward_distance(env, desc, start)  # the backward search is optimal
        assert 1 <= d <= env.search_depth <= env.max_turns
        lengths.append(d)
        episode = run_episode(env, lambda o, a: env.oracle_action(o), seed)
        assert (episode.score, episode.turns) == (1.0, d)
    assert np.mean(lengths) > env.search_depth / 3  # the reverse play moves the boxes away, not one step
    assert env.oracle_success() == 1.0


def test_solver_on_hand_rooms():
    env = Sokoban()
    # A corridor: two pushes right.
    corridor = env.parse_grid(_grid("######", "######", "#PX_O#", "######", "######", "######"))
    assert corridor is not None
    assert sk.distances(corridor[0], 6)[corridor[1]] == 2
    # The box must go left then up (or up then left), walking round it between: 5 moves.
    room = env.parse_grid(_grid("######", "#O___#", "#_X__#", "#__P_#", "######", "######"))
    assert room is not None and room[1] == (21, (14,))
    assert sk.distances(room[0], 6)[room[1]] == 5
    observations = [_grid("######", "#O___#", "#_X__#", "#__P_#", "######", "######")]
    assert env.oracle_action(observations) == [sk.ANSWER, sk.UP, sk.END]  # Up and Left tie; Up comes first
    # A box in a corner off target is a deadlock: no state of it is solvable.
    dead = env.parse_grid(_grid("######", "#X__O#", "#_P__#", "#____#", "######", "######"))
    assert dead is not None and dead[1] not in sk.distances(dead[0], 6)
    # Two boxes in a row cannot be pushed together.
    pair = env.parse_grid(_grid("######", "#____#", "#PXXO#", "#___O#", "######", "######"))
    assert pair is not None
    assert sk.move(pair[0], 6, pair[1], 3) == pair[1]
    # Up, Right, push the first box Down, push the second Right onto its target; Left, Left,
    # Down, push the first Right twice: 9 moves.
    assert sk.distances(pair[0], 6)[pair[1]] == _forward_distance(env, *pair) == 9


def test_hand_checked_episode_and_malformed_turns():
    env = Sokoban()
    grid = env.reset(0)
    # seed 0: the player stands on the target, right of the box; it must walk round to push it twice.
    assert grid == _grid("######", "#___##", "#_X_S#", "#____#", "#_####", "######")
    desc, (player, boxes) = env.desc, env.state
    assert (player, boxes) == (16, (14,)) and sk.distances(desc, 6)[(player, boxes)] == 7
    assert env.parse_grid(grid) == (desc, (player, boxes)) and env.render() == grid
    # Malformed turns show [error], leave the room as it was, and are spent.
    assert env.step([sk.ANSWER, sk.UP, 0]) == ([sk.ERROR], 0.0, False)
    assert env.step([sk.UP, sk.ANSWER, sk.END]) == ([sk.ERROR], 0.0, False)
    assert env.state == (player, boxes)
    # The oracle solves the rest in its shortest number of moves, which fits the turns left.
    d = sk.distances(desc, 6)[(player, boxes)]
    for turn in range(d):
        _, reward, done = env.step(env.oracle_action([env.render()]))
        assert done == (turn == d - 1) and reward == float(done)
    with pytest.raises(InvalidRolloutError, match=r"Sokoban turn \d+: step\(\) called with no episode running"):
        env.step([sk.ANSWER, sk.UP, sk.END])


def test_walls_and_boxes_block_and_the_budget_ends_the_episode():
    env = Sokoban(max_turns=3)
    env.reset(4)
    desc, (player, boxes) = env.desc, env.state
    # A direction into a wall leaves the grid unchanged; the turn is spent.
    blocked = [d for d in range(4) if sk.move(desc, 6, (player, boxes), d) == (player, boxes)]
    free = [d for d in range(4) if d not in blocked]
    if blocked:
        assert env.step([sk.ANSWER, sk.DIRECTIONS[blocked[0]], sk.END]) == (env.render(), 0.0, False)
    env.reset(4)
    far = [d for d in free if sk.distances(desc, 6).get(sk.move(desc, 6, (player, boxes), d), 99) > 1]
    assert far
    env.step([sk.ANSWER, sk.DIRECTIONS[far[0]], sk.END])
    env.step([sk.ERROR] * 3)
    assert env.step([sk.ERROR] * 3) == ([], 0.0, True)


def test_parse_grid_refuses_what_is_not_a_room():
    env = Sokoban()
    assert env.parse_grid([sk.ERROR]) is None
    assert env.parse_grid(_grid("######", "#PX_O#", "#P___#", "#____#", "######", "######")) is None  # two players
    assert env.parse_grid(_grid("######", "#_X_O#", "#____#", "#____#", "######", "######")) is None  # none
    with pytest.raises(InvalidRolloutError, match=r"Sokoban.oracle_action: no grid among the observations"):
        env.oracle_action([[sk.ERROR]])
    with pytest.raises(InvalidRolloutError, match=r"Sokoban.oracle_action: 11 observations, expected 1..10"):
        env.oracle_action([[sk.ERROR]] * 11)


def test_chance_success_is_the_dynamic_programme_of_each_room():
    """On one-move rooms with a long budget, where random tokens succeed often enough to count
    (test_envs_beliefs.py checks it against Monte Carlo)."""
    env = Sokoban(size=5, max_turns=40, search_depth=1)
    assert 0.005 < env.chance_success() < 0.05
    u = 1.0 / env.vocab_size**3
    per_room = [sk._success(desc, 5, start, 40, (u,) * 4) for desc, start in map(env.generate, range(40))]
    assert exact_success(env, 1.0, range(40), well_formed=0.0) == pytest.approx(float(np.mean(per_room)), rel=1e-9)


@pytest.mark.parametrize(("params", "eps", "seed"), [({}, 0.3, 13), ({"num_boxes": 2}, 0.5, 17)])
def test_exact_values_of_one_room_match_monte_carlo(params, eps, seed):
    """The value at the start of one room, and after each first move, against 3000 episodes of
    the noisy oracle on it (the room is fixed by the seed; the noise is the only luck): within
    4.5 binomial standard errors."""
    env = make("sokoban", **params)
    values = NoisyOracle(belief_model(env), eps)
    b = values.model.initial(env.reset(seed))
    exact = values.value(b)
    assert 0.05 < exact < 0.95
    rng = np.random.default_rng(1)
    wins = sum(play(env, values, seed, rng) for _ in range(3000))
    assert _sigmas(wins, 3000, exact) < 4.5, (wins / 3000, exact)
    for action in values.model.W or ():  # Q(b, a): one move, then the noisy oracle
        q = values.q(b, action)
        wins = 0.0
        for _ in range(600):
            env.reset(seed)
            observation, reward, done = env.step(list(action))
            belief = values.model.update(b, action, observation)
            while not done:
                turn = values.act(belief, rng)
                observation, reward, done = env.step(list(turn))
                belief = values.model.update(belief, turn, observation)
            wins += reward
        assert _sigmas(wins, 600, q) < 4.5, (action, wins / 600, q)


def test_reference_critic_key_pools_rooms_by_distance():
    from mpo_lab.reproduce.reference import belief_keys

    env = Sokoban()
    values = NoisyOracle(belief_model(env), 0.3)
    b = values.model.initial(env.reset(0))
    d = sk.distances(b[3], 6)[(b[1], b[2])]
    star = values.model.oracle(b)
    assert values.model.table_key(b, ()) == ((10, d), ())
    assert values.model.table_key(b, star[:2]) == ((10, d), (2, d - 1))
    assert values.model.table_key(b, (sk.END,)) == ((10, d), (1, "malformed"))
    first = env.reset(0)
    tokens = first + list(star) + env.step(list(star))[0]
    mask = np.array([0] * len(first) + [1] * 3 + [0] * (len(tokens) - len(first) - 3), bool)
    keys = belief_keys(env, np.array(tokens, np.int64), mask, np.array([0, len(tokens)], np.int64))
    assert keys == [values.model.table_key(b, star[:j]) for j in range(3)]


@pytest.mark.parametrize("params", SETTINGS)
def test_observations_fit_the_declared_length_and_the_reproduction_model(params):
    """Every observation (the prompt too) is at most ``observation_tokens`` long, and the
    reproduction's policy has positions for an episode of the longest turns."""
    from mpo_lab.reproduce.config import TaskSpec
    from mpo_lab.reproduce.env import model_max_len

    env = Sokoban(**params)
    rng = np.random.default_rng(0)
    longest = 0
    for seed in range(20):
        observation, done, tokens = env.reset(seed), False, 0
        longest, tokens = max(longest, len(observation)), len(observation)
        while not done:
            action = [sk.ANSWER, int(rng.choice(sk.DIRECTIONS)), sk.END] if rng.random() < 0.9 else [0, 0, 0]
            observation, _, done = env.step(action)
            longest, tokens = max(longest, len(observation)), tokens + env.action_tokens + len(observation)
        assert tokens <= model_max_len(TaskSpec("sokoban", tuple(params.items())), env)
    assert longest == env.observation_tokens == env.size * (env.size + 1) - 1
