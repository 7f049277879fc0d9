"""Does a task meet MPO's premise? Measured before any training, from exact values.

For each built-in task this computes, without training anything:

- the success of a uniformly random token policy (chance), of the oracle, and of a *noisy
  oracle* (the base-policy stand-in): each turn, with probability ``eps``, the oracle's
  action is replaced by a random one -- a uniformly drawn well-formed action or K uniformly
  drawn tokens, half and half (on KeyDoor and GuessNumber every action is well formed, so
  the replacement is K uniform tokens); ``eps`` is chosen so the noisy oracle succeeds
  ``TARGET_SUCCESS`` of the time;
- the exact value ``V(tokens < q)`` of the noisy oracle at every policy token ``q`` of its
  own rollouts (the project's convention, docs/losses.md): the expected return given
  everything before the token -- the observations so far (the critic's posterior over what
  is hidden: the answer, the chain, future hints and slips) and the policy's own tokens so
  far, including the earlier tokens of the same turn;
- on those values, the project's between-turn share (:func:`mpo_rs.diagnose.value_structure`
  and :func:`~mpo_rs.diagnose.summarize_value_structure`) and the share of the squared value increments
  between consecutive policy tokens that falls on turn boundaries (across an observation).

The values are exact, not estimated: each task has a *belief model* here (a small sufficient
state of what the history says, its transitions and its oracle) and the value is computed
by memoized recursion over it; the tests check each model against Monte-Carlo rollouts of
the real environment. Run ``python -m mpo_rs.envs.premise`` (``--help`` for the options);
the table in docs/envs.md is its output.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..diagnose.summary import FAILURE, SUCCESS
from ..exceptions import InvalidConfigError
from . import frozen_lake as fl
from . import multi_hop as mh
from . import search as se
from . import sokoban as sk
from .frozen_lake import FrozenLake
from .guess_number import GuessNumber
from .key_door import OPEN, KeyDoor
from .multi_hop import MultiHop
from .search import Search
from .sokoban import Sokoban

__all__ = [
    "PREMISE_SHARE",
    "TARGET_SUCCESS",
    "TASKS",
    "NoisyOracle",
    "Rollout",
    "belief_model",
    "choose_eps",
    "measure",
    "measure_all",
    "play",
    "premise_verdict",
    "rollout",
    "token_arrays",
]

TARGET_SUCCESS = 0.2
"""The base policy's success the noise is set for (the paper's base models: 9-25%; FrozenLake's
random well-formed moves alone reach 0.17, which rules out a lower target)."""
TASKS = ("search", "multi_hop", "frozen_lake", "sokoban", "guess_number", "key_door")
PREMISE_SHARE = 0.8
"""A task meets MPO's premise when its reference critic's median between-turn share of the
value variance is at least this."""


def premise_verdict(share: float | None) -> str:
    """``"holds"`` when ``share`` (a median between-turn share) meets :data:`PREMISE_SHARE`, else ``"fails"``."""
    return "holds" if share is not None and share >= PREMISE_SHARE else "fails"


MALFORMED = None
"""Stands for every malformed action: they all cost the turn and show ``[error]``."""

Belief = tuple[Any, ...]
Outcome = tuple[float, float, bool, Belief | None]
"""(probability, reward, done, next belief)"""


# ---------------------------------------------------------------- belief models


class _Model:
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

    def _spent(self, b: Belief, nxt: Belief) -> list[Outcome]:
        """The turn is spent: next belief ``nxt``, or the end at the budget."""
        return [(1.0, 0.0, True, None)] if b[0] + 1 == self.T else [(1.0, 0.0, False, nxt)]


class _KeyDoorModel(_Model):
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


class _GuessNumberModel(_Model):
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
        out: list[Outcome] = [(1.0 / n, 1.0, True, None)]
        last = t + 1 == self.T
        if a > lo:
            out.append(((a - lo) / n, 0.0, last, None if last else (t + 1, lo, a - 1)))
        if a < hi:
            out.append(((hi - a) / n, 0.0, last, None if last else (t + 1, a + 1, hi)))
        return out


class _SearchModel(_Model):
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


class _MultiHopModel(_Model):
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
        last = t + 1 == self.T
        if depth + 1 == hops:
            n = self.env.num_answers
            fact = [(t + 1, depth + 1, entity, (), -1, seen, self.env.first_answer + j, hops) for j in range(n)]
            return [(1.0 / n, 0.0, last, None if last else f) for f in fact]
        fresh = [e for e in range(mh.FIRST_ENTITY, self.env.first_answer) if e not in seen][:2]
        nxt = (t + 1, depth + 1, entity, tuple(fresh), -1, seen | set(fresh), -1, hops)
        return [(1.0, 0.0, last, None if last else nxt)]

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


class _FrozenLakeModel(_Model):
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


class _SokobanModel(_Model):
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


def belief_model(env: Any) -> _Model:
    """The belief model of a built-in environment."""
    models: dict[type, type[_Model]] = {
        KeyDoor: _KeyDoorModel,
        GuessNumber: _GuessNumberModel,
        Search: _SearchModel,
        MultiHop: _MultiHopModel,
        FrozenLake: _FrozenLakeModel,
        Sokoban: _SokobanModel,
    }
    if type(env) in models:
        return models[type(env)](env)
    raise InvalidConfigError(f"premise: no belief model for {type(env).__name__}")


# ---------------------------------------------------------------- exact values of the noisy oracle


class NoisyOracle:
    """The noisy oracle's exact values. Per turn: the oracle's action with probability
    ``1 - eps``; with ``eps * well_formed`` a uniformly drawn well-formed action; with
    ``eps * (1 - well_formed)`` K uniformly drawn tokens. ``NoisyOracle(model, 1.0, 0.0)`` is
    the uniformly random policy; ``eps = 0`` the oracle. Where every action is well formed
    (``model.W is None``) both replacements are K uniform tokens."""

    def __init__(self, model: _Model, eps: float, well_formed: float = 0.5) -> None:
        self.model = model
        self.eps = float(eps)
        self.well_formed = 0.0 if model.W is None else float(well_formed)
        self._values: dict[Any, float] = {}
        self._q: dict[tuple[Belief, Any], float] = {}

    def value(self, b: Belief) -> float:
        """V(b): the expected return from a turn boundary."""
        key = self.model.key(b)
        cached = self._values.get(key)
        if cached is None:
            cached = self.prefix_value(b, ())
            self._values[key] = cached
        return cached

    def q(self, b: Belief, a: Any) -> float:
        """Q(b, a): the expected return of action ``a`` (see ``_Model.outcomes``) from ``b``."""
        cached = self._q.get((b, a))
        if cached is None:
            cached = 0.0
            for p, r, done, nxt in self.model.outcomes(b, a):
                cached += p * (r if done or nxt is None else r + self.value(nxt))
            self._q[(b, a)] = cached
        return cached

    def prefix_value(self, b: Belief, prefix: Sequence[int]) -> float:
        """V(b, prefix): the expected return after the first ``len(prefix)`` tokens of the turn.
        The thinking tokens a turn opens with (``model.free``) leave it at the turn's value,
        unless one is not a thinking token (then the turn is malformed)."""
        m = self.model
        if m.free:
            if not m.thought_ok(prefix):
                return self.q(b, MALFORMED)
            prefix = prefix[m.free :]
        i = len(prefix)
        prefix = tuple(int(t) for t in prefix)
        star = m.oracle(b)
        w_oracle = (1.0 - self.eps) * (star[:i] == prefix)
        w_random = self.eps * (1.0 - self.well_formed) * float(m.V) ** -i
        if m.W is None:
            position = m.decisive(b)
            q_star = self.q(b, None if position is None else star[position])
            if position is None:
                c_random = q_star
            elif i > position:
                c_random = self.q(b, prefix[position])
            else:
                c_random = sum(self.q(b, g) for g in range(m.V)) / m.V
            total = w_oracle + w_random
            return (w_oracle * q_star + w_random * c_random) / total
        matching = [a for a in m.W if a[:i] == prefix]
        q_matching = [self.q(b, a) for a in matching]
        w_formed = self.eps * self.well_formed * len(matching) / len(m.W)
        rest = float(m.V) ** -(m.K - i)
        total = w_oracle + w_formed + w_random
        out = w_oracle * self.q(b, star) if w_oracle else 0.0
        if w_formed:
            out += w_formed * sum(q_matching) / len(matching)
        if w_random:
            out += w_random * (rest * sum(q_matching) + (1.0 - rest * len(matching)) * self.q(b, MALFORMED))
        return out / total

    def act(self, b: Belief, rng: np.random.Generator) -> tuple[int, ...]:
        """One turn: the thinking tokens (uniform over ``free_ids``, never noised), then the call."""
        m = self.model
        if m.free:
            thought = tuple(int(m.free_ids[j]) for j in rng.integers(len(m.free_ids), size=m.free))
            return thought + self._call(b, rng)
        return self._call(b, rng)

    def _call(self, b: Belief, rng: np.random.Generator) -> tuple[int, ...]:
        m = self.model
        if rng.random() >= self.eps:
            return m.oracle(b)
        if m.W is not None and rng.random() < self.well_formed:
            return m.W[int(rng.integers(len(m.W)))]
        return tuple(int(t) for t in rng.integers(m.V, size=m.K))


def exact_success(env: Any, eps: float, seeds: Sequence[int], well_formed: float = 0.5) -> float:
    """The noisy oracle's exact success rate averaged over ``seeds`` (eps=1, well_formed=0:
    the uniformly random policy; eps=0: the oracle)."""
    values = NoisyOracle(belief_model(env), eps, well_formed)
    return float(np.mean([values.value(values.model.initial(env.reset(s))) for s in seeds]))


def choose_eps(env: Any, seeds: Sequence[int], target: float = TARGET_SUCCESS) -> float:
    """The noise, to 0.01, whose exact success over ``seeds`` is nearest ``target`` (bisection;
    success falls as eps grows)."""
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        if exact_success(env, mid, seeds) > target:
            lo = mid
        else:
            hi = mid
    grid = sorted({math.floor(lo * 100) / 100, math.ceil(hi * 100) / 100})
    return min(grid, key=lambda e: abs(exact_success(env, e, seeds) - target))


# ---------------------------------------------------------------- rollouts and the statistic


@dataclass
class Rollout:
    """One noisy-oracle episode with the exact value before each policy token."""

    tokens: list[int]
    mask: list[int]
    values: list[float]
    score: float
    turns: int


def rollout(env: Any, values: NoisyOracle, seed: int, rng: np.random.Generator) -> Rollout:
    """Play the noisy oracle on the real environment from ``seed``; the values come from the
    belief model, updated with the real observations."""
    m = values.model
    observation = env.reset(seed)
    b = m.initial(observation)
    tokens, mask, vals = list(observation), [0] * len(observation), [0.0] * len(observation)
    score, turns = 0.0, 0
    for _ in range(m.T):
        action = values.act(b, rng)
        for i, token in enumerate(action):
            tokens.append(token)
            mask.append(1)
            vals.append(values.prefix_value(b, action[:i]))
        observation, reward, done = env.step(list(action))
        score += reward
        turns += 1
        tokens.extend(observation)
        mask.extend([0] * len(observation))
        vals.extend([0.0] * len(observation))
        if done:
            break
        b = m.update(b, action, observation)
    return Rollout(tokens, mask, vals, score, turns)


def play(env: Any, values: NoisyOracle, seed: int, rng: np.random.Generator) -> float:
    """The score of one noisy-oracle episode on the real environment (no values computed)."""
    m = values.model
    b = m.initial(env.reset(seed))
    for _ in range(m.T):
        action = values.act(b, rng)
        observation, reward, done = env.step(list(action))
        if done:
            return float(reward)
        b = m.update(b, action, observation)
    return 0.0


def token_arrays(rollouts: Sequence[Rollout]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values float32, mask uint8, offsets int64) of the rollouts, concatenated."""
    offsets = np.cumsum([0] + [len(r.tokens) for r in rollouts]).astype(np.int64)
    values = np.concatenate([np.asarray(r.values, dtype=np.float32) for r in rollouts])
    mask = np.concatenate([np.asarray(r.mask, dtype=np.uint8) for r in rollouts])
    return values, mask, offsets


