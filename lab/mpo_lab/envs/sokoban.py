"""Sokoban as RAGEN sets it up (6x6 rooms, one box, procedurally generated), rendered as tokens.

A port of the task, not of the code: the room generator follows gym-sokoban's published
description (a random-walk topology, boxes placed on their targets, then played backwards by
pulls), RAGEN's parameters and symbols (see docs/envs.md); the randomness is the project's
SplitMix64 stream, so the rooms differ from RAGEN's for the same seed number. The dynamics are
deterministic: the only luck in an episode is the policy's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import lru_cache
from itertools import permutations

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError

from .protocol import SeedStream, check_action, check_param, check_running, check_seed, uniform

__all__ = ["Sokoban", "distances", "move"]

# Ids: the cells in gym-sokoban's order (RAGEN's grid_lookup), the row separator, then the actions.
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET, NEWLINE, ERROR, ANSWER, END = range(11)
UP, DOWN, LEFT, RIGHT = 11, 12, 13, 14
DIRECTIONS = (UP, DOWN, LEFT, RIGHT)  # RAGEN's action order 1..4 (0 is its no-op)
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # (row, column) step of UP, DOWN, LEFT, RIGHT
CHANCE_SEEDS = 1024
"""chance_success() and oracle_success() average the exact per-room values over seeds 0..CHANCE_SEEDS-1."""
CHANGE_DIRECTION = 0.35
"""gym-sokoban's ``p_change_directions`` of the topology's random walk."""
WALK_STEPS_PER_SIDE = 1.7
"""gym-sokoban's walk length: ``int(1.7 * (rows + columns))`` steps."""
MASKS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
"""The floor patterns the walk carves around its position (gym-sokoban's five 3x3 masks)."""
MAX_DRAWS = 1000
"""Rooms drawn for one seed before the parameters are declared unable to make one."""

State = tuple[int, tuple[int, ...]]
"""(player cell, sorted box cells)"""


def move(desc: tuple[int, ...], size: int, state: State, direction: int) -> State:
    """The state after moving in ``direction`` (an index into :data:`MOVES`): the player walks,
    or pushes a box one cell if the cell behind it is free; into a wall, or a box that cannot
    move, it stays put (the turn is spent)."""
    player, boxes = state
    step = MOVES[direction][0] * size + MOVES[direction][1]
    nxt = player + step
    if desc[nxt] == WALL:
        return state
    if nxt not in boxes:
        return nxt, boxes
    beyond = nxt + step
    if desc[beyond] == WALL or beyond in boxes:
        return state
    return nxt, tuple(sorted(beyond if b == nxt else b for b in boxes))


def _pulls(desc: tuple[int, ...], size: int, state: State) -> list[State]:
    """The states one move before ``state``: the inverse of :func:`move` (the player steps
    back, pulling the box in front of it or not)."""
    player, boxes = state
    out = []
    for dr, dc in MOVES:
        step = dr * size + dc
        back = player - step
        if desc[back] == WALL or back in boxes:
            continue
        out.append((back, boxes))
        if player + step in boxes:
            out.append((back, tuple(sorted(player if b == player + step else b for b in boxes))))
    return out


