"""The multi-turn protocol: what an environment declares and what one episode is.

An episode is ``obs0 = env.reset(seed)``, then, until ``done``, the policy writes exactly
``env.action_tokens`` token ids and ``env.step(action)`` answers ``(observation, reward,
done)``. Token ids are ints in ``[0, env.vocab_size)``. The episode ends after
``env.max_turns`` turns at the latest; the observation returned with ``done=True`` may be
empty. Given the seed, an episode depends only on the actions.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from mpo_rs.exceptions import InvalidConfigError, InvalidRolloutError

T = TypeVar("T")

__all__ = [
    "CheckedEnv",
    "Episode",
    "MultiTurnEnv",
    "Policy",
    "SeedStream",
    "check_action",
    "check_env",
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
    :class:`~mpo_lab.envs.VectorEnv`; subclassing is not needed.
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


def check_running(env_name: str, turn: int, done: bool) -> None:
    """Refuse a step() with no episode running (it ended, or reset(seed) was never called)."""
    if done:
        raise InvalidRolloutError(
            f"{env_name} turn {turn}: step() called with no episode running (it ended, or reset(seed) was never called)"
        )


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


def check_levels(
    env_name: str, name: str, values: object, noun: str, check: Callable[[str, object], T]
) -> tuple[T, ...] | None:
    """A spread of difficulty visible in the prompt (one value per level): ``values`` as a
    tuple of at least two, each through ``check(its name, value)``, or None when not given; an
    InvalidConfigError naming the env and what a level is (``noun``) otherwise."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) < 2:
        raise InvalidConfigError(f"{env_name}: {name} must be a list of at least two {noun}, got {values!r}")
    return tuple(check(f"{name}[{i}]", v) for i, v in enumerate(values))


def uniform(stream: SeedStream) -> float:
    """A float in [0, 1) from 53 bits of the stream."""
    return stream.below(1 << 53) / float(1 << 53)


# --------------------------------------------------------------------------- checking an env of unknown quality

SIZES = ("vocab_size", "action_tokens", "max_turns")
"""The ints an env declares."""
METHODS = ("reset", "step")
SIZE_LIMIT = 1 << 63
"""Sizes are below this: token ids and counts are int64 in the sampler and the logs."""


