"""Coin Collector as TextWorld sets it up (a chain of rooms with dead-end rooms off it), as tokens.

A port of the task, not of the code: the map follows TextWorld's published generator for the
``simple`` distractor mode (levels 1-200 of ``tw-coin_collector``): a chain of ``quest_length``
rooms, each joined to the last through a free exit drawn uniformly, then ``distractors``
dead-end rooms per chain room, handed out along the chain in turn, each through a free exit
drawn uniformly; the coin lies in the chain's last room. The randomness is the project's
SplitMix64 stream, so the maps differ from TextWorld's for the same seed number. What differs
from TextWorld's text (docs/envs.md): a room lists its exits as tokens, the exit the player came
in by first, so that the way back is in the observations.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError

from .protocol import SeedStream, check_action, check_levels, check_param, check_running, check_seed

__all__ = ["CoinCollector", "reverse"]

# Fixed ids; room names follow, then the levels.
ROOM, EXITS, COIN, ERROR, BLOCKED, NOTHING, GO, TAKE, END = range(9)
NORTH, EAST, SOUTH, WEST = 9, 10, 11, 12
DIRECTIONS = (NORTH, EAST, SOUTH, WEST)
FIRST_NAME = 13
MAX_DISTRACTORS = 2
"""TextWorld's ``simple`` mode: at most 2 dead ends beside a room that has a way on and a way back."""


def reverse(direction: int) -> int:
    """The exit that leads back: north <-> south, east <-> west."""
    return DIRECTIONS[(DIRECTIONS.index(direction) + 2) % 4]


