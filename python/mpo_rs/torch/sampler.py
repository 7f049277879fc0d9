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
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from ..exceptions import InvalidConfigError, InvalidOptionError, InvalidRolloutError, MpoError
from .batch import RolloutBatch

__all__ = ["EpisodeStats", "Rollouts", "TokenEnv", "sample"]

USE_CACHE = ("auto", True, False)


class TokenEnv(Protocol):
    """One episode of a multi-turn token environment (see the module doc)."""

    vocab_size: int
    action_tokens: int
    max_turns: int

    def reset(self, seed: int) -> Sequence[int]: ...

    def step(self, action: list[int]) -> tuple[Sequence[int], float, bool]: ...


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


# --------------------------------------------------------------------------- token buffers


class _Sequences:
    """Every episode's tokens so far, as ``(B, capacity)`` device buffers.

    ``compact``: each row is its tokens left-aligned (right padding, recompute mode).
    Otherwise every append adds the same columns to all rows and rows without a token
    there get a hole (KV-cache mode). Column ``capacity`` is a write-only trash column for
    the entries that are not real, so appends need no host synchronisation.
    """

    def __init__(self, rows: int, device: torch.device, compact: bool, capacity: int = 256) -> None:
        self.rows, self.device, self.compact = rows, device, compact
        self.capacity = capacity
        self.ids = torch.zeros(rows, capacity + 1, dtype=torch.long, device=device)
        self.real = torch.zeros(rows, capacity + 1, dtype=torch.bool, device=device)
        self.policy = torch.zeros(rows, capacity + 1, dtype=torch.bool, device=device)
        self.log_probs = torch.zeros(rows, capacity + 1, dtype=torch.float32, device=device)
        self.attention = torch.zeros(rows, capacity + 1, dtype=torch.long, device=device)
        """``real`` as the model's ``attention_mask`` (int64), kept so no call converts it."""
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.width = 0
        """Columns in use: the longest row (compact) or every column appended (holes)."""

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity)
        for name in ("ids", "real", "policy", "log_probs", "attention"):
            old = getattr(self, name)
            new = old.new_zeros(self.rows, capacity + 1)
            new[:, : self.capacity] = old[:, : self.capacity]
            setattr(self, name, new)
        self.capacity = capacity

    def append(self, tokens: Tensor, real: Tensor, *, policy: bool, log_probs: Tensor | None = None) -> None:
        """Adds ``(B, n)`` tokens; in each row the entries with ``real`` set, in order."""
        n = tokens.shape[1]
        if n == 0:
            return
        self._grow(self.width + n)
        if self.compact:
            dest = self.lengths[:, None] + real.long().cumsum(1) - 1
        else:
            dest = self.width + torch.arange(n, device=self.device)[None, :].expand(self.rows, n)
        dest = torch.where(real, dest, self.capacity)
        self.ids.scatter_(1, dest, tokens)
        self.real.scatter_(1, dest, real)
        self.attention.scatter_(1, dest, real.long())
        self.policy.scatter_(1, dest, real & policy)
        if log_probs is not None:
            self.log_probs.scatter_(1, dest, torch.where(real, log_probs, 0.0))
        self.lengths += real.sum(1)
        # Compact rows are as wide as the longest one: a bound known without a sync.
        self.width += n
        self.ids[:, self.capacity] = 0  # the trash column is never read, keep it a valid id
        self.real[:, self.capacity] = False

    def append_column(self, tokens: Tensor, real: Tensor, log_probs: Tensor) -> None:
        """KV-cache mode: one column of ``(B,)`` policy tokens, a hole where ``real`` is
        False -- what ``append(tokens[:, None], real[:, None], policy=True, ...)`` writes,
        with direct column writes (this runs once per generated token)."""
        self._grow(self.width + 1)
        w = self.width
        self.ids[:, w] = torch.where(real, tokens, 0)
        self.real[:, w] = real
        self.attention[:, w] = real
        self.policy[:, w] = real
        self.log_probs[:, w] = torch.where(real, log_probs, 0.0)
        self.lengths += real
        self.width += 1

    def shrink_width(self) -> None:
        """Compact mode: trims ``width`` to the longest row (one host read)."""
        if self.compact:
            self.width = int(self.lengths.max()) if self.rows else 0

    def padded(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        w = self.width
        return self.ids[:, :w], self.real[:, :w], self.policy[:, :w], self.log_probs[:, :w]


# --------------------------------------------------------------------------- model calls


def _parameters(module: nn.Module) -> tuple[set[str], bool]:
    """The keyword arguments ``module.forward`` names, and whether it takes ``**kwargs``."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return set(), False
    return set(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _accepts(module: nn.Module, name: str) -> bool:
    names, var_keyword = _parameters(module)
    return var_keyword or name in names


def _cache_argument(module: nn.Module) -> str | None:
    """The name under which ``module.forward`` takes and returns its KV cache:
    ``past_key_values`` (Hugging Face 4.x, TinyCausalLM), ``cache`` (recent Hugging Face),
    or None when it cannot take one with ``position_ids`` and ``use_cache``."""
    names, var_keyword = _parameters(module)
    if not (var_keyword or {"position_ids", "use_cache"} <= names):
        return None
    if "past_key_values" in names:
        return "past_key_values"
    if "cache" in names:
        return "cache"
    return "past_key_values" if var_keyword else None


def _logits_of(out: Any) -> Tensor:
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, Tensor) or out.dim() != 3:
        raise InvalidRolloutError(
            f"the policy returned {type(out).__name__}; expected logits (B, L, vocab) or an object with .logits"
        )
    return out


class _Model:
    """Next-token logits for every row, with or without the KV cache."""

    def __init__(self, policy: nn.Module, cache_argument: str | None, can_fall_back: bool) -> None:
        self.policy = policy
        self.cache_argument = cache_argument
        self.use_cache = cache_argument is not None
        self.can_fall_back = can_fall_back
        self.cache: Any = None
        self.fed = 0  # columns already in the cache
        self.pass_use_cache = _accepts(policy, "use_cache")

    def next_logits(self, seq: _Sequences) -> Tensor:
        """(B, V) logits after each row's last real token."""
        if self.use_cache:
            return self._cached(seq)
        seq.shrink_width()
        width = seq.width
        kwargs: dict[str, Any] = {"use_cache": False} if self.pass_use_cache else {}
        logits = _logits_of(
            self.policy(input_ids=seq.ids[:, :width], attention_mask=seq.attention[:, :width], **kwargs)
        )
        if logits.shape[:2] != (seq.rows, width):
            raise InvalidRolloutError(
                f"policy logits have shape {tuple(logits.shape)}, expected ({seq.rows}, {width}, vocab)"
            )
        last = (seq.lengths - 1).clamp(min=0)
        return logits[torch.arange(seq.rows, device=logits.device), last]

    def _cached(self, seq: _Sequences) -> Tensor:
        assert self.cache_argument is not None
        start, stop = self.fed, seq.width
        attended = seq.attention[:, :stop]
        if stop - start == 1:  # one column: each row's count of attended tokens, as the cumsum gives
            positions = (seq.lengths - 1).clamp(min=0)[:, None]
        else:
            positions = (attended.cumsum(1) - 1).clamp(min=0)[:, start:]
        out = self.policy(
            input_ids=seq.ids[:, start:stop],
            attention_mask=attended,
            position_ids=positions,
            use_cache=True,
            **{self.cache_argument: self.cache},
        )
        logits = _logits_of(out)
        n = stop - start
        if logits.shape[:2] != (seq.rows, n):
            raise InvalidRolloutError(
                f"policy logits have shape {tuple(logits.shape)}, expected ({seq.rows}, {n}, vocab)"
            )
        cache = getattr(out, self.cache_argument, None)
        if cache is None and isinstance(out, dict):
            cache = out.get(self.cache_argument)
        if cache is None:
            if not (self.can_fall_back and start == 0):
                raise InvalidRolloutError(
                    f"the policy returned no {self.cache_argument} with use_cache=True; call sample(..., use_cache=False)"
                )
            # Only the prompt was fed: its columns are already a right-padded layout.
            self.use_cache = False
            seq.compact = True
            seq.shrink_width()
        self.cache = cache
        self.fed = stop
        if n == 1:
            return logits[:, 0]
        columns = torch.arange(n, device=logits.device)
        last = torch.where(seq.real[:, start:stop], columns, -1).amax(1).clamp(min=0)
        return logits[torch.arange(seq.rows, device=logits.device), last]


def _draw(
    logits: Tensor, sampling: Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """A token per row from softmax(logits / temperature) and its log-prob, computed as
    the learner does (``chosen - logsumexp``, fp32). One uniform per row, drawn on the
    generator's device: the same seed gives the same stream on CPU and CUDA."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logits = torch.where(sampling[:, None], logits, torch.zeros_like(logits))  # idle rows: anything finite
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    cdf = (logits - log_z).exp().cumsum(-1)
    draw_device = generator.device if generator is not None else logits.device
    u = torch.rand((logits.shape[0], 1), generator=generator, device=draw_device).to(logits.device)
    token = (cdf < u * cdf[:, -1:]).sum(-1).clamp(max=logits.shape[-1] - 1)
    log_prob = logits.gather(-1, token[:, None]).squeeze(-1) - log_z.squeeze(-1)
    return token, log_prob


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
                    f"environment {b} ({type(env).__name__}) has no `{attr}`; see mpo_rs.torch.sampler"
                )
    return out


def _model_vocab(policy: nn.Module) -> int | None:
    get = getattr(policy, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    size = getattr(embeddings, "num_embeddings", None)
    return int(size) if size is not None else None


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


def _open_model(policy: nn.Module, use_cache: bool | str) -> _Model:
    cache_argument = None if use_cache is False else _cache_argument(policy)
    if use_cache is True and cache_argument is None:
        raise InvalidOptionError(
            f"{type(policy).__name__}.forward takes no past_key_values (or cache), position_ids and use_cache; "
            "call sample(..., use_cache=False)"
        )
    return _Model(policy, cache_argument, can_fall_back=use_cache == "auto")


def _generate_turn(
    logits: Tensor,
    seq: _Sequences,
    model: _Model,
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
        token, log_prob = _draw(logits, generating, temperature, generator)
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
    envs: Callable[[], TokenEnv] | Sequence[TokenEnv],
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
    model_vocab = _model_vocab(policy)
    episodes.check_policy_vocab(model_vocab)
    stop_token = _check_stop_token(stop_token, model_vocab)
    model = _open_model(policy, use_cache)
    seq = _Sequences(len(episodes.envs), device, compact=model.cache_argument is None)
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


def _result(seq: _Sequences, episodes: _Episodes, started: float, used_cache: bool) -> Rollouts:
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
