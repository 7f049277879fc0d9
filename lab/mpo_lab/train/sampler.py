"""Batched multi-turn rollouts of a causal LM in token environments (needs torch).

:func:`sample` plays ``group_size`` episodes of each task seed at once: every turn each
running episode generates up to ``env.action_tokens`` tokens (fewer when it samples
``stop_token``), the environment answers with an observation, and so on until the
environment says done or ``max_turns`` is reached. It returns the learner's
:class:`~mpo_rs.torch.batch.RolloutBatch` (behaviour log-probs, policy mask, one summed score
per episode, group ids) and per-episode statistics.

The environment protocol (one episode per object)::

    env.vocab_size     int: observation tokens are in [0, vocab_size)
    env.action_tokens  int: K, the most tokens the policy writes per turn
    env.max_turns      int: turns after which the episode is cut off
    env.reset(seed) -> list[int]                          first observation (the prompt)
    env.step(action: list[int]) -> (observation: list[int], reward: float, done: bool)

Layouts. Without a KV cache the model rescores each episode's whole prefix every step,
right-padded (the layout the learner uses). With a KV cache all episodes advance by the
same number of columns per model call, so an episode that waits (it stopped its turn
early, got a shorter observation, or is finished) gets *holes*: columns masked out of
``attention_mask``. The sampler passes ``position_ids`` = the number of attended tokens
before each column, so every real token has the position it has in the learner's
right-padded recomputation and the recorded log-probs agree with it.

This module owns the episodes and the loop; the token buffers, the model calls and the
draw of each token live in :mod:`mpo_lab.train.generation`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from mpo_rs.exceptions import InvalidConfigError, InvalidOptionError, InvalidRolloutError, MpoError
from mpo_rs.torch.batch import RolloutBatch

from ..envs.protocol import MultiTurnEnv
from .generation import Model, Sequences, draw, model_vocab, open_model

__all__ = ["EpisodeStats", "Rollouts", "sample"]

USE_CACHE = ("auto", True, False)


@dataclass
class EpisodeStats:
    """Per-episode results of one :func:`sample` call (episode b = task b // G)."""

    scores: npt.NDArray[np.float32]
    """float32[B]: the sum of the episode's rewards."""
    success: npt.NDArray[np.bool_]
    """bool[B]: score > 0 (with 0/1 terminal rewards: the task was solved)."""
    turns: npt.NDArray[np.int64]
    """int64[B]: turns played (actions sent to the environment)."""
    response_tokens: npt.NDArray[np.int64]
    """int64[B]: tokens the policy generated over the episode."""
    lengths: npt.NDArray[np.int64]
    """int64[B]: tokens in the trajectory (prompt, actions, observations)."""
    truncated: npt.NDArray[np.bool_]
    """bool[B]: cut off at ``max_turns`` before the environment said done."""
    seconds: float
    """Wall time of the call."""
    used_cache: bool
    """Whether generation used the model's KV cache."""

    def summary(self) -> dict[str, float]:
        """Means over the episodes, and generated tokens per second."""
        if self.scores.size == 0:
            return {}
        return {
            "success_rate": float(self.success.mean()),
            "score_mean": float(self.scores.mean()),
            "turns_mean": float(self.turns.mean()),
            "response_length_mean": float(self.response_tokens.mean()),
            "truncated_rate": float(self.truncated.mean()),
            "tokens_per_second": float(self.response_tokens.sum() / self.seconds) if self.seconds > 0 else math.nan,
        }


@dataclass
class Rollouts:
    """What :func:`sample` returns."""

    batch: RolloutBatch
    stats: EpisodeStats


# --------------------------------------------------------------------------- checks


def _int(value: Any, what: str, low: int = 1, error: type[MpoError] = InvalidOptionError) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise error(f"{what} must be an integer >= {low}, got {value!r}")
    return int(value)


def _tokens(value: Any, what: str, vocab: int) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InvalidRolloutError(f"{what} is not a sequence of token ids: {e}") from None
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InvalidRolloutError(
            f"{what} must be a flat sequence of integer token ids, got {arr.dtype} of shape {arr.shape}"
        )
    arr = arr.astype(np.int64)
    bad = (arr < 0) | (arr >= vocab)
    if bad.any():
        raise InvalidRolloutError(f"{what} has token {int(arr[bad][0])} outside the vocabulary [0, {vocab})")
    return arr


def _make_envs(envs: Any, rows: int) -> list[Any]:
    if isinstance(envs, Sequence) and not isinstance(envs, (str, bytes)):
        if len(envs) != rows:
            raise InvalidConfigError(f"`envs` has {len(envs)} environments; expected one per episode, {rows}")
        out = list(envs)
    elif callable(envs) and (isinstance(envs, type) or not hasattr(envs, "reset")):
        out = [envs() for _ in range(rows)]
    else:
        raise InvalidConfigError("`envs` must be an environment factory (called once per episode) or a list of them")
    for b, env in enumerate(out):
        for attr in ("reset", "step", "vocab_size", "action_tokens", "max_turns"):
            if not hasattr(env, attr):
                raise InvalidConfigError(
                    f"environment {b} ({type(env).__name__}) has no `{attr}`; see mpo_lab.train.sampler"
                )
    return out


def _padded_chunk(rows: list[np.ndarray], device: torch.device) -> tuple[Tensor, Tensor]:
    width = max((r.size for r in rows), default=0)
    ids = np.zeros((len(rows), width), np.int64)
    real = np.zeros((len(rows), width), bool)
    for b, r in enumerate(rows):
        ids[b, : r.size] = r
        real[b, : r.size] = True
    return torch.from_numpy(ids).to(device), torch.from_numpy(real).to(device)


def _check_settings(use_cache: Any, temperature: Any) -> None:
    if use_cache not in USE_CACHE:
        raise InvalidOptionError(f"use_cache must be 'auto', True or False, got {use_cache!r}")
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (math.isfinite(temperature) and temperature > 0)
    ):
        raise InvalidOptionError(f"temperature must be a positive finite number, got {temperature!r}")


