"""FrozenLake as RAGEN sets it up (4x4, slippery, random maps), rendered as tokens.

A port of the task, not of the code: the map generator, the slippery moves and the reward
follow the published description and parameters (see docs/envs.md); the randomness is the
project's SplitMix64 stream, so the maps differ from RAGEN's for the same seed number.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError

from .protocol import SeedStream, check_action, check_param, check_probability, check_running, check_seed, uniform

__all__ = ["FrozenLake"]

# Ids: the cells, the row separator, then the action tokens.
FROZEN, HOLE, GOAL, PLAYER, NEWLINE, ERROR, ANSWER, END = range(8)
LEFT, DOWN, RIGHT, UP = 8, 9, 10, 11
DIRECTIONS = (LEFT, DOWN, RIGHT, UP)  # gym's action order 0..3
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (row, column) step of LEFT, DOWN, RIGHT, UP
CHANCE_SEEDS = 1024
"""chance_success() and oracle_success() average the exact per-map values over seeds 0..CHANCE_SEEDS-1."""


def _moves(size: int, cell: int, direction: int, slippery: bool) -> list[int]:
    """The cells the player may land on after ``direction``, with the probabilities of
    :func:`move_weights`: gym's slippery rule is either perpendicular direction or the
    intended one (in that order: left of it, it, right of it)."""
    out = []
    for d in ((direction - 1) % 4, direction, (direction + 1) % 4) if slippery else (direction,):
        row = min(max(cell // size + MOVES[d][0], 0), size - 1)
        column = min(max(cell % size + MOVES[d][1], 0), size - 1)
        out.append(row * size + column)
    return out


def move_weights(slippery: bool, success_rate: float | None) -> tuple[float, ...]:
    """The probabilities of :func:`_moves`' landings: 1 without slipping; gym's 1/3 each with
    ``success_rate`` None; else the intended direction with ``success_rate`` and either
    perpendicular one with half the rest (gym's and RAGEN's ``success_rate``)."""
    if not slippery:
        return (1.0,)
    if success_rate is None:
        return (1.0 / 3.0,) * 3
    return ((1.0 - success_rate) / 2.0, success_rate, (1.0 - success_rate) / 2.0)


@lru_cache(maxsize=4096)
def solve(
    desc: tuple[int, ...],
    size: int,
    slippery: bool,
    turns: int,
    p_move: tuple[float, float, float, float, float],
    success_rate: float | None = None,
) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[int, ...], ...]]:
    """Dynamic programming on one map. ``desc`` holds FROZEN/HOLE/GOAL per cell; the policy
    moves in direction d with probability ``p_move[d]`` and wastes the turn (a malformed
    action) with ``p_move[4]``, unless ``p_move`` is all zeros: then it plays the optimal
    move. Returns ``(value, best)``: ``value[r][cell]`` is the success probability with ``r``
    turns left from ``cell``; ``best[r][cell]`` the optimal direction index (lowest index
    among ties). ``success_rate``: the slip's (:func:`move_weights`)."""
    cells = size * size
    value = [tuple(0.0 for _ in range(cells))]
    best: list[tuple[int, ...]] = [tuple(0 for _ in range(cells))]
    optimal = not any(p_move)
    for _ in range(turns):
        last = value[-1]

        def after(landing: int, last: tuple[float, ...] = last) -> float:
            kind = desc[landing]
            return 1.0 if kind == GOAL else 0.0 if kind == HOLE else last[landing]

        row: list[float] = []
        choice: list[int] = []
        for cell in range(cells):
            if success_rate is None:  # gym's 1/3 each, as it always was computed
                q = [sum(after(c) for c in _moves(size, cell, d, slippery)) / (3 if slippery else 1) for d in range(4)]
            else:
                w = move_weights(slippery, success_rate)
                q = [
                    sum(p * after(c) for p, c in zip(w, _moves(size, cell, d, slippery), strict=True)) for d in range(4)
                ]
            top = max(q)
            choice.append(q.index(top))
            if optimal:
                row.append(top)
            else:
                row.append(sum(p_move[d] * q[d] for d in range(4)) + p_move[4] * last[cell])
        value.append(tuple(row))
        best.append(tuple(choice))
    return tuple(value), tuple(best)


