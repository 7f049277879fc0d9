"""A tiny multi-turn environment of your own, for ``mpo-rs reproduce --env examples.my_env:make``.

The vault: a secret digit is hidden; each turn the policy writes two tokens, a command and
an argument. ``ASK _`` returns a hint that is the secret with probability ``hint_accuracy``
(else a random digit); ``ANSWER d`` ends the episode with reward 1 if d is the secret; any
other command is a malformed turn and gets ``ERROR``. The information arrives in the
observations (the hints), where MPO's premise says the value moves.

It needs nothing from mpo_rs: any object with ``vocab_size``, ``action_tokens``,
``max_turns``, ``reset(seed)`` and ``step(action)`` is a ``MultiTurnEnv`` (docs/envs.md).
Run from the repository root (``python examples/my_env.py`` plays one episode)::

    mpo-rs reproduce --env examples.my_env:make --arms mpo,ppo,grpo --budget small --out my-run

The arms start from a random initialisation unless you give them a base policy: with
``--demonstrator examples.my_env:demonstrate`` they start from a policy behaviour-cloned
from :func:`demonstrate`'s episodes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

ASK, ANSWER, ERROR, PROMPT = 0, 1, 2, 3
DIGITS = 4
"""Token ids: the commands, the error and the prompt, then the digits from DIGITS up."""


class Vault:
    action_tokens = 2

    def __init__(self, num_values: int = 4, max_turns: int = 4, hint_accuracy: float = 0.75) -> None:
        self.num_values, self.max_turns, self.hint_accuracy = num_values, max_turns, hint_accuracy
        self.vocab_size = DIGITS + num_values
        self._rng = random.Random(0)
        self._secret, self._turn = 0, 0

    def reset(self, seed: int) -> list[int]:
        self._rng = random.Random(seed)  # the episode depends only on the seed and the actions
        self._secret, self._turn = self._rng.randrange(self.num_values), 0
        return [PROMPT]

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        command, argument = (int(t) for t in action)
        self._turn += 1
        last = self._turn >= self.max_turns
        if command == ANSWER and argument >= DIGITS:
            return [], float(argument - DIGITS == self._secret), True
        if command == ASK:
            right = self._rng.random() < self.hint_accuracy
            hint = self._secret if right else self._rng.randrange(self.num_values)
            return [DIGITS + hint], 0.0, last
        return [ERROR], 0.0, last


def make(**params: object) -> Vault:
    """The factory ``--env`` names; ``--env-param KEY=VALUE`` become its keyword arguments."""
    return Vault(**params)  # type: ignore[arg-type]


def demonstrate(observations: Sequence[Sequence[int]], rng: Any = None) -> list[int]:
    """The demonstrator ``--demonstrator`` names: the observations so far (the prompt first) to
    the next action. It asks twice and answers the hint heard most (the last on a tie); with
    ``rng`` (a numpy Generator reproduce passes), a hasty quarter of its episodes answer the
    first hint, so the clone has something left to learn."""
    hints = [obs[0] - DIGITS for obs in observations[1:] if obs and obs[0] >= DIGITS]
    hasty = rng is not None and len(hints) == 1 and rng.random() < 0.25
    if len(hints) < 2 and not hasty:
        return [ASK, DIGITS]
    guess = max(reversed(hints), key=hints.count)  # the most heard; on a tie the last
    return [ANSWER, DIGITS + guess]


if __name__ == "__main__":
    # One episode of a fixed policy (ask twice, answer the last hint), as the tools see it.
    env = make()
    obs = env.reset(seed=1)
    print(
        f"reset(seed=1) -> {obs}   (vocab_size {env.vocab_size}, {env.max_turns} turns of {env.action_tokens} tokens)"
    )
    hint, done, reward = DIGITS, False, 0.0
    for action in ([ASK, DIGITS], [ASK, DIGITS], None):
        action = action or [ANSWER, hint]
        obs, reward, done = env.step(action)
        print(f"step({action}) -> observation {obs}, reward {reward}, done {done}")
        hint = obs[0] if obs and obs[0] >= DIGITS else hint
        if done:
            break
    print(f"episode over: reward {reward}. Train on it: mpo-rs reproduce --env examples.my_env:make --budget small")