def _targets(desc: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(cell for cell, kind in enumerate(desc) if kind == TARGET)


@lru_cache(maxsize=4096)
def distances(desc: tuple[int, ...], size: int) -> dict[State, int]:
    """The fewest moves from every state the room can still be solved from to a solved one
    (every box on a target, the player anywhere): a breadth-first search backwards from all
    solved states. A state missing here is a deadlock."""
    targets = _targets(desc)
    frontier = deque((cell, targets) for cell, kind in enumerate(desc) if kind == FLOOR)
    dist: dict[State, int] = dict.fromkeys(frontier, 0)
    while frontier:
        state = frontier.popleft()
        for before in _pulls(desc, size, state):
            if before not in dist:
                dist[before] = dist[state] + 1
                frontier.append(before)
    return dist


def best_direction(desc: tuple[int, ...], size: int, state: State) -> int:
    """The optimal move's index: the one leading nearest a solved state (the lowest index among
    ties; a deadlock's every move ties)."""
    dist = distances(desc, size)
    far = len(desc) ** 4  # beyond any distance: a deadlock
    ahead = [dist.get(move(desc, size, state, d), far) for d in range(4)]
    return ahead.index(min(ahead))


def _displacement(boxes: tuple[int, ...], targets: tuple[int, ...], size: int) -> int:
    """The boxes' Manhattan distance from the targets, matched at least cost."""
    return min(
        sum(abs(b // size - t // size) + abs(b % size - t % size) for b, t in zip(boxes, order, strict=True))
        for order in permutations(targets)
    )


@lru_cache(maxsize=65536)
def _success(desc: tuple[int, ...], size: int, state: State, turns: int, p_move: tuple[float, ...]) -> float:
    """The success probability within ``turns`` of a policy moving in direction d with
    probability ``p_move[d]`` and wasting the turn otherwise."""
    if distances(desc, size).get(state, turns + 1) > turns:
        return 0.0
    targets = _targets(desc)
    total = (1.0 - sum(p_move)) * _success(desc, size, state, turns - 1, p_move)
    for d, p in enumerate(p_move):
        nxt = move(desc, size, state, d)
        total += p * (1.0 if nxt[1] == targets else _success(desc, size, nxt, turns - 1, p_move))
    return total


class Sokoban:
    """Push every box onto a target; a box pushed into a corner can never come out.

    Ids: the cells ``# _ O √ X P S`` (wall, floor, target, box on target, box, player, player
    on target: RAGEN's symbols), the row separator ``nl``, then ``error answer end`` and the
    directions ``Up Down Left Right``.

    - ``reset(seed)`` draws a room as gym-sokoban does: floor carved by a random walk inside a
      wall border, the targets and the player on distinct floor cells, the boxes on the
      targets; then the room is played backwards (the player steps back, pulling a box or
      not) for at most ``search_depth`` moves and the reachable state whose boxes lie farthest
      from the targets (distance times boxes off target) is the start, drawn among ties. A
      room no state of which moves a box is redrawn. ``search_depth <= max_turns``, so every
      room can be solved within the budget. The first observation is the room, row by row,
      rows separated by ``nl`` (``size * size + size - 1`` tokens).
    - A turn is exactly three tokens, ``[answer, direction, end]`` (RAGEN's
      ``<answer>Up</answer>``); anything else is malformed: the observation is ``[error]``
      and the turn is spent.
    - A move walks or pushes one box; into a wall or an immovable box the player stays put.
    - Every box on a target ends the episode with reward 1.0; otherwise the observation is the
      new room. After ``max_turns`` turns the episode ends with 0.0. The observation returned
      with ``done`` is empty.

    The oracle plays a shortest solution (breadth-first search over (player, boxes) on the room
    of the last grid shown); it solves every room.
    """

    name = "sokoban"

    def __init__(self, size: int = 6, num_boxes: int = 1, max_turns: int = 10, search_depth: int | None = None) -> None:
        self.size = check_param("Sokoban", "size", size, 4)
        self.num_boxes = check_param("Sokoban", "num_boxes", num_boxes, 1)
        self.max_turns = check_param("Sokoban", "max_turns", max_turns, 1)
        depth = self.max_turns if search_depth is None else check_param("Sokoban", "search_depth", search_depth, 1)
        if depth > self.max_turns:
            raise InvalidConfigError(f"Sokoban: search_depth must be <= max_turns = {self.max_turns}, got {depth}")
        self.search_depth = depth
        self.action_tokens = 3
        self.observation_tokens = self.size * self.size + self.size - 1
        """The longest observation (and the prompt): the room, a newline after each row but the last."""
        self.vocab_size = 15
        self.token_names = "# _ O √ X P S nl error answer end Up Down Left Right".split()
        self.desc: tuple[int, ...] = ()
        self.state: State = (0, ())
        self._turn = 0
        self._done = True

    def __repr__(self) -> str:
        return (
            f"Sokoban(size={self.size}, num_boxes={self.num_boxes}, max_turns={self.max_turns}, "
            f"search_depth={self.search_depth})"
        )

    def well_formed_actions(self) -> list[tuple[int, int, int]]:
        """Every well-formed action, in RAGEN's order (Up, Down, Left, Right)."""
        return [(ANSWER, d, END) for d in DIRECTIONS]

    # ------------------------------------------------------------ the room generator

    def _topology(self, stream: SeedStream) -> list[int]:
        n = self.size
        desc = [WALL] * (n * n)
        row, column = 1 + stream.below(n - 2), 1 + stream.below(n - 2)
        direction = stream.below(4)
        for _ in range(int(WALK_STEPS_PER_SIDE * 2 * n)):
            if uniform(stream) < CHANGE_DIRECTION:
                direction = stream.below(4)
            row = min(max(row + MOVES[direction][0], 1), n - 2)
            column = min(max(column + MOVES[direction][1], 1), n - 2)
            for dr, dc in MASKS[stream.below(len(MASKS))]:
                if 1 <= row + dr <= n - 2 and 1 <= column + dc <= n - 2:
                    desc[(row + dr) * n + column + dc] = FLOOR
        return desc

    def _reverse_play(self, desc: tuple[int, ...], start: State) -> list[State]:
        """The states within ``search_depth`` backward moves of ``start``, breadth first."""
        seen, frontier = {start}, [start]
        for _ in range(self.search_depth):
            nxt = []
            for state in frontier:
                for before in _pulls(desc, self.size, state):
                    if before not in seen:
                        seen.add(before)
                        nxt.append(before)
            frontier = nxt
        return sorted(seen)

    def generate(self, seed: int) -> tuple[tuple[int, ...], State]:
        """The room (WALL/FLOOR/TARGET per cell) and the start state for ``seed``."""
        stream = SeedStream(check_seed("Sokoban", seed))
        for _ in range(MAX_DRAWS):
            desc = self._topology(stream)
            floor = [cell for cell, kind in enumerate(desc) if kind == FLOOR]
            if len(floor) <= self.num_boxes + 1:
                continue
            placed = [floor.pop(stream.below(len(floor))) for _ in range(self.num_boxes + 1)]
            targets, player = tuple(sorted(placed[1:])), placed[0]
            for cell in targets:
                desc[cell] = TARGET
            room = tuple(desc)
            scores = {}
            for player_at, boxes in self._reverse_play(room, (player, targets)):
                off = sum(b not in targets for b in boxes)
                if off:
                    scores[(player_at, boxes)] = off * _displacement(boxes, targets, self.size)
            if scores:
                top = max(scores.values())
                ties = [s for s, v in scores.items() if v == top]
                return room, ties[stream.below(len(ties))]
        raise InvalidConfigError(f"{self!r}: no room with a box to move after {MAX_DRAWS} draws")

    # ------------------------------------------------------------ the episode

    def render(self) -> list[int]:
        player, boxes = self.state
        tokens: list[int] = []
        for cell, kind in enumerate(self.desc):
            if cell and cell % self.size == 0:
                tokens.append(NEWLINE)
            target = kind == TARGET
            if cell == player:
                tokens.append(PLAYER_ON_TARGET if target else PLAYER)
            elif cell in boxes:
                tokens.append(BOX_ON_TARGET if target else BOX)
            else:
                tokens.append(kind)
        return tokens

    def reset(self, seed: int) -> list[int]:
        self.desc, self.state = self.generate(seed)
        self._turn = 0
        self._done = False
        return self.render()

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("Sokoban", self._turn, self._done)
        command, direction, end = check_action("Sokoban", self._turn, action, self.action_tokens, self.vocab_size)
        self._turn += 1
        observation = [ERROR]
        if command == ANSWER and end == END and direction in DIRECTIONS:
            self.state = move(self.desc, self.size, self.state, DIRECTIONS.index(direction))
            if self.state[1] == _targets(self.desc):
                self._done = True
                return [], 1.0, True
            observation = self.render()
        if self._turn == self.max_turns:
            self._done = True
            return [], 0.0, True
        return observation, 0.0, False

    def parse_grid(self, observation: Sequence[int]) -> tuple[tuple[int, ...], State] | None:
        """``(desc, (player, boxes))`` from a grid observation, or None if it is not one."""
        cells = [int(t) for t in observation if t != NEWLINE]
        if len(observation) != self.size * self.size + self.size - 1 or len(cells) != self.size * self.size:
            return None
        players = [c for c, t in enumerate(cells) if t in (PLAYER, PLAYER_ON_TARGET)]
        if len(players) != 1 or any(t > PLAYER_ON_TARGET for t in cells):
            return None
        boxes = tuple(c for c, t in enumerate(cells) if t in (BOX, BOX_ON_TARGET))
        under = {PLAYER: FLOOR, PLAYER_ON_TARGET: TARGET, BOX: FLOOR, BOX_ON_TARGET: TARGET}
        return tuple(under.get(t, t) for t in cells), (players[0], boxes)

    # ------------------------------------------------------------ oracle and chance

    def _exact(self, p_move: tuple[float, ...]) -> float:
        total = 0.0
        for seed in range(CHANCE_SEEDS):
            desc, start = self.generate(seed)
            total += _success(desc, self.size, start, self.max_turns, p_move)
        return total / CHANCE_SEEDS

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary: exact per
        room by dynamic programming (each direction's action has probability ``1 / V**3``, the
        rest wastes the turn), averaged over seeds ``0 .. CHANCE_SEEDS-1``."""
        u = 1.0 / float(self.vocab_size) ** 3
        return self._exact((u,) * 4)

    def oracle_success(self) -> float:
        """The oracle's success rate over seeds ``0 .. CHANCE_SEEDS-1``: the share of rooms
        solvable within ``max_turns`` (all of them, by the generator's depth)."""
        solved = 0
        for seed in range(CHANCE_SEEDS):
            desc, start = self.generate(seed)
            solved += distances(desc, self.size).get(start, self.max_turns + 1) <= self.max_turns
        return solved / CHANCE_SEEDS

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """A shortest solution's next move from the last grid among ``observations`` (the
        observations so far, starting with the first)."""
        if not 0 < len(observations) <= self.max_turns:
            raise InvalidRolloutError(
                f"Sokoban.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        for observation in reversed(observations):
            grid = self.parse_grid(observation)
            if grid is not None:
                return [ANSWER, DIRECTIONS[best_direction(grid[0], self.size, grid[1])], END]
        raise InvalidRolloutError("Sokoban.oracle_action: no grid among the observations")