class FrozenLake:
    """Cross a frozen lake to the goal without falling into a hole; the ice is slippery.

    Ids: the cells ``_`` (frozen), ``O`` (hole), ``G`` (goal), ``P`` (player), the row
    separator ``nl``, then ``error answer end`` and the directions ``Left Down Right Up``.

    - ``reset(seed)`` draws a map as RAGEN does: every cell frozen with probability
      ``frozen_prob`` (else a hole), a start and a goal cell uniformly (distinct), redrawn
      until the goal is reachable from the start through frozen cells. The first observation
      is the grid, row by row, rows separated by ``nl`` (``size * size + size - 1`` tokens).
    - A turn is exactly three tokens, ``[answer, direction, end]`` (RAGEN's
      ``<answer>Left</answer>``); anything else is malformed: the observation is ``[error]``
      and the turn is spent.
    - A move is slippery (gym's rule): the player goes in the intended direction or in either
      perpendicular one, 1/3 each, and stays put at the border. With ``success_rate=p`` (gym's
      and RAGEN's option; RAGEN sweeps it) the intended direction has probability p and either
      perpendicular one (1 - p) / 2. The draw comes from the seed's stream.
    - Reaching the goal ends the episode with reward 1.0; a hole ends it with 0.0; otherwise
      the observation is the new grid. After ``max_turns`` turns the episode ends with 0.0.
      The observation returned with ``done`` is empty.

    The oracle plays the optimal move for the turns left (dynamic programming on the map in
    the last grid shown); slips make it fail on some maps.
    """

    name = "frozen_lake"

    def __init__(
        self,
        size: int = 4,
        frozen_prob: float = 0.8,
        slippery: bool = True,
        max_turns: int = 10,
        success_rate: float | None = None,
    ) -> None:
        self.size = check_param("FrozenLake", "size", size, 2)
        self.frozen_prob = check_probability("FrozenLake", "frozen_prob", frozen_prob)
        if not isinstance(slippery, bool):
            raise InvalidConfigError(f"FrozenLake: slippery must be a bool, got {slippery!r}")
        self.slippery = slippery
        self.success_rate = (
            None if success_rate is None else check_probability("FrozenLake", "success_rate", success_rate)
        )
        self.max_turns = check_param("FrozenLake", "max_turns", max_turns, 1)
        self.action_tokens = 3
        self.vocab_size = 12
        self.token_names = ["_", "O", "G", "P", "nl", "error", "answer", "end", "Left", "Down", "Right", "Up"]
        self.desc: tuple[int, ...] = ()
        self.player = 0
        self._stream = SeedStream(0)
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        return (
            f"FrozenLake(size={self.size}, frozen_prob={self.frozen_prob}, slippery={self.slippery}, "
            f"max_turns={self.max_turns}"
            + ("" if self.success_rate is None else f", success_rate={self.success_rate}")
            + ")"
        )

    def move_weights(self) -> tuple[float, ...]:
        """The probabilities of a move's landings (:func:`move_weights`)."""
        return move_weights(self.slippery, self.success_rate)

    def well_formed_actions(self) -> list[tuple[int, int, int]]:
        """Every well-formed action, in gym's order (Left, Down, Right, Up)."""
        return [(ANSWER, d, END) for d in DIRECTIONS]

    def generate(self, seed: int) -> tuple[tuple[int, ...], int, SeedStream]:
        """The map, the start cell and the stream (positioned after the map) for ``seed``."""
        stream = SeedStream(check_seed("FrozenLake", seed))
        cells = self.size * self.size
        while True:
            board = [FROZEN if uniform(stream) < self.frozen_prob else HOLE for _ in range(cells)]
            start, goal = stream.below(cells), stream.below(cells)
            if start == goal:
                continue
            board[start], board[goal] = FROZEN, GOAL
            if self._reachable(board, start):
                return tuple(board), start, stream

    def _reachable(self, board: list[int], start: int) -> bool:
        frontier, seen = [start], {start}
        while frontier:
            cell = frontier.pop()
            for d in range(4):
                for nxt in _moves(self.size, cell, d, False):
                    if board[nxt] == GOAL:
                        return True
                    if board[nxt] != HOLE and nxt not in seen:
                        seen.add(nxt)
                        frontier.append(nxt)
        return False

    def render(self) -> list[int]:
        tokens: list[int] = []
        for cell, kind in enumerate(self.desc):
            if cell and cell % self.size == 0:
                tokens.append(NEWLINE)
            tokens.append(PLAYER if cell == self.player else kind)
        return tokens

    def reset(self, seed: int) -> list[int]:
        self.desc, self.player, self._stream = self.generate(seed)
        self._turn = 0
        self._done = False
        return self.render()

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("FrozenLake", self._turn, self._done)
        command, direction, end = check_action("FrozenLake", self._turn, action, self.action_tokens, self.vocab_size)
        self._turn += 1
        observation = [ERROR]
        if command == ANSWER and end == END and direction in DIRECTIONS:
            landings = _moves(self.size, self.player, DIRECTIONS.index(direction), self.slippery)
            if self.success_rate is None or not self.slippery:
                self.player = landings[self._stream.below(len(landings))]
            else:
                u, weights = uniform(self._stream), self.move_weights()
                index = 0
                while index < len(landings) - 1 and u >= weights[index]:
                    u -= weights[index]
                    index += 1
                self.player = landings[index]
            kind = self.desc[self.player]
            if kind != FROZEN:
                self._done = True
                return [], 1.0 if kind == GOAL else 0.0, True
            observation = self.render()
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        return observation, 0.0, False

    def parse_grid(self, observation: Sequence[int]) -> tuple[tuple[int, ...], int] | None:
        """``(desc, player)`` from a grid observation, or None if it is not one."""
        cells = [t for t in observation if t != NEWLINE]
        if len(observation) != self.size * self.size + self.size - 1 or len(cells) != self.size * self.size:
            return None
        if cells.count(PLAYER) != 1 or any(t not in (FROZEN, HOLE, GOAL, PLAYER) for t in cells):
            return None
        player = cells.index(PLAYER)
        cells[player] = FROZEN
        return tuple(cells), player

    def _values(
        self, desc: tuple[int, ...], p_move: tuple[float, float, float, float, float]
    ) -> tuple[tuple[float, ...], ...]:
        return solve(desc, self.size, self.slippery, self.max_turns, p_move, self.success_rate)[0]

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary: exact
        per map by dynamic programming (each direction's action has probability ``1 / V**3``,
        the rest wastes the turn), averaged over seeds ``0 .. CHANCE_SEEDS-1``."""
        u = 1.0 / float(self.vocab_size) ** 3
        p_move = (u, u, u, u, 1.0 - 4 * u)
        total = 0.0
        for seed in range(CHANCE_SEEDS):
            desc, start, _ = self.generate(seed)
            total += self._values(desc, p_move)[self.max_turns][start]
        return total / CHANCE_SEEDS

    def oracle_success(self) -> float:
        """The oracle's success rate: exact per map, averaged over seeds ``0 .. CHANCE_SEEDS-1``."""
        total = 0.0
        for seed in range(CHANCE_SEEDS):
            desc, start, _ = self.generate(seed)
            total += self._values(desc, (0.0,) * 5)[self.max_turns][start]
        return total / CHANCE_SEEDS

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """The optimal move for the turn after ``observations`` (the observations so far,
        starting with the first), from the last grid shown and the turns left."""
        turn = len(observations) - 1
        if not 0 <= turn < self.max_turns:
            raise InvalidRolloutError(
                f"FrozenLake.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        for observation in reversed(observations):
            grid = self.parse_grid(observation)
            if grid is not None:
                desc, player = grid
                best = solve(desc, self.size, self.slippery, self.max_turns, (0.0,) * 5, self.success_rate)[1]
                return [ANSWER, DIRECTIONS[best[self.max_turns - turn][player]], END]
        raise InvalidRolloutError("FrozenLake.oracle_action: no grid among the observations")