def _place(policy: nn.Module, device: str | torch.device | None) -> torch.device:
    """Where to run: ``device`` (the policy is moved there), else where its parameters are."""
    if device is not None:
        device = torch.device(device)
        policy.to(device)
        return device
    first = next(policy.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _check_stop_token(stop_token: Any, vocab: int | None) -> int | None:
    if stop_token is None:
        return None
    stop_token = _int(stop_token, "stop_token", low=0)
    if vocab is not None and stop_token >= vocab:
        raise InvalidOptionError(f"stop_token {stop_token} is outside the policy's vocabulary [0, {vocab})")
    return int(stop_token)


# --------------------------------------------------------------------------- the episodes


class _Episodes:
    """The B episodes of one call: their environments and shapes, and what they did so far."""

    def __init__(self, envs: Any, seeds: list[int], group_size: int, max_turns: int | None) -> None:
        rows = len(seeds) * group_size
        self.envs = _make_envs(envs, rows)
        self.seeds = seeds
        self.group_size = group_size
        self.group_ids = np.repeat(np.arange(len(seeds), dtype=np.int64), group_size)
        self.action_tokens = self._shape("action_tokens")
        turn_limit = self._shape("max_turns")
        self.turn_limit = turn_limit if max_turns is None else np.minimum(turn_limit, max_turns)
        self.vocab = self._shape("vocab_size")
        self.scores = np.zeros(rows, np.float64)
        self.turns = np.zeros(rows, np.int64)
        self.response = np.zeros(rows, np.int64)
        self.truncated = np.zeros(rows, bool)
        self.running = np.ones(rows, bool)

    def _shape(self, attr: str) -> np.ndarray:
        return np.array(
            [
                _int(getattr(e, attr), f"environment {b}: {attr}", error=InvalidConfigError)
                for b, e in enumerate(self.envs)
            ]
        )

    def check_policy_vocab(self, model_vocab: int | None) -> None:
        if model_vocab is not None and len(self.envs) and int(self.vocab.max()) > model_vocab:
            b = int(np.argmax(self.vocab))
            raise InvalidConfigError(
                f"environment {b} has vocab_size {int(self.vocab[b])}, more than the policy's {model_vocab} tokens"
            )

    def prompts(self) -> list[np.ndarray]:
        """Resets every env with its task's seed; the first observations."""
        prompts = [
            _tokens(
                env.reset(self.seeds[b // self.group_size]), f"environment {b}: reset() observation", int(self.vocab[b])
            )
            for b, env in enumerate(self.envs)
        ]
        for b, p in enumerate(prompts):
            if p.size == 0:
                raise InvalidRolloutError(
                    f"environment {b}: reset() returned no tokens; the first policy token needs a context"
                )
        return prompts

    def step(self, taken: np.ndarray, stop_token: int | None) -> list[np.ndarray]:
        """Sends each running episode's action (``taken``: its row's tokens, -1 after the
        turn ended) to its env; the observations (empty for the episodes that ended)."""
        observations: list[np.ndarray] = [np.zeros(0, np.int64)] * len(self.envs)
        for b in np.flatnonzero(self.running).tolist():
            action = taken[b][taken[b] >= 0]
            self.response[b] += action.size
            if stop_token is not None and action.size and action[-1] == stop_token:
                action = action[:-1]
            observation, done = self._step_one(b, action)
            if done:
                self.running[b] = False
            elif self.turns[b] >= self.turn_limit[b]:
                self.running[b], self.truncated[b] = False, True
            else:
                observations[b] = self._observation(b, observation)
        return observations

    def _step_one(self, b: int, action: np.ndarray) -> tuple[Any, Any]:
        result = self.envs[b].step(action.tolist())
        if not (isinstance(result, tuple) and len(result) == 3):
            raise InvalidRolloutError(
                f"environment {b}: step() must return (observation, reward, done), got {result!r:.80}"
            )
        observation, reward, done = result
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            raise InvalidRolloutError(f"environment {b}: step() reward {reward!r} is not a number") from None
        if not math.isfinite(reward):
            raise InvalidRolloutError(f"environment {b}: step() reward {reward} is not finite (turn {self.turns[b]})")
        self.scores[b] += reward
        self.turns[b] += 1
        return observation, done

    def _observation(self, b: int, observation: Any) -> np.ndarray:
        obs = _tokens(observation, f"environment {b}: step() observation (turn {self.turns[b]})", int(self.vocab[b]))
        if obs.size == 0:
            raise InvalidRolloutError(
                f"environment {b}: step() returned an empty observation at turn {self.turns[b]} without done; "
                "turns must be separated by at least one observation token"
            )
        return obs


# --------------------------------------------------------------------------- the sampler


def _generate_turn(
    logits: Tensor,
    seq: Sequences,
    model: Model,
    episodes: _Episodes,
    temperature: float,
    stop_token: int | None,
    generator: torch.Generator | None,
) -> np.ndarray:
    """One turn of every running episode: up to its ``action_tokens`` tokens, drawn from
    ``logits`` and then the model's next logits, appended to ``seq``. Returns ``(B, K)``
    host token ids, -1 after an episode's turn ended."""
    device, rows = seq.device, seq.rows
    limit = torch.from_numpy(episodes.action_tokens).to(device)
    longest_turn = int(episodes.action_tokens.max())
    # With every turn K tokens long and no stop token, a turn ends after K tokens (no device read).
    same_length = bool((episodes.action_tokens == longest_turn).all())
    generating = torch.tensor(episodes.running, device=device)  # a copy: it is updated in place
    actions = torch.full((rows, longest_turn), -1, dtype=torch.long, device=device)
    bad = torch.zeros(rows, dtype=torch.bool, device=device)
    for k in range(longest_turn):
        token, log_prob = draw(logits, generating, temperature, generator)
        if seq.compact:
            seq.append(token[:, None], generating[:, None], policy=True, log_probs=log_prob[:, None])
        else:
            seq.append_column(token, generating, log_prob)
        actions[:, k] = torch.where(generating, token, -1)
        bad |= generating & ~torch.isfinite(log_prob)
        if not same_length:
            generating = generating & (k + 1 < limit)
        if stop_token is not None:
            generating &= token != stop_token
        if k + 1 == longest_turn:
            break
        may_end_early = stop_token is not None or not same_length
        if may_end_early and not bool(generating.any()):  # the step's one sync
            break
        logits = model.next_logits(seq)
    if bool(bad.any()):  # checked once per turn, before the environments see the actions
        b = int(torch.nonzero(bad)[0])
        raise FloatingPointError(f"episode {b}: the policy's log-prob of its sampled token is not finite")
    taken: np.ndarray = actions.cpu().numpy()
    return taken


@torch.no_grad()
def sample(
    policy: nn.Module,
    envs: Callable[[], MultiTurnEnv] | Sequence[MultiTurnEnv],
    seeds: Sequence[int],
    *,
    group_size: int = 1,
    temperature: float = 1.0,
    stop_token: int | None = None,
    max_turns: int | None = None,
    device: str | torch.device | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool | str = "auto",
) -> Rollouts:
    """Plays ``group_size`` episodes of each task seed, all B = len(seeds) * group_size at
    once, and returns them as a :class:`Rollouts` (``.batch``, ``.stats``).

    ``envs``: a factory called once per episode, or a list of B environments; episode b
    is reset with ``seeds[b // group_size]`` and its group id is ``b // group_size``.
    Each turn an episode generates ``env.action_tokens`` tokens, or fewer when it samples
    ``stop_token`` (recorded as a policy token, not passed to ``env.step``). The
    observation that comes with ``done`` is not appended (the policy never reads it).
    ``max_turns`` caps ``env.max_turns``. Tokens are drawn from softmax(logits /
    ``temperature``) with ``generator`` (default: torch's global RNG) and their log-probs
    recorded at that temperature, as the learner recomputes them with
    ``LearnerConfig(temperature=...)``. ``use_cache``: ``"auto"`` uses the KV cache when
    the policy's forward takes ``past_key_values`` and returns them, ``True`` requires it,
    ``False`` recomputes the whole prefix every step. ``device``: where to run (the policy
    is moved there); default where the policy's parameters are. The policy is used in
    whatever train/eval mode the caller left it (dropout would make the recorded log-probs
    differ from the learner's).

    Raises ``mpo_rs.InvalidOptionError`` for a bad argument (``temperature``, ``seeds``,
    ``stop_token``, ...), ``InvalidConfigError`` for unusable environments, and
    ``InvalidRolloutError`` for what an environment or the policy returns that cannot be
    used, each naming the argument, the environment and the turn.
    """
    _check_settings(use_cache, temperature)
    group_size = _int(group_size, "group_size")
    if max_turns is not None:
        max_turns = _int(max_turns, "max_turns")
    seeds = [_int(s, f"seeds[{i}]", low=0) for i, s in enumerate(seeds)]
    device = _place(policy, device)
    started = time.perf_counter()

    episodes = _Episodes(envs, seeds, group_size, max_turns)
    vocab = model_vocab(policy)
    episodes.check_policy_vocab(vocab)
    stop_token = _check_stop_token(stop_token, vocab)
    model = open_model(policy, use_cache)
    seq = Sequences(len(episodes.envs), device, compact=model.cache_argument is None)
    if not episodes.envs:
        return _result(seq, episodes, started, model.use_cache)

    seq.append(*_padded_chunk(episodes.prompts(), device), policy=False)
    logits = model.next_logits(seq)
    _check_stop_token(stop_token, int(logits.shape[-1]))
    while episodes.running.any():
        taken = _generate_turn(logits, seq, model, episodes, float(temperature), stop_token, generator)
        observations = episodes.step(taken, stop_token)
        if episodes.running.any():
            seq.append(*_padded_chunk(observations, device), policy=False)
            logits = model.next_logits(seq)
    return _result(seq, episodes, started, model.use_cache)


def _result(seq: Sequences, episodes: _Episodes, started: float, used_cache: bool) -> Rollouts:
    seq.shrink_width()
    ids, real, policy, log_probs = seq.padded()
    scores32 = episodes.scores.astype(np.float32)
    batch = RolloutBatch.from_padded(
        ids, real, policy, old_log_probs=log_probs, scores=scores32, group_ids=episodes.group_ids
    )
    stats = EpisodeStats(
        scores=scores32,
        success=scores32 > 0,
        turns=episodes.turns,
        response_tokens=episodes.response,
        lengths=batch.lengths,
        truncated=episodes.truncated,
        seconds=time.perf_counter() - started,
        used_cache=used_cache,
    )
    return Rollouts(batch, stats)
