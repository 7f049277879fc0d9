"""Multi-turn environments over token ids (numpy only), for sampling and experiments.

The protocol (see docs/envs.md): an env declares ``vocab_size``, ``action_tokens`` (K) and
``max_turns``; ``reset(seed)`` returns the first observation's token ids and
``step(action)`` takes exactly K ids and returns ``(observation, reward, done)``.
Episodes are deterministic given the seed.

Built-in environments, by registry name:

- ``key_door`` (:class:`KeyDoor`): the first turn's answer decides whether the last turn
  can succeed; distractor turns in between; one terminal reward.
- ``guess_number`` (:class:`GuessNumber`): find a hidden number from higher/lower feedback
  within a turn budget; the episode ends on success.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..exceptions import InvalidConfigError
from .guess_number import GuessNumber
from .key_door import KeyDoor
from .protocol import Episode, MultiTurnEnv, Policy, render_episode, run_episode
from .text import TextEnv, TokenizedTextEnv
from .vector import VectorEnv

__all__ = [
    "ENVIRONMENTS",
    "Episode",
    "GuessNumber",
    "KeyDoor",
    "MultiTurnEnv",
    "Policy",
    "TextEnv",
    "TokenizedTextEnv",
    "VectorEnv",
    "chance_success",
    "make",
    "render_episode",
    "run_episode",
]

ENVIRONMENTS: dict[str, type] = {
    KeyDoor.name: KeyDoor,
    GuessNumber.name: GuessNumber,
}
"""Registry name -> environment class; ``make(name, **params)`` builds one."""


def make(name: str, **params: Any) -> Any:
    """The environment registered as ``name``, built with ``params``.

    Raises InvalidConfigError (a ValueError) for an unknown name or parameter, or a
    parameter out of its domain.
    """
    try:
        cls = ENVIRONMENTS[name]
    except (KeyError, TypeError):
        raise InvalidConfigError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVIRONMENTS))}") from None
    accepted = list(inspect.signature(cls).parameters)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise InvalidConfigError(f"{name}: unknown parameter(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}")
    return cls(**params)


def chance_success(name: str, **params: Any) -> float:
    """The success rate of a uniformly random policy on ``make(name, **params)``."""
    return float(make(name, **params).chance_success())