def boundary_fraction(rollout: Rollout) -> float:
    """Of the squared value changes between consecutive policy tokens, the fraction across
    turn boundaries (an observation in between); NaN if the values never change."""
    positions = [q for q, m in enumerate(rollout.mask) if m]
    at, total = 0.0, 0.0
    for a, b in itertools.pairwise(positions):
        change = (rollout.values[b] - rollout.values[a]) ** 2
        total += change
        if b != a + 1:
            at += change
    return at / total if total > 0 else math.nan


def largest_change_at_boundary(rollout: Rollout) -> bool | None:
    """Whether the largest change between consecutive policy tokens crosses a turn
    boundary; None if the values never change."""
    positions = [q for q, m in enumerate(rollout.mask) if m]
    steps = [(abs(rollout.values[b] - rollout.values[a]), b != a + 1) for a, b in itertools.pairwise(positions)]
    if not steps or max(s for s, _ in steps) == 0:
        return None
    return max(steps)[1]


def share_statistics(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The project's between-turn statistic on the rollouts' values, and where the jumps are."""
    from ..diagnose import summarize_value_structure as summarize
    from ..diagnose import value_structure

    values, mask, offsets = token_arrays(rollouts)
    vs = value_structure(values, mask, offsets)
    summary = summarize(vs, outcome=np.array([r.score for r in rollouts]))
    fractions = np.array([boundary_fraction(r) for r in rollouts])
    kept = fractions[np.isfinite(fractions)]
    largest = [x for x in (largest_change_at_boundary(r) for r in rollouts) if x is not None]
    return {
        "summary": summary,
        "median_between_share": summary["all"]["median_between_share"],
        "fraction_between_gt_within": summary["all"]["fraction_between_gt_within"],
        "median_abs_jump": summary["all"]["median_abs_jump"],
        "median_boundary_fraction": float(np.median(kept)) if kept.size else None,
        "largest_change_at_boundary": float(np.mean(largest)) if largest else None,
        "median_between_share_success": summary["by_outcome"][SUCCESS]["median_between_share"],
        "median_between_share_failure": summary["by_outcome"][FAILURE]["median_between_share"],
    }


# ---------------------------------------------------------------- the measurement


def measure(
    name: str,
    *,
    exact_seeds: int = 512,
    rollouts: int = 1024,
    seed: int = 0,
    eps: float | None = None,
    target: float = TARGET_SUCCESS,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Chance, oracle and noisy-oracle success and the between-turn statistics of ``name``
    (default parameters). Exact values average over seeds ``0 .. exact_seeds-1``; the
    rollouts use seeds ``10**6 + i`` and ``numpy.random.default_rng(seed)`` for the noise."""
    from . import make

    env = make(name, **(params or {}))
    seeds = range(exact_seeds)
    eps = choose_eps(env, seeds, target) if eps is None else eps
    values = NoisyOracle(belief_model(env), eps)
    rng = np.random.default_rng(seed)
    played = [rollout(env, values, 10**6 + i, rng) for i in range(rollouts)]
    stats = share_statistics(played)
    return {
        "task": name,
        "env": repr(env),
        "turns": env.max_turns,
        "action_tokens": env.action_tokens,
        "vocab_size": env.vocab_size,
        "chance_success": exact_success(env, 1.0, seeds, well_formed=0.0),
        "chance_success_formula": float(env.chance_success()),
        "oracle_success": exact_success(env, 0.0, seeds),
        "eps": eps,
        "base_success": exact_success(env, eps, seeds),
        "base_success_rollouts": float(np.mean([r.score for r in played])),
        "mean_turns_rollouts": float(np.mean([r.turns for r in played])),
        "exact_seeds": exact_seeds,
        "rollouts": rollouts,
        "rng_seed": seed,
        **{k: v for k, v in stats.items() if k != "summary"},
        "trajectories_kept": stats["summary"]["all"]["trajectories"],
    }


def measure_all(**kwargs: Any) -> list[dict[str, Any]]:
    return [measure(name, **kwargs) for name in TASKS]


def table(results: Sequence[dict[str, Any]]) -> str:
    """The results as the Markdown table of docs/envs.md."""

    def f(x: Any, digits: int = 3) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [
        "| task | turns × tokens | chance | oracle | eps | base (exact) | base (rollouts) "
        "| median between-turn share | (successes / failures) | between > within | boundary share of ΔV² "
        "| largest step at a boundary | premise |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        share = r["median_between_share"]
        verdict = premise_verdict(share)
        lines.append(
            f"| `{r['task']}` | {r['turns']} × {r['action_tokens']} | {r['chance_success']:.2g} | "
            f"{f(r['oracle_success'])} | {r['eps']:.2f} | {f(r['base_success'])} | "
            f"{f(r['base_success_rollouts'])} | **{f(share)}** | {f(r['median_between_share_success'], 2)} / "
            f"{f(r['median_between_share_failure'], 2)} | {f(r['fraction_between_gt_within'])} | "
            f"{f(r['median_boundary_fraction'])} | {f(r['largest_change_at_boundary'])} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mpo_rs.envs.premise",
        description="Measure each built-in task's premise (chance, oracle and base success; between-turn share of "
        "the exact values of a noisy oracle) before any training.",
    )
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated registry names")
    parser.add_argument("--exact-seeds", type=int, default=512, help="seeds 0..N-1 for the exact success rates")
    parser.add_argument("--rollouts", type=int, default=1024, help="noisy-oracle rollouts (seeds 10**6 + i)")
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the rollouts' noise")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    unknown = [name for name in args.tasks.split(",") if name not in TASKS]
    if unknown:
        parser.error(f"--tasks: no belief model for {', '.join(unknown)}; known: {', '.join(TASKS)}")
    results = [
        measure(name, exact_seeds=args.exact_seeds, rollouts=args.rollouts, seed=args.seed)
        for name in args.tasks.split(",")
    ]
    print(table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
