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
- ``search`` (:class:`Search`): the answer arrives only as noisy hints in search results.
- ``multi_hop`` (:class:`MultiHop`): follow a chain of links; a wrong hop shows up as a dead
  end and must be backtracked.
- ``frozen_lake`` (:class:`FrozenLake`): RAGEN's FrozenLake 4x4 slippery, as tokens.
- ``sokoban`` (:class:`Sokoban`): RAGEN's Sokoban, 6x6 rooms with one box, as tokens.
- ``coin_collector`` (:class:`CoinCollector`): TextWorld's Coin Collector, a chain of rooms with
  dead ends off it, as tokens.
"""

from __future__ import annotations

import inspect
from typing import Any

from mpo_rs.exceptions import InvalidConfigError

from .coin_collector import CoinCollector
from .frozen_lake import FrozenLake
from .guess_number import GuessNumber
from .key_door import KeyDoor
from .multi_hop import MultiHop
from .protocol import Episode, MultiTurnEnv, Policy, render_episode, run_episode
from .search import Search
from .sokoban import Sokoban
from .text import TextEnv, TokenizedTextEnv
from .vector import VectorEnv

__all__ = [
    "ENVIRONMENTS",
    "CoinCollector",
    "Episode",
    "FrozenLake",
    "GuessNumber",
    "KeyDoor",
    "MultiHop",
    "MultiTurnEnv",
    "Policy",
    "Search",
    "Sokoban",
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
    Search.name: Search,
    MultiHop.name: MultiHop,
    FrozenLake.name: FrozenLake,
    Sokoban.name: Sokoban,
    CoinCollector.name: CoinCollector,
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
