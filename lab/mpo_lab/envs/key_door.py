"""Key-door corridor: the first turn's answer decides whether the last turn can succeed."""

from __future__ import annotations

from collections.abc import Sequence

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError

from .protocol import SeedStream, check_action, check_param, check_running, check_seed

__all__ = ["KeyDoor"]

# Fixed ids at the bottom of the vocabulary; keys follow, noise fills the rest.
START, CORRIDOR, DOOR, OPEN = 0, 1, 2, 3
FIRST_KEY = 4
KEY_RULES = {"copy": 1, "sum": 2}
"""How many keys the first observation shows, per rule; the door's key is their sum modulo
``num_keys``: under ``copy`` the one key shown, under ``sum`` a skill a policy must learn."""
DEMONSTRATORS = ("exact", "saturate")
"""What the built-in demonstrator (the belief model's oracle, which base policies are cloned
from) knows of the rule: ``exact`` all of it; ``saturate`` the sum without its wrap-around."""


class KeyDoor:
    """A corridor of ``max_turns`` turns with a sparse terminal reward.

    - The first observation is ``[start, key_k]``: it names the key that opens the door
      (``k`` uniform in ``[0, num_keys)`` from the seed). With ``key_rule="sum"`` it is
      ``[start, key_a, key_b]`` (each uniform) and the door's key is ``k = (a + b) mod
      num_keys``: the decisive token is then a function of the prompt to learn, where a copy
      is learnt within a few updates.
    - ``demonstrator`` changes only the built-in demonstrator (:meth:`demonstrated_key`), not
      the task: with ``"saturate"`` (sum rule only) it adds the keys without the wrap-around
      and writes the last key where the sum reaches ``num_keys``. A base cloned from it holds a
      partial skill, and the pairs that wrap are headroom RL must discover.
    - Turn 0 (decisive): the token the policy writes at ``key_position`` is the key it takes.
    - Turns 1 .. max_turns-2 (distractors): each is preceded by ``[corridor, noise...]``
      with 0..``max_noise`` noise ids (length from the seed); the actions do not matter.
    - The last turn is preceded by ``[door]``; the policy must write ``open`` at
      ``open_position``.
    - The episode always lasts ``max_turns`` turns; the last step returns ``([], reward,
      True)`` with reward 1.0 if the key taken at turn 0 was ``key_k`` and ``open`` was
      written, else 0.0. Every other reward is 0.

    Only two of the ``max_turns * action_tokens`` policy tokens matter, so a uniformly random
    policy succeeds with probability ``1 / vocab_size**2``. With the defaults (8 turns of 16
    tokens) the decisive token is 127 policy tokens before the reward: token-level GAE with
    λ = 0.95 carries 0.95**127 ≈ 0.0015 of the terminal signal back to it.
    """

    name = "key_door"

    def __init__(
        self,
        max_turns: int = 8,
        action_tokens: int = 16,
        num_keys: int = 4,
        vocab_size: int = 16,
        key_position: int = 0,
        open_position: int = 0,
        max_noise: int = 3,
        key_rule: str = "copy",
        demonstrator: str = "exact",
    ) -> None:
        if key_rule not in KEY_RULES:
            raise InvalidConfigError(f"KeyDoor: key_rule must be one of {', '.join(KEY_RULES)}, got {key_rule!r}")
        if demonstrator not in DEMONSTRATORS or (demonstrator == "saturate" and key_rule != "sum"):
            raise InvalidConfigError(
                f"KeyDoor: demonstrator must be one of {', '.join(DEMONSTRATORS)} ('saturate' with "
                f"key_rule='sum' only), got {demonstrator!r} with key_rule={key_rule!r}"
            )
        self.key_rule = key_rule
        self.demonstrator = demonstrator
        self.max_turns = check_param("KeyDoor", "max_turns", max_turns, 2)
        self.action_tokens = check_param("KeyDoor", "action_tokens", action_tokens, 1)
        self.num_keys = check_param("KeyDoor", "num_keys", num_keys, 2)
        self.max_noise = check_param("KeyDoor", "max_noise", max_noise, 0)
        # At least one noise id, so corridor observations can vary.
        self.vocab_size = check_param("KeyDoor", "vocab_size", vocab_size, FIRST_KEY + self.num_keys + 1)
        self.key_position = check_param("KeyDoor", "key_position", key_position, 0)
        self.open_position = check_param("KeyDoor", "open_position", open_position, 0)
        for name, position in (("key_position", self.key_position), ("open_position", self.open_position)):
            if position >= self.action_tokens:
                raise InvalidConfigError(
                    f"KeyDoor: {name} must be < action_tokens = {self.action_tokens}, got {position}"
                )
        self.first_noise = FIRST_KEY + self.num_keys
        self.token_names = (
            ["start", "corridor", "door", "open"]
            + [f"key{k}" for k in range(self.num_keys)]
            + [f"noise{i}" for i in range(self.vocab_size - self.first_noise)]
        )
        # (turn, position) of the tokens the reward depends on.
        self.decisive_positions = ((0, self.key_position), (self.max_turns - 1, self.open_position))
        self.target_key: int | None = None
        self._observations: list[list[int]] = []
        self._turn = 0
        self._done = True
        self._key_taken = False

    def __repr__(self) -> str:
        return (
            f"KeyDoor(max_turns={self.max_turns}, action_tokens={self.action_tokens}, num_keys={self.num_keys}, "
            f"vocab_size={self.vocab_size}, key_position={self.key_position}, "
            f"open_position={self.open_position}, max_noise={self.max_noise}"
            + ("" if self.key_rule == "copy" else f", key_rule={self.key_rule!r}")  # the default's repr as before
            + ("" if self.demonstrator == "exact" else f", demonstrator={self.demonstrator!r}")
            + ")"
        )

    def key_token(self, key: int) -> int:
        return FIRST_KEY + key

    def door_key(self, first_observation: Sequence[int]) -> int:
        """The token of the key that opens the door, as the first observation names it."""
        return self.key_token(_shown_sum(first_observation) % self.num_keys)

    def demonstrated_key(self, first_observation: Sequence[int]) -> int:
        """The key token the built-in demonstrator takes (``demonstrator``): the door's key,
        or under ``saturate`` the sum capped at the last key instead of wrapped."""
        if self.demonstrator == "exact":
            return self.door_key(first_observation)
        return self.key_token(min(_shown_sum(first_observation), self.num_keys - 1))

    def reset(self, seed: int) -> list[int]:
        stream = SeedStream(check_seed("KeyDoor", seed))
        shown = [self.key_token(stream.below(self.num_keys)) for _ in range(KEY_RULES[self.key_rule])]
        noise_ids = self.vocab_size - self.first_noise
        # _observations[t] is shown before turn t; the last step returns an empty one.
        self._observations = [[START, *shown]]
        self.target_key = self.door_key(self._observations[0]) - FIRST_KEY
        for _ in range(self.max_turns - 2):
            length = stream.below(self.max_noise + 1)
            noise = [self.first_noise + stream.below(noise_ids) for _ in range(length)]
            self._observations.append([CORRIDOR, *noise])
        self._observations.append([DOOR])
        self._turn = 0
        self._done = False
        self._key_taken = False
        return list(self._observations[0])

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        check_running("KeyDoor", self._turn, self._done)
        tokens = check_action("KeyDoor", self._turn, action, self.action_tokens, self.vocab_size)
        turn = self._turn
        self._turn += 1
        if turn == 0:
            self._key_taken = tokens[self.key_position] == self.key_token(self.target_key)  # type: ignore[arg-type]
        if turn < self.max_turns - 1:
            return list(self._observations[turn + 1]), 0.0, False
        self._done = True
        success = self._key_taken and tokens[self.open_position] == OPEN
        return [], 1.0 if success else 0.0, True

    def chance_success(self) -> float:
        """Success rate of a policy drawing every token uniformly from the vocabulary:
        the key position and the open position must each hit one id of ``vocab_size``."""
        return 1.0 / self.vocab_size**2

    def oracle_action(self, observations: Sequence[Sequence[int]]) -> list[int]:
        """An optimal action for the turn after ``observations`` (the observations so far,
        starting with the first one). Irrelevant positions get the first noise id."""
        turn = len(observations) - 1
        if not 0 <= turn < self.max_turns:
            raise InvalidRolloutError(
                f"KeyDoor.oracle_action: {len(observations)} observations, expected 1..{self.max_turns}"
            )
        action = [self.first_noise] * self.action_tokens
        if turn == 0:
            action[self.key_position] = self.door_key(observations[0])
        if turn == self.max_turns - 1:
            action[self.open_position] = OPEN
        return action


def _shown_sum(first_observation: Sequence[int]) -> int:
    """The sum of the key indices the first observation shows (after ``start``)."""
    return sum(int(t) - FIRST_KEY for t in first_observation[1:])
