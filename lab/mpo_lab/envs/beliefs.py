"""What a task's history says about what is hidden: a belief model per built-in environment.

A belief is a small hashable state with its transitions under each action, and the task's
oracle; :class:`mpo_lab.envs.premise.NoisyOracle` computes exact values by memoized recursion
over it, and the reference critic (:mod:`mpo_lab.reproduce.reference`) keys its table on it. The
tests check each model against Monte-Carlo episodes of the real environment.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from mpo_rs.exceptions import InvalidConfigError

from . import coin_collector as cc
from . import frozen_lake as fl
from . import multi_hop as mh
from . import search as se
from . import sokoban as sk
from .coin_collector import CoinCollector
from .frozen_lake import FrozenLake
from .guess_number import GuessNumber
from .key_door import OPEN, KeyDoor
from .multi_hop import MultiHop
from .search import Search
from .sokoban import Sokoban

__all__ = ["MALFORMED", "VALUE_STEP", "Belief", "BeliefModel", "Outcome", "belief_model"]

MALFORMED = None
"""Stands for every malformed action: they all cost the turn and show ``[error]``."""

Belief = tuple[Any, ...]
Outcome = tuple[float, float, bool, Belief | None]
"""(probability, reward, done, next belief)"""


class BeliefModel:
    """What the history says about an episode, as a small hashable state ``b``.

    ``W`` lists the well-formed actions (None: every action is well formed and only the
    token at ``decisive(b)`` matters). ``outcomes(b, a)`` gives the next beliefs of action
    ``a`` (a member of ``W``, ``MALFORMED``, or for ``W is None`` the decisive token or None).

    A turn may open with ``free`` thinking tokens (ids ``free_ids``) that the task ignores
    (Search's ``think_tokens``): then ``K`` counts the tool call's tokens after them, ``W``
    lists the calls, and a turn whose thoughts hold another token is malformed."""

    W: list[tuple[int, ...]] | None
    free: int = 0
    free_ids: range = range(0)

    def __init__(self, env: Any) -> None:
        self.env = env
        self.K = int(env.action_tokens)
        self.V = int(env.vocab_size)
        self.T = int(env.max_turns)

    def thought_ok(self, prefix: Sequence[int]) -> bool:
        """Whether the thinking part of a turn's ``prefix`` holds thinking tokens only."""
        return all(int(t) in self.free_ids for t in prefix[: self.free])

    def initial(self, observation: Sequence[int]) -> Belief:
        raise NotImplementedError

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        raise NotImplementedError

    def key(self, b: Belief) -> Any:
        return b

    def oracle(self, b: Belief) -> tuple[int, ...]:
        raise NotImplementedError

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        raise NotImplementedError

    def decisive(self, b: Belief) -> int | None:
        return None

    def _to(self, b: Belief, branches: Sequence[tuple[float, Belief]]) -> list[Outcome]:
        """The turn ends without reward in each of ``branches`` ((probability, next belief)),
        or, at the budget, so does the episode."""
        last = b[0] + 1 == self.T
        return [(p, 0.0, last, None if last else nxt) for p, nxt in branches]

    def _spent(self, b: Belief, nxt: Belief) -> list[Outcome]:
        """The turn is spent: next belief ``nxt``, or the end at the budget."""
        return self._to(b, [(1.0, nxt)])


class _KeyDoorModel(BeliefModel):
    W = None

    # (turn, the door's key, whether turn 0 took it, the key the demonstrator takes).
    def initial(self, observation: Sequence[int]) -> Belief:
        return (0, self.env.door_key(observation), None, self.env.demonstrated_key(observation))

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        t, key, ok, taught = b
        if t == 0:
            ok = int(action[self.env.key_position]) == key
        return (t + 1, key, ok, taught)

    def key(self, b: Belief) -> Any:
        # Whether the demonstrator knows this door's key (always, unless it saturates) sets
        # its value at turn 0; the key itself does not.
        return (b[0], b[2], b[1] == b[3])

    def decisive(self, b: Belief) -> int | None:
        if b[0] == 0:
            return int(self.env.key_position)
        if b[0] == self.T - 1:
            return int(self.env.open_position)
        return None

    def oracle(self, b: Belief) -> tuple[int, ...]:
        action = [self.env.first_noise] * self.K
        if b[0] == 0:
            action[self.env.key_position] = b[3]
        if b[0] == self.T - 1:
            action[self.env.open_position] = OPEN
        return tuple(action)

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, key, ok, taught = b
        if t == self.T - 1:
            return [(1.0, 1.0 if ok and a == OPEN else 0.0, True, None)]
        return [(1.0, 0.0, False, (t + 1, key, a == key if t == 0 else ok, taught))]


class _GuessNumberModel(BeliefModel):
    W = None

    def initial(self, observation: Sequence[int]) -> Belief:
        return (0, 0, self.env.num_values - 1)

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        t, lo, hi = b
        guess = int(action[0])
        if list(observation) == [self.env.lower]:
            hi = min(hi, guess - 1)
        elif list(observation) == [self.env.higher]:
            lo = max(lo, guess + 1)
        return (t + 1, lo, hi)

    def decisive(self, b: Belief) -> int | None:
        return 0

    def oracle(self, b: Belief) -> tuple[int, ...]:
        return ((b[1] + b[2]) // 2,) + (self.env.start,) * (self.K - 1)

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, lo, hi = b
        n = hi - lo + 1
        if not lo <= a <= hi:
            return self._spent(b, (t + 1, lo, hi))
        misses = ([((a - lo) / n, (t + 1, lo, a - 1))] if a > lo else []) + (
            [((hi - a) / n, (t + 1, a + 1, hi))] if a < hi else []
        )
        return [(1.0 / n, 1.0, True, None), *self._to(b, misses)]


class _SearchModel(BeliefModel):
    """b = (turn, candidates left as a sorted tuple of answer indices, topic id, level or None)."""

    def __init__(self, env: Search) -> None:
        super().__init__(env)
        self.W = [tuple(a) for a in env.well_formed_actions()]
        self.free, self.free_ids = env.think_tokens, env.think_ids
        self.K -= self.free

    def initial(self, observation: Sequence[int]) -> Belief:
        level = int(observation[2]) - self.env.first_level if len(observation) == 3 else None
        return (0, tuple(range(self.env.num_answers)), int(observation[1]), level)

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        t, left, topic, level = b
        obs = [int(x) for x in observation]
        if len(obs) == 4 and obs[0] == se.RESULT and obs[1] == topic:
            pair = {obs[2] - self.env.first_answer, obs[3] - self.env.first_answer}
            left = tuple(j for j in left if j in pair)
        return (t + 1, left, topic, level)

    def key(self, b: Belief) -> Any:
        return (b[0], len(b[1]), b[3])

    def oracle(self, b: Belief) -> tuple[int, ...]:
        t, left, topic, _ = b
        if len(left) == 1 or t == self.T - 1:
            return (se.ANSWER, self.env.first_answer + left[0], se.END)
        return (se.SEARCH, topic, se.END)

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, left, topic, level = b
        if a is not MALFORMED and a[0] == se.ANSWER:
            return [(1.0, 1.0 / len(left) if a[1] - self.env.first_answer in left else 0.0, True, None)]
        if a is MALFORMED or a[1] != topic or t + 1 == self.T:
            return self._spent(b, (t + 1, left, topic, level))
        n, hit = self.env.num_answers, self.env.task_hit_prob(level)
        out: list[Outcome] = [(1.0 - hit, 0.0, False, (t + 1, left, topic, level))]
        for z in left:  # the answer, uniform over the candidates left; the distractor uniform over the rest
            for d in range(n):
                if d != z:
                    nxt = tuple(j for j in left if j in (z, d))
                    out.append((hit / (len(left) * (n - 1)), 0.0, False, (t + 1, nxt, topic, level)))
        return out


class _MultiHopModel(BeliefModel):
    """b = (turn, depth, node, frontier, dead, seen, answer, hops): ``depth`` is the index of
    the deepest chain entity looked up (-1: none yet; ``hops``: the fact is known), ``node``
    that entity (``n_0`` before), ``frontier`` its two links, ``dead`` the link found dead (-1
    if none), ``seen`` the entities shown so far, ``answer`` the answer id once known (-1),
    ``hops`` the task's chain length (shown in the prompt with ``hop_choices``)."""

    def __init__(self, env: MultiHop) -> None:
        super().__init__(env)
        self.W = [tuple(a) for a in env.well_formed_actions()]

    def initial(self, observation: Sequence[int]) -> Belief:
        hops = (
            self.env.hops if len(observation) == 2 else self.env.hop_choices[int(observation[2]) - self.env.first_level]
        )
        return (0, -1, int(observation[1]), (), -1, frozenset([int(observation[1])]), -1, hops)

    def key(self, b: Belief) -> Any:
        return (b[0], b[1], b[4] != -1, b[7])

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        t, depth, node, frontier, dead, seen, answer, hops = b
        obs = [int(x) for x in observation]
        if len(obs) >= 3 and obs[0] == mh.PAGE:
            entity = obs[1]
            on_chain = entity == node if depth == -1 else entity in frontier and entity != dead
            if obs[2] == mh.FACT and on_chain:
                return (t + 1, hops, entity, (), -1, seen, obs[3], hops)
            if obs[2] == mh.LINKS and on_chain:
                return (t + 1, depth + 1, entity, (obs[3], obs[4]), -1, seen | {obs[3], obs[4]}, -1, hops)
            if obs[2] == mh.DEAD_END and entity in frontier:
                return (t + 1, depth, node, frontier, entity, seen, answer, hops)
        return (t + 1, depth, node, frontier, dead, seen, answer, hops)

    def oracle(self, b: Belief) -> tuple[int, ...]:
        _, depth, node, frontier, dead, _, answer, hops = b
        if depth == hops:
            return (mh.ANSWER, answer, mh.END)
        if depth == -1:
            return (mh.LOOKUP, node, mh.END)
        return (mh.LOOKUP, frontier[1] if frontier[0] == dead else frontier[0], mh.END)

    def _advance(self, b: Belief, entity: int) -> list[Outcome]:
        t, depth, seen, hops = b[0], b[1], b[5], b[7]
        if depth + 1 == hops:
            n = self.env.num_answers
            fact = [(t + 1, depth + 1, entity, (), -1, seen, self.env.first_answer + j, hops) for j in range(n)]
            return self._to(b, [(1.0 / n, f) for f in fact])
        fresh = [e for e in range(mh.FIRST_ENTITY, self.env.first_answer) if e not in seen][:2]
        return self._to(b, [(1.0, (t + 1, depth + 1, entity, tuple(fresh), -1, seen | set(fresh), -1, hops))])

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, depth, node, frontier, dead, seen, answer, hops = b
        if a is not MALFORMED and a[0] == mh.ANSWER:
            if depth == hops:
                return [(1.0, 1.0 if a[1] == answer else 0.0, True, None)]
            return [(1.0, 1.0 / self.env.num_answers, True, None)]
        if a is not MALFORMED and depth < hops:
            entity = a[1]
            if depth == -1 and entity == node:
                return self._advance(b, entity)
            if depth >= 0 and entity in frontier and entity != dead:
                if dead != -1:
                    return self._advance(b, entity)
                found_dead = self._spent(b, (t + 1, depth, node, frontier, entity, seen, answer, hops))
                return [(0.5 * p, r, d, n) for p, r, d, n in found_dead] + [
                    (0.5 * p, r, d, n) for p, r, d, n in self._advance(b, entity)
                ]
        return self._spent(b, (t + 1, depth, node, frontier, dead, seen, answer, hops))


VALUE_STEP = 0.05
"""The resolution of FrozenLake's summary key (:meth:`_FrozenLakeModel.table_key`)."""


class _FrozenLakeModel(BeliefModel):
    """b = (turn, player cell, map)."""

    def __init__(self, env: FrozenLake) -> None:
        super().__init__(env)
        self.W = [tuple(a) for a in env.well_formed_actions()]

    def initial(self, observation: Sequence[int]) -> Belief:
        grid = self.env.parse_grid(observation)
        return (0, grid[1], grid[0])

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        grid = self.env.parse_grid(observation)
        return (b[0] + 1, b[1] if grid is None else grid[1], b[2])

    def oracle(self, b: Belief) -> tuple[int, ...]:
        t, cell, desc = b
        best = fl.solve(desc, self.env.size, self.env.slippery, self.T, (0.0,) * 5, self.env.success_rate)[1]
        return (fl.ANSWER, fl.DIRECTIONS[best[self.T - t][cell]], fl.END)

    def table_key(self, b: Belief, prefix: Sequence[int]) -> tuple[Any, Any]:
        """The reference critic's key of a policy token (``prefix``: the turn's tokens before
        it): the turn and the optimal success from the player's cell, to :data:`VALUE_STEP`;
        once the direction is out, that direction's optimal success instead. The belief itself
        holds the map, which a few rollouts of one task reach; this summary pools the cells of
        every map by how far they are from the goal, and keeps what the turn's move decides."""
        t, cell, desc = b
        prefix = tuple(int(x) for x in prefix)
        value, _ = fl.solve(desc, self.env.size, self.env.slippery, self.T, (0.0,) * 5, self.env.success_rate)
        state = (t, round(value[self.T - t][cell] / VALUE_STEP))
        if not any(action[: len(prefix)] == prefix for action in self.W or ()):
            return state, (len(prefix), "malformed")
        if len(prefix) < 2:
            return state, prefix
        q = 0.0
        for p, reward, _, nxt in self.outcomes(b, (fl.ANSWER, prefix[1], fl.END)):
            q += p * (reward if nxt is None else value[self.T - t - 1][nxt[1]])
        return state, (len(prefix), round(q / VALUE_STEP))

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, cell, desc = b
        if a is MALFORMED:
            return self._spent(b, (t + 1, cell, desc))
        landings = fl._moves(self.env.size, cell, fl.DIRECTIONS.index(a[1]), self.env.slippery)
        out: list[Outcome] = []
        for landing, p in zip(landings, self.env.move_weights(), strict=True):
            kind = desc[landing]
            if kind == fl.GOAL:
                out.append((p, 1.0, True, None))
            elif kind == fl.HOLE or t + 1 == self.T:
                out.append((p, 0.0, True, None))
            else:
                out.append((p, 0.0, False, (t + 1, landing, desc)))
        return out


class _SokobanModel(BeliefModel):
    """b = (turn, player cell, box cells, room). The moves are deterministic: a belief has one
    outcome per action, and a state the room cannot be solved from in the turns left is worth
    0 whatever follows (so the recursion stops there)."""

    def __init__(self, env: Sokoban) -> None:
        super().__init__(env)
        self.W = [tuple(a) for a in env.well_formed_actions()]

    def initial(self, observation: Sequence[int]) -> Belief:
        desc, (player, boxes) = self.env.parse_grid(observation)
        return (0, player, boxes, desc)

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        grid = self.env.parse_grid(observation)
        return (b[0] + 1, *(b[1:3] if grid is None else grid[1]), b[3])

    def _distance(self, desc: tuple[int, ...], state: sk.State, turns: int) -> int | None:
        """The fewest moves to a solution, or None if more than ``turns`` (or none)."""
        d = sk.distances(desc, self.env.size).get(state)
        return d if d is not None and d <= turns else None

    def oracle(self, b: Belief) -> tuple[int, ...]:
        _, player, boxes, desc = b
        return (sk.ANSWER, sk.DIRECTIONS[sk.best_direction(desc, self.env.size, (player, boxes))], sk.END)

    def table_key(self, b: Belief, prefix: Sequence[int]) -> tuple[Any, Any]:
        """The reference critic's key of a policy token (``prefix``: the turn's tokens before
        it): the turns left and the fewest moves to a solution (None: beyond the turns left);
        once the direction is out, the fewest moves after it instead. The belief itself holds
        the room, which a few rollouts of one task reach; this summary pools the rooms by how
        far they are from solved, and keeps what the turn's move decides."""
        t, player, boxes, desc = b
        prefix = tuple(int(x) for x in prefix)
        left = self.T - t
        state = (left, self._distance(desc, (player, boxes), left))
        if not any(action[: len(prefix)] == prefix for action in self.W or ()):
            return state, (len(prefix), "malformed")
        if len(prefix) < 2:
            return state, prefix
        nxt = sk.move(desc, self.env.size, (player, boxes), sk.DIRECTIONS.index(prefix[1]))
        return state, (len(prefix), self._distance(desc, nxt, left - 1))

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, player, boxes, desc = b
        if a is not MALFORMED:
            player, boxes = sk.move(desc, self.env.size, (player, boxes), sk.DIRECTIONS.index(a[1]))
            if self._distance(desc, (player, boxes), 0) == 0:
                return [(1.0, 1.0, True, None)]
        if self._distance(desc, (player, boxes), self.T - t - 1) is None:
            return [(1.0, 0.0, True, None)]
        return [(1.0, 0.0, False, (t + 1, player, boxes, desc))]


# A Coin Collector exit's role, as the history tells it: a wall, the way back toward the chain's
# start, the way on, a dead end, or one of the exits of the deepest room not yet taken.
_WALL, _BACK, _ON, _DEAD, _UNKNOWN = range(5)


class _CoinCollectorModel(BeliefModel):
    """b = (turn, i, dead, deepest, length, roles): the player is in chain room ``i`` (or, when
    ``dead`` is a direction, in the dead end that direction leads to from it), ``deepest`` is
    the deepest chain room reached, ``length`` the task's chain length and ``roles[j]`` the
    role of each exit (north, east, south, west) of chain room ``j <= deepest``. Which
    directions play which role is the seed's draw and does not change a value, so the key drops
    it: (turn, i, in a dead end, deepest, exits of the deepest not yet taken, length)."""

    def __init__(self, env: CoinCollector) -> None:
        super().__init__(env)
        self.W = [tuple(a) for a in env.well_formed_actions()]

    def _room(self, exits: Sequence[int], back: int | None, coin: bool) -> tuple[int, ...]:
        """A newly reached chain room's roles: its exits besides the way back are dead ends in the
        coin's room, else the way on and its dead ends, one unknown among the others."""
        other = _DEAD if coin else _UNKNOWN
        roles = [_WALL] * 4
        for d in exits:
            roles[cc.DIRECTIONS.index(d)] = _BACK if d == back else other
        return _settled(roles)

    def initial(self, observation: Sequence[int]) -> Belief:
        obs = [int(x) for x in observation]
        length = self.env.quest_length
        if self.env.length_choices is not None:
            length = self.env.length_choices[obs[0] - self.env.first_level]
            obs = obs[1:]
        coin = obs[-1] == cc.COIN
        roles = self._room(obs[3 : len(obs) - coin], None, coin)
        return (0, 0, -1, 0, length, (roles,))

    def key(self, b: Belief) -> Any:
        t, i, dead, deepest, length, roles = b
        return (t, i, dead != -1, deepest, roles[deepest].count(_UNKNOWN), length)

    def _role(self, b: Belief, d: int) -> int:
        _, i, dead, _, _, roles = b
        if dead != -1:
            return _BACK if d == cc.reverse(dead) else _WALL
        return int(roles[i][cc.DIRECTIONS.index(d)])

    def update(self, b: Belief, action: Sequence[int], observation: Sequence[int]) -> Belief:
        t, i, dead, deepest, length, roles = b
        obs = [int(x) for x in observation]
        if not obs or obs[0] != cc.ROOM:
            return (t + 1, i, dead, deepest, length, roles)
        d = int(action[1])
        role = self._role(b, d)
        if dead != -1:
            return (t + 1, i, -1, deepest, length, roles)
        if role == _BACK:
            return (t + 1, i - 1, -1, deepest, length, roles)
        if role == _DEAD:
            return (t + 1, i, d, deepest, length, roles)
        if role == _UNKNOWN and len(obs) == 4:  # the way back only, no coin: a dead end
            return (t + 1, i, d, deepest, length, _with(roles, i, d, _DEAD))
        roles = _with(roles, i, d, _ON)
        if i == deepest:
            coin = obs[-1] == cc.COIN
            roles = (*roles, self._room(obs[3 : len(obs) - coin], obs[3], coin))
            deepest += 1
        return (t + 1, i + 1, -1, deepest, length, roles)

    def oracle(self, b: Belief) -> tuple[int, ...]:
        _, i, dead, _, length, roles = b
        if dead != -1:
            return (cc.GO, cc.reverse(dead), cc.END)
        if i == length - 1:
            return (cc.TAKE, cc.COIN, cc.END)
        here = roles[i]
        way = here.index(_ON) if _ON in here else here.index(_UNKNOWN)
        return (cc.GO, cc.DIRECTIONS[way], cc.END)

    def table_key(self, b: Belief, prefix: Sequence[int]) -> tuple[Any, Any]:
        """The reference critic's key of a policy token (``prefix``: the turn's tokens before
        it): the belief's key, and once the direction is out, that direction's role (the
        direction itself means nothing across tasks)."""
        prefix = tuple(int(x) for x in prefix)
        if not any(action[: len(prefix)] == prefix for action in self.W or ()):
            return self.key(b), (len(prefix), "malformed")
        if len(prefix) < 2 or prefix[0] != cc.GO:
            return self.key(b), prefix
        return self.key(b), (2, self._role(b, prefix[1]))

    def _advance(self, b: Belief, d: int) -> list[Outcome]:
        """Through the way on from the deepest room: the next chain room, its exits drawn as the
        map's generator draws them (a uniform set of the three besides the way back)."""
        t, i, _, deepest, length, roles = b
        roles = _with(roles, i, d, _ON)
        back = cc.reverse(d)
        coin = i + 1 == length - 1
        others = [x for x in cc.DIRECTIONS if x != back]
        count = self.env.distractors + (0 if coin else 1)
        layouts = list(itertools.combinations(others, count))
        return self._to(
            b,
            [
                (
                    1.0 / len(layouts),
                    (t + 1, i + 1, -1, deepest + 1, length, (*roles, self._room((back, *ways), back, coin))),
                )
                for ways in layouts
            ],
        )

    def outcomes(self, b: Belief, a: Any) -> list[Outcome]:
        t, i, dead, deepest, length, roles = b
        spent = (t + 1, i, dead, deepest, length, roles)
        if a is MALFORMED:
            return self._spent(b, spent)
        if a[0] == cc.TAKE:
            return [(1.0, 1.0, True, None)] if dead == -1 and i == length - 1 else self._spent(b, spent)
        d = a[1]
        role = self._role(b, d)
        if role == _WALL:
            return self._spent(b, spent)
        if dead != -1:
            return self._to(b, [(1.0, (t + 1, i, -1, deepest, length, roles))])
        if role == _BACK:
            return self._to(b, [(1.0, (t + 1, i - 1, -1, deepest, length, roles))])
        if role == _DEAD:
            return self._to(b, [(1.0, (t + 1, i, d, deepest, length, roles))])
        if role == _ON and i < deepest:
            return self._to(b, [(1.0, (t + 1, i + 1, -1, deepest, length, roles))])
        if role == _ON:
            return self._advance(b, d)
        unknown = roles[i].count(_UNKNOWN)  # the way on is any of them alike
        found = (t + 1, i, d, deepest, length, _with(roles, i, d, _DEAD))
        return [(p / unknown, r, done, nxt) for p, r, done, nxt in self._advance(b, d)] + [
            (p * (unknown - 1) / unknown, r, done, nxt) for p, r, done, nxt in self._to(b, [(1.0, found)])
        ]


def _settled(roles: list[int]) -> tuple[int, ...]:
    """A chain room's roles with what elimination tells: once the way on is known the exits not
    taken are dead ends; when one unknown exit is left and the way on is not known, it is the way on."""
    if _ON in roles:
        roles = [_DEAD if r == _UNKNOWN else r for r in roles]
    elif roles.count(_UNKNOWN) == 1:
        roles[roles.index(_UNKNOWN)] = _ON
    return tuple(roles)


def _with(roles: tuple[tuple[int, ...], ...], i: int, d: int, role: int) -> tuple[tuple[int, ...], ...]:
    """``roles`` with chain room ``i``'s exit ``d`` now known to play ``role``."""
    room = list(roles[i])
    room[cc.DIRECTIONS.index(d)] = role
    return (*roles[:i], _settled(room), *roles[i + 1 :])


def belief_model(env: Any) -> BeliefModel:
    """The belief model of a built-in environment."""
    models: dict[type, type[BeliefModel]] = {
        KeyDoor: _KeyDoorModel,
        GuessNumber: _GuessNumberModel,
        Search: _SearchModel,
        MultiHop: _MultiHopModel,
        FrozenLake: _FrozenLakeModel,
        Sokoban: _SokobanModel,
        CoinCollector: _CoinCollectorModel,
    }
    if type(env) in models:
        return models[type(env)](env)
    raise InvalidConfigError(f"premise: no belief model for {type(env).__name__}")