class CoinCollector:
    """Walk a chain of rooms to the one with the coin and take it; dead ends branch off the chain.

    Ids: ``room exits coin error blocked nothing go take end north east south west``, then
    ``room0 ..`` (``num_names``) (and ``level0 ..`` with ``length_choices``).

    - Drawn from the seed (with ``length_choices``, first a level ``l`` uniformly: the task's
      chain has ``length_choices[l]`` rooms and the first observation opens with ``level_l``):
      the rooms' names, the chain ``c_0 .. c_{L-1}`` (``c_i`` joined to ``c_{i-1}`` through a
      free exit of ``c_{i-1}`` drawn uniformly, and back through the reverse exit) and
      ``distractors`` dead-end rooms per chain room (each through a free exit of its chain room,
      drawn uniformly). The player starts in ``c_0``; the coin lies in ``c_{L-1}``.
    - A room is shown as ``[room, name, exits, d_1, .., (coin)]``: its exits, the one the
      player came in by first and the others in the order north, east, south, west (the first
      observation: all in that order), and ``coin`` where the coin lies.
    - A turn is exactly three tokens, a command: ``[go, d, end]`` or ``[take, coin, end]``.
      Anything else is malformed: the observation is ``[error]`` and the turn is spent. ``go``
      through a wall gives ``[blocked]``, ``take`` where no coin lies ``[nothing]``; both spend
      the turn.
    - ``[take, coin, end]`` in the coin's room ends the episode with reward 1.0; after
      ``max_turns`` turns it ends with 0.0. The observation returned with ``done`` is empty.

    The oracle walks on along the chain and, in the deepest room reached, tries the exits no
    turn has taken in the order north, east, south, west; a dead end sends it back. No policy
    can tell the way on from a dead end before walking through: each wrong exit costs two
    turns (in and out), and with a budget below ``oracle_turns()`` the dead ends decide: the
    default (5 rooms, 1 dead end each, 9 turns) leaves room for two of the four chances, and
    the oracle succeeds with probability P(at most 2 of 4 fair coins) = 11/16.
    """

    name = "coin_collector"

    def __init__(
        self,
        quest_length: int = 5,
        distractors: int = 1,
        max_turns: int = 9,
        num_names: int = 12,
        length_choices: Sequence[int] | None = None,
    ) -> None:
        self.length_choices = check_levels(
            "CoinCollector",
            "length_choices",
            length_choices,
            "chain lengths",
            lambda n, v: check_param("CoinCollector", n, v, 1),
        )
        self.quest_length = check_param(
            "CoinCollector",
            "quest_length",
            quest_length if self.length_choices is None else max(self.length_choices),
            1,
        )
        self.task_length = self.quest_length
        """The chain length of the task drawn by the last ``reset``."""
        self.distractors = check_param("CoinCollector", "distractors", distractors, 0)
        if self.distractors > MAX_DISTRACTORS:
            raise InvalidConfigError(
                f"CoinCollector: distractors must be <= {MAX_DISTRACTORS} (TextWorld's simple mode), "
                f"got {self.distractors}"
            )
        self.max_turns = check_param("CoinCollector", "max_turns", max_turns, 1)
        self.num_names = check_param("CoinCollector", "num_names", num_names, 1)
        rooms = (1 + self.distractors) * self.quest_length
        if self.num_names < rooms:
            raise InvalidConfigError(
                f"CoinCollector: num_names must be >= (1 + distractors) * quest_length = {rooms}, got {self.num_names}"
            )
        self.action_tokens = 3
        self.first_level = FIRST_NAME + self.num_names
        self.vocab_size = self.first_level + len(self.length_choices or ())
        self.token_names = (
            "room exits coin error blocked nothing go take end north east south west".split()
            + [f"room{k}" for k in range(self.num_names)]
            + [f"level{i}" for i in range(len(self.length_choices or ()))]
        )
        self.chain: list[int] = []
        self.exits: dict[int, dict[int, int]] = {}
        self.player = -1
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        spread = "" if self.length_choices is None else f", length_choices={list(self.length_choices)}"
        return (
            f"CoinCollector(quest_length={self.quest_length}, distractors={self.distractors}, "
            f"max_turns={self.max_turns}, num_names={self.num_names}{spread})"
        )

    def well_formed_actions(self) -> list[tuple[int, int, int]]:
        """Every well-formed action: the four moves, then taking the coin."""
        return [(GO, d, END) for d in DIRECTIONS] + [(TAKE, COIN, END)]

    def oracle_turns(self) -> int:
        """The most turns the oracle needs: the moves along the chain, two per dead end tried, the take."""
        return self.quest_length + 2 * self.distractors * (self.quest_length - 1)

    def reset(self, seed: int) -> list[int]:
        stream = SeedStream(check_seed("CoinCollector", seed))
        level = None if self.length_choices is None else stream.below(len(self.length_choices))
        length = self.task_length = self.quest_length if level is None else self.length_choices[level]  # type: ignore[index]
        pool = list(range(FIRST_NAME, FIRST_NAME + self.num_names))
        names = [pool.pop(stream.below(len(pool))) for _ in range((1 + self.distractors) * length)]
        self.chain = names[:length]
        self.exits = {room: {} for room in names}

        def join(src: int, dest: int) -> None:
            free = [d for d in DIRECTIONS if d not in self.exits[src]]
            way = free[stream.below(len(free))]
            self.exits[src][way] = dest
            self.exits[dest][reverse(way)] = src

        for i in range(1, length):
            join(self.chain[i - 1], self.chain[i])
        for k, dead in enumerate(names[length:]):  # one per chain room in turn, as TextWorld hands them out
            join(self.chain[k % length], dead)
        self.player = self.chain[0]
        self._turn = 0
        self._done = False
        return ([] if level is None else [self.first_level + level]) + self._describe(None)

    def _describe(self, way_in: int | None) -> list[int]:
        exits = sorted(self.exits[self.player], key=lambda d: (d != way_in, d))
        return [ROOM, self.player, EXITS, *exits] + ([COIN] if self.player == self.chain[-1] else [])

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("CoinCollector", self._turn, self._done)
        command, content, end = check_action("CoinCollector", self._turn, action, self.action_tokens, self.vocab_size)
        self._turn += 1
        observation = [ERROR]
        if end == END and command == TAKE and content == COIN:
            if self.player == self.chain[-1]:
                self._done = True
                return [], 1.0, True
            observation = [NOTHING]
        elif end == END and command == GO and content in DIRECTIONS:
            dest = self.exits[self.player].get(content)
            if dest is None:
                observation = [BLOCKED]
            else:
                self.player = dest
                observation = self._describe(reverse(content))
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        return observation, 0.0, False

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary, exact: what
        it has read does not change what it writes, so each command is drawn with probability
        ``q = 1 / V**3`` per turn and the success is a walk over (chain room, in a dead end),
        averaged over the levels (their dynamic programme)."""
        q = float(self.vocab_size) ** -3
        lengths = self.length_choices or (self.quest_length,)
        return sum(self._chance_walk(q, length) for length in lengths) / len(lengths)

    def _chance_walk(self, q: float, length: int) -> float:
        # p[i] = (in chain room i, in one of its dead ends). Each turn moves through each exit with
        # probability q, and takes the coin with q in the last room (the mass that wins leaves).
        p = [(1.0 if i == 0 else 0.0, 0.0) for i in range(length)]
        won = 0.0
        for _ in range(self.max_turns):
            won += p[-1][0] * q
            on = [0.0] * length
            dead = [0.0] * length
            for i, (here, off) in enumerate(p):
                ways = (i > 0) + (i < length - 1) + self.distractors
                on[i] += here * (1.0 - q * ways - (q if i == length - 1 else 0.0)) + off * q
                dead[i] += here * q * self.distractors + off * (1.0 - q)
                if i > 0:
                    on[i - 1] += here * q
                if i < length - 1:
                    on[i + 1] += here * q
            p = list(zip(on, dead, strict=True))
        return won

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """The oracle's action for the turn after ``observations`` (the observations so far,
        starting with the first): take the coin in its room; out of a dead end, back; in a chain
        room behind the deepest one reached, on along the chain; in the deepest, the first exit
        in the order north, east, south, west that no turn has taken. Works from any history."""
        turn = len(observations) - 1
        if not 0 <= turn < self.max_turns:
            raise InvalidRolloutError(
                f"CoinCollector.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        first = [int(t) for t in observations[0]]
        if self.length_choices is not None:
            first = first[1:]
        if len(first) < 3 or first[0] != ROOM or first[2] != EXITS:
            raise InvalidRolloutError(
                f"CoinCollector.oracle_action: unexpected first observation {list(observations[0])}"
            )
        room = first[1]
        shown = {room: first}
        depth = {room: 0}
        ways: dict[int, dict[int, int]] = {room: {}}
        for observation in observations[1:]:
            obs = [int(t) for t in observation]
            if len(obs) >= 4 and obs[0] == ROOM and obs[2] == EXITS:
                came, name = obs[3], obs[1]
                ways[room][reverse(came)] = name
                ways.setdefault(name, {})[came] = room
                if name not in depth and (len(obs) > 4 or name == first[1]):  # more than the way back: on the chain
                    depth[name] = depth[room] + 1
                shown[name], room = obs, name
        here = shown[room]
        if here[-1] == COIN:
            return [TAKE, COIN, END]
        if room not in depth:  # a dead end
            return [GO, here[3], END]
        deepest = max(depth, key=depth.__getitem__)
        if room != deepest:
            on = [d for d, dest in ways[room].items() if depth.get(dest, -1) == depth[room] + 1]
        else:
            on = [d for d in DIRECTIONS if d in here[3:] and d not in ways[room]]
        if not on:
            raise InvalidRolloutError(
                f"CoinCollector.oracle_action: no way on from room id {room}: not a history of this task"
            )
        return [GO, on[0], END]
