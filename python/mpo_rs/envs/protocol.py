"""The multi-turn protocol: what an environment declares and what one episode is.

An episode is ``obs0 = env.reset(seed)``, then, until ``done``, the policy writes exactly
``env.action_tokens`` token ids and ``env.step(action)`` answers ``(observation, reward,
done)``. Token ids are ints in ``[0, env.vocab_size)``. The episode ends after
``env.max_turns`` turns at the latest; the observation returned with ``done=True`` may be
empty. Given the seed, an episode depends only on the actions.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..exceptions import InvalidConfigError, InvalidRolloutError

__all__ = [
    "Episode",
    "MultiTurnEnv",
    "Policy",
    "SeedStream",
    "check_action",
    "check_param",
    "check_probability",
    "check_seed",
    "render_episode",
    "run_episode",
    "uniform",
]


@runtime_checkable
class MultiTurnEnv(Protocol):
    """A seeded, deterministic multi-turn environment over token ids.

    Any object with these attributes and methods plugs into the sampler and
    :class:`~mpo_rs.envs.VectorEnv`; subclassing is not needed.
    """

    vocab_size: int
    """Ids the env emits and accepts are in ``[0, vocab_size)``."""
    action_tokens: int
    """K: the policy writes exactly K tokens per turn."""
    max_turns: int
    """The episode ends after this many turns at the latest."""

    def reset(self, seed: int) -> list[int]:
        """Start an episode; return the first observation (the prompt)."""
        ...

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        """Apply one turn's K tokens; return (observation, reward, done)."""
        ...


Policy = Callable[[list[list[int]], list[list[int]]], Sequence[int]]
"""``policy(observations, actions) -> action``: the observations so far (one more than the
actions) and the actions so far; returns the next turn's K tokens."""


class SeedStream:
    """Integers drawn from a seed with SplitMix64: a few lines of arithmetic, so an
    episode stays the same across Python and numpy versions."""

    _MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self._state = seed & self._MASK

    def below(self, n: int) -> int:
        """An int in ``[0, n)`` (bias below 2**-50 for the small n used here)."""
        self._state = (self._state + 0x9E3779B97F4A7C15) & self._MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self._MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self._MASK
        return (z ^ (z >> 31)) % n


def check_param(env_name: str, name: str, value: object, minimum: int) -> int:
    """A constructor parameter as an int >= ``minimum``, or an InvalidConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidConfigError(f"{env_name}: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_seed(env_name: str, seed: object) -> int:
    """The seed as a non-negative int, or an InvalidConfigError naming the env."""
    try:
        value = operator.index(seed)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidConfigError(f"{env_name}.reset: seed must be a non-negative int, got {seed!r}") from None
    if value < 0:
        raise InvalidConfigError(f"{env_name}.reset: seed must be a non-negative int, got {value}")
    return value


def check_action(env_name: str, turn: int, action: object, action_tokens: int, vocab_size: int) -> list[int]:
    """The action as a list of ``action_tokens`` ints in ``[0, vocab_size)``.

    Raises InvalidRolloutError naming the env and the (0-based) turn on a wrong length, a non-integer
    token or an id out of range. Accepts lists, tuples, numpy arrays and 1-D integer tensors.
    """
    where = f"{env_name} turn {turn}"
    if isinstance(action, (str, bytes)) or not hasattr(action, "__len__"):
        raise InvalidRolloutError(
            f"{where}: action must be a sequence of {action_tokens} token ids, got {type(action).__name__}"
        )
    if isinstance(action, np.ndarray):
        if action.ndim != 1:
            raise InvalidRolloutError(f"{where}: action must be 1-D, got shape {action.shape}")
        if action.dtype.kind not in "iu":
            raise InvalidRolloutError(f"{where}: action token ids must be integers, got dtype {action.dtype}")
        tokens: list[int] = action.tolist()
    elif type(action) is list and all(type(token) is int for token in action):
        tokens = action  # the common case, checked without a per-token call
    elif not isinstance(action, Iterable):
        raise InvalidRolloutError(
            f"{where}: action must be an iterable of {action_tokens} token ids, got {type(action).__name__}"
        )
    else:
        tokens = []
        for position, token in enumerate(action):
            try:
                tokens.append(operator.index(token))
            except TypeError:
                raise InvalidRolloutError(
                    f"{where}: action position {position} is not an integer token id: {token!r}"
                ) from None
    if len(tokens) != action_tokens:
        raise InvalidRolloutError(f"{where}: action has {len(tokens)} tokens, expected exactly {action_tokens}")
    if tokens and (min(tokens) < 0 or max(tokens) >= vocab_size):
        position, token = next((p, t) for p, t in enumerate(tokens) if not 0 <= t < vocab_size)
        raise InvalidRolloutError(f"{where}: token id {token} at position {position} is outside [0, {vocab_size})")
    return list(tokens)


@dataclass
class Episode:
    """One finished (or truncated) episode: ``observations[t]`` is what the policy saw
    before writing ``actions[t]``; ``observations`` has one more entry than ``actions``
    (the observation returned with the last step)."""

    seed: int
    observations: list[list[int]] = field(default_factory=list)
    actions: list[list[int]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    done: bool = False

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def score(self) -> float:
        """The episode's return (the sum of its rewards)."""
        return float(sum(self.rewards))


def run_episode(env: MultiTurnEnv, policy: Policy, seed: int) -> Episode:
    """Play one episode of ``env`` with ``policy`` from ``seed``."""
    episode = Episode(seed=seed, observations=[list(env.reset(seed))])
    for _ in range(env.max_turns):
        action = [int(token) for token in policy(episode.observations, episode.actions)]
        observation, reward, done = env.step(action)
        episode.actions.append(action)
        episode.observations.append(list(observation))
        episode.rewards.append(float(reward))
        if done:
            episode.done = True
            break
    return episode


def render_episode(episode: Episode, token_names: Sequence[str]) -> str:
    """The episode as text, one line per observation and per action, tokens by name."""

    def words(tokens: Sequence[int]) -> str:
        return " ".join(token_names[t] for t in tokens) if tokens else "(empty)"

    lines = [f"seed {episode.seed}", f"obs {0:<6}: {words(episode.observations[0])}"]
    for t, action in enumerate(episode.actions):
        lines.append(f"action {t:<3}: {words(action)}")
        lines.append(f"obs {t + 1:<6}: {words(episode.observations[t + 1])}   reward {episode.rewards[t]:g}")
    lines.append(f"done {episode.done} after {episode.turns} turns, score {episode.score:g}")
    return "\n".join(lines)


def check_probability(env_name: str, name: str, value: object) -> float:
    """A constructor parameter as a float in [0, 1], or an InvalidConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise InvalidConfigError(f"{env_name}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def uniform(stream: SeedStream) -> float:
    """A float in [0, 1) from 53 bits of the stream."""
    return stream.below(1 << 53) / float(1 << 53)