def _show(value: object) -> str:
    """``repr(value)`` on one line, at most 80 characters (an array's repr has newlines)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


def check_env(env: object, name: str) -> None:
    """The members every MultiTurnEnv has: ``vocab_size``, ``action_tokens`` and
    ``max_turns`` ints in ``[1, 2**63)`` (numpy ints too, not bools), ``reset`` and ``step``
    callables. Raises InvalidConfigError, one line naming ``name``, the member and its value."""
    absent = [m for m in (*SIZES, *METHODS) if not hasattr(env, m)]
    if absent:
        raise InvalidConfigError(
            f"{name} returned a {type(env).__name__}, not a MultiTurnEnv: it has no {', '.join(absent)} "
            "(docs/envs.md, the protocol)"
        )
    for member in SIZES:
        value = getattr(env, member)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidConfigError(f"{name}: {member} must be an int >= 1, got {_show(value)}")
        if value >= SIZE_LIMIT:
            raise InvalidConfigError(f"{name}: {member} must be below 2**63, got {value}")
    for member in METHODS:
        if not callable(getattr(env, member)):
            raise InvalidConfigError(f"{name}: {member} must be a method, got {type(getattr(env, member)).__name__}")


def _token_list(where: Callable[[], str], value: object, vocab_size: int) -> list[int]:
    """An observation as a list of ints in ``[0, vocab_size)``, else InvalidRolloutError."""
    if type(value) is list and all(type(t) is int for t in value):
        tokens: list[int] = value  # the common case, checked without a per-token call
    elif isinstance(value, np.ndarray) and value.ndim == 1 and (value.dtype.kind in "iu" or value.size == 0):
        tokens = value.astype(np.int64).tolist()
    elif isinstance(value, (list, tuple)) and all(
        isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)) for t in value
    ):
        tokens = [int(t) for t in value]
    else:
        raise InvalidRolloutError(f"{where()} an observation that is not a list of int token ids: {_show(value)}")
    if tokens and (min(tokens) < 0 or max(tokens) >= vocab_size):
        position, token = next((p, t) for p, t in enumerate(tokens) if not 0 <= t < vocab_size)
        raise InvalidRolloutError(
            f"{where()} an observation whose token {position} is {token}, outside [0, {vocab_size}) (vocab_size)"
        )
    return tokens


class CheckedEnv:
    """``env`` with every call checked against the protocol, for an env of unknown quality
    (a user's): the sizes once (:func:`check_env`), then each call's return -- an
    observation a list of ints in ``[0, vocab_size)`` (a 1-D integer array or a tuple is
    converted), a non-empty prompt, a reward an int or float (numpy scalars too; not a
    bool, not a string) and finite, ``done`` a bool (or numpy bool) -- and an exception
    raised inside a call. Every refusal is an InvalidRolloutError of one line naming
    ``name``, the call (with the episode's seed and turn) and the value; the env's own
    exception is its ``__cause__``. With ``max_episode_tokens``, an episode that grows
    beyond that many tokens (prompt, actions and the observations the policy reads) is
    refused at the step that makes it so."""

    def __init__(self, env: object, name: str, max_episode_tokens: int | None = None) -> None:
        check_env(env, name)
        self.env, self.name = env, name
        self.vocab_size = int(env.vocab_size)  # type: ignore[attr-defined]
        self.action_tokens = int(env.action_tokens)  # type: ignore[attr-defined]
        self.max_turns = int(env.max_turns)  # type: ignore[attr-defined]
        self.max_episode_tokens = max_episode_tokens
        self._seed: object = None
        self._turn = 0
        self._length = 0

    def _call(self, call: Callable[[], str], method: str, *args: object) -> object:
        try:
            return getattr(self.env, method)(*args)
        except Exception as e:  # the env's own failure: one line, the traceback kept as the cause
            message = " ".join(str(e).split())
            raise InvalidRolloutError(f"{self.name}: {call()} raised {type(e).__name__}: {message}") from e

    def reset(self, seed: int) -> list[int]:
        def call() -> str:
            return f"reset({_show(seed)})"

        tokens = _token_list(self._returned(call), self._call(call, "reset", seed), self.vocab_size)
        if not tokens:
            raise InvalidRolloutError(
                f"{self.name}: {call()} returned no tokens; the first policy token needs a prompt"
            )
        self._seed, self._turn, self._length = seed, 0, len(tokens)
        self._check_length(call)
        return tokens

    def step(self, action: Sequence[int]) -> tuple[list[int], float, bool]:
        turn = self._turn

        def call() -> str:  # built only for a message: the step itself stays cheap
            return f"step({_show(list(action))}) at turn {turn} of seed {self._seed}"

        result = self._call(call, "step", action)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise InvalidRolloutError(
                f"{self.name}: {call()} returned {_show(result)}, not (observation, reward, done)"
            )
        observation, reward, done = result
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, (int, float, np.integer, np.floating)):
            raise InvalidRolloutError(
                f"{self.name}: {call()} returned the reward {_show(reward)} ({type(reward).__name__}), not a number"
            )
        try:
            value = float(reward)
        except OverflowError:  # an int beyond float's range
            value = math.inf
        if not math.isfinite(value):
            raise InvalidRolloutError(f"{self.name}: {call()} returned the reward {_show(reward)}, not finite")
        if not isinstance(done, (bool, np.bool_)):
            raise InvalidRolloutError(
                f"{self.name}: {call()} returned done={_show(done)} ({type(done).__name__}), not a bool"
            )
        tokens = _token_list(self._returned(call), observation, self.vocab_size)
        self._turn += 1
        self._length += len(action)
        if not done and self._turn < self.max_turns:  # the observation the policy reads next
            if not tokens:
                raise InvalidRolloutError(
                    f"{self.name}: {call()} returned an empty observation without done; turns are separated by at "
                    "least one observation token"
                )
            self._length += len(tokens)
        self._check_length(call)
        return tokens, value, bool(done)

    def _returned(self, call: Callable[[], str]) -> Callable[[], str]:
        return lambda: f"{self.name}: {call()} returned"

    def _check_length(self, call: Callable[[], str]) -> None:
        if self.max_episode_tokens is not None and self._length > self.max_episode_tokens:
            raise InvalidRolloutError(
                f"{self.name}: after {call()} the episode is {self._length} tokens long, more than the "
                f"{self.max_episode_tokens} the model takes"
            )

    def __getattr__(self, attr: str) -> object:
        # Anything else the env offers (chance_success(), a version, names of tokens).
        if attr == "env":
            raise AttributeError(attr)
        return getattr(self.env, attr)
