"""A critic of known quality: the on-policy tabular reference critic of a built-in task.

The value of a policy token is the expected return given the history before it. For the
built-in tasks that history has a small sufficient summary, the task's *belief state*
(:func:`mpo_lab.envs.beliefs.belief_model`: what the observations say about what is hidden),
and inside a turn what of the turn's tokens so far decides it (:func:`prefix_summary`). The
reference critic is a table keyed on both, fitted to the Monte-Carlo returns of the policy's
own rollouts: the exact on-policy value for a policy that acts on the belief state, the best
a critic of that information can do for one that does not.

Its explained variance is measured **cross-fitted**: the rollouts of every task are split in
two halves (alternately), each half's values come from the table of the other half (a key the other half never
reached falls back to the belief key alone, then to the mean return; a rare key is shrunk
toward them), so a table that memorises its own returns gains nothing. The two halves share
their tasks, as a critic that reads the prompt does. Where the belief state holds the task
itself (FrozenLake's map), few rollouts reach each key, so the table keys a summary the task's
model gives instead (``table_key``: FrozenLake's turn and optimal success from the cell, then of
the move; Sokoban's turns left and fewest moves to a solution, then after the move), pooled over tasks. That is the task's *critic ceiling* for the policy,
and the between-turn share of these values is the premise measured on that policy (not on
the noisy oracle the premise measurement of docs/envs.md plays).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from mpo_rs.estimators import segment_turns
from mpo_rs.exceptions import InvalidBatchError

from ..envs.beliefs import belief_model
from ..seeds import Stream

__all__ = [
    "REFERENCE_WINDOW",
    "SHRINKAGE",
    "OnPolicyReference",
    "TabularCritic",
    "belief_keys",
    "cross_fitted_values",
    "prefix_summary",
    "reference_measurement",
]

Key = tuple[Hashable, tuple[Any, ...]]


def prefix_summary(model: Any, belief: Any, prefix: Sequence[int]) -> tuple[Any, ...]:
    """What of the turn's tokens so far decides the turn: where some actions are well formed
    (``model.W``), the prefix itself while it can still become one, else only that it is
    malformed (the turn is spent whatever follows); where only one token of the turn matters
    (``model.decisive``), what that token decides once it is out (its outcomes from the belief,
    with the next beliefs' keys). Thinking tokens a turn opens with
    (``model.free``) are read only for being thinking tokens: a prefix of thoughts alone is
    the turn's start. The exact values of :class:`~mpo_lab.envs.premise.NoisyOracle` depend on
    the prefix through this alone."""
    prefix = tuple(int(t) for t in prefix)
    if model.free:
        if not model.thought_ok(prefix):
            return (len(prefix), "malformed")
        prefix = prefix[model.free :]
    if model.W is None:
        position = model.decisive(belief)
        if position is None or len(prefix) <= position:
            return (len(prefix), None)
        # What the decisive token decides, not the token itself: the same token is the right key
        # of one task and a wrong one of another, and the belief key need not hold which.
        decided = tuple(
            (p, r, done, None if nxt is None else model.key(nxt))
            for p, r, done, nxt in model.outcomes(belief, prefix[position])
        )
        return (len(prefix), decided)
    if any(action[: len(prefix)] == prefix for action in model.W):
        return prefix
    return (len(prefix), "malformed")


def belief_keys(
    env: Any, token_ids: npt.NDArray[np.int64], mask: npt.NDArray[np.bool_], offsets: npt.NDArray[np.int64]
) -> list[Key]:
    """(belief key, :func:`prefix_summary` of the turn's tokens before it) of every policy
    token, in order.

    A trajectory's tokens are the first observation, then turns of policy tokens each
    followed by the observation it got (the last one possibly empty); the belief is updated
    from each (action, observation) pair, as :mod:`mpo_lab.envs.premise` does."""
    model = belief_model(env)
    # A task whose belief holds the task itself (FrozenLake's map, Sokoban's room) keys a summary of it instead.
    summary = getattr(model, "table_key", None)
    keys: list[Key] = []
    for index, (start, end) in enumerate(itertools.pairwise(offsets)):
        tokens, policy = token_ids[start:end].tolist(), mask[start:end].tolist()
        runs: list[tuple[bool, list[int]]] = []
        for token, own in zip(tokens, policy, strict=True):
            if runs and runs[-1][0] == own:
                runs[-1][1].append(token)
            else:
                runs.append((own, [token]))
        if not runs or runs[0][0]:
            raise InvalidBatchError(f"trajectory {index}: it must open with its first observation, not a policy token")
        belief = model.initial(runs[0][1])
        for i in range(1, len(runs), 2):
            action = runs[i][1]
            observation = runs[i + 1][1] if i + 1 < len(runs) else []
            if summary is not None:
                keys.extend(summary(belief, action[:j]) for j in range(len(action)))
            else:
                b_key = model.key(belief)
                keys.extend((b_key, prefix_summary(model, belief, action[:j])) for j in range(len(action)))
            if i + 1 < len(runs):
                belief = model.update(belief, action, observation)
    return keys


SHRINKAGE = 8.0
"""Prior weight, in rollouts, of a key's parent estimate: a key seen n times gets
(n * its mean + SHRINKAGE * the parent's) / (n + SHRINKAGE), the full key shrunk toward its
belief key and that toward the mean return, so a key seen a few times is not its few returns."""


class TabularCritic:
    """Mean Monte-Carlo return per key, shrunk toward the belief key's and that toward the
    mean return (:data:`SHRINKAGE`); a key not seen in fitting gets its parent's estimate."""

    def __init__(self, keys: Sequence[Key], returns: npt.NDArray[np.float64], shrinkage: float = SHRINKAGE) -> None:
        full: dict[Key, list[float]] = {}
        coarse: dict[Hashable, list[float]] = {}
        for key, g in zip(keys, returns.tolist(), strict=True):
            for acc in (full.setdefault(key, [0.0, 0.0]), coarse.setdefault(key[0], [0.0, 0.0])):
                acc[0] += g
                acc[1] += 1.0
        self._mean = float(np.mean(returns)) if len(returns) else 0.0
        self._coarse = {k: (s + shrinkage * self._mean) / (n + shrinkage) for k, (s, n) in coarse.items()}
        self._full = {k: (s + shrinkage * self._coarse[k[0]]) / (n + shrinkage) for k, (s, n) in full.items()}

    def __call__(self, keys: Sequence[Key]) -> npt.NDArray[np.float64]:
        return np.array([self._full.get(k, self._coarse.get(k[0], self._mean)) for k in keys], dtype=np.float64)


def cross_fitted_values(
    keys: Sequence[Key], returns: npt.NDArray[np.float64], fold: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Each policy token's value from the table of the tokens of the other fold (0 or 1)."""
    values = np.empty(len(keys), dtype=np.float64)
    for f in (0, 1):
        mine = np.flatnonzero(fold == f)
        other = np.flatnonzero(fold != f)
        table = TabularCritic([keys[int(i)] for i in other], returns[other])
        values[mine] = table([keys[int(i)] for i in mine])
    return values


REFERENCE_WINDOW = 8
"""Updates whose rollouts the reference critic of an arm is fitted to (the most recent ones)."""


class OnPolicyReference:
    """The reference critic as an arm's value source (``Arm.critic`` ``reference`` or
    ``reference+noise``): each batch's values come from a :class:`TabularCritic` fitted to the
    Monte-Carlo returns of the policy's rollouts of the last ``window`` updates -- never the
    batch's own, so no advantage sees its own return through its baseline -- and, before the
    first update, of the base policy's (:meth:`add_base` them first). :meth:`read_and_add` reads a
    training batch's values and then keeps its rollouts, reading its belief keys once.

    ``ev_fraction = k`` in [0, 1) degrades it into a critic of known quality, like a learned
    one: shrunk toward the table's mean return by k, plus noise drawn once per turn (every
    token of a turn is off by the same amount, as a critic's error on a state is) with variance
    ``k (1 - k) Var(V_ref)`` over the batch's policy tokens. Where V_ref is the conditional
    expectation of the return (explained variance c), the degraded values explain ``k * c`` of
    the return's variance in expectation: E(G - V)^2 = Var G - 2k Var V_ref + k^2 Var V_ref +
    k (1 - k) Var V_ref = Var G - k c Var G. ``ev_fraction`` None (or 1) is the reference itself."""

    def __init__(
        self, env: Any, *, window: int = REFERENCE_WINDOW, ev_fraction: float | None = None, seed: int = 0
    ) -> None:
        if ev_fraction is not None and not 0.0 <= ev_fraction <= 1.0:
            raise InvalidBatchError(f"OnPolicyReference: ev_fraction must be in [0, 1], got {ev_fraction!r}")
        self.env = env
        self.window = window
        self.ev_fraction = ev_fraction
        self._rng = np.random.default_rng(Stream.reference_fits(seed))
        self._fits: list[tuple[list[Key], npt.NDArray[np.float64]]] = []
        self._base: tuple[list[Key], npt.NDArray[np.float64]] | None = None

    def _keys(self, batch: Any) -> list[Key]:
        mask = np.asarray(batch.mask, dtype=bool)
        return belief_keys(self.env, np.asarray(batch.token_ids), mask, np.asarray(batch.offsets, dtype=np.int64))

    @staticmethod
    def _returns(batch: Any) -> npt.NDArray[np.float64]:
        scores = np.asarray(batch.trajectory_scores(), dtype=np.float64)
        mask = np.asarray(batch.mask, dtype=bool)
        per_token: npt.NDArray[np.float64] = np.repeat(scores, np.diff(np.asarray(batch.offsets)))[mask]
        return per_token

    def add_base(self, batch: Any) -> None:
        """Rollouts of the base policy: the table's data until ``window`` updates are in."""
        self._base = (self._keys(batch), self._returns(batch))

    def add(self, batch: Any, keys: list[Key] | None = None) -> None:
        """A batch of the current policy's rollouts, after its values were read (``keys``: its
        belief keys, when already read)."""
        entry = (self._keys(batch) if keys is None else keys, self._returns(batch))
        self._fits = [*self._fits, entry][-self.window :]

    def read_and_add(self, batch: Any) -> npt.NDArray[np.float32]:
        """:meth:`values` of a training batch, then :meth:`add` of it."""
        keys = self._keys(batch)
        out = self._values(batch, keys)
        self.add(batch, keys)
        return out

    def values(self, batch: Any) -> npt.NDArray[np.float32]:
        """V(tokens < q) on every policy token of ``batch`` (0 elsewhere), as its critic."""
        return self._values(batch, self._keys(batch))

    def _values(self, batch: Any, keys: list[Key]) -> npt.NDArray[np.float32]:
        mask = np.asarray(batch.mask, dtype=bool)
        fits = self._fits if len(self._fits) == self.window or self._base is None else [self._base, *self._fits]
        data_keys = [k for fit_keys, _ in fits for k in fit_keys]
        data_returns = np.concatenate([r for _, r in fits]) if fits else np.zeros(0)
        table = TabularCritic(data_keys, data_returns)
        v = table(keys)
        k = self.ev_fraction
        if k is not None and k < 1.0:
            mean = float(np.mean(data_returns)) if data_returns.size else 0.0
            turns = segment_turns(mask, np.asarray(batch.offsets, dtype=np.int64)).token_turn[mask]
            noise = self._rng.normal(
                0.0, math.sqrt(k * (1.0 - k) * float(np.var(v))), size=int(turns.max(initial=-1)) + 1
            )
            v = mean + k * (v - mean) + noise[turns]
        out = np.zeros(mask.size, dtype=np.float32)
        out[mask] = v
        return out


def _index_in_group(group_ids: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Each trajectory's place among the rollouts of its task (0, 1, 2, ...)."""
    seen: dict[Any, int] = {}
    out = np.empty(len(group_ids), dtype=np.int64)
    for i, g in enumerate(group_ids.tolist()):
        out[i] = seen.get(g, 0)
        seen[g] = out[i] + 1
    return out


def reference_measurement(env: Any, batch: Any) -> dict[str, Any]:
    """The reference critic on ``batch`` (a :class:`~mpo_rs.torch.batch.RolloutBatch` of the
    policy's rollouts of ``env``'s task, in groups): ``explained_variance`` (cross-fitted, on
    the policy tokens, against the trajectory's score), ``median_between_share`` of its values
    and ``keys`` (distinct full keys)."""
    from mpo_rs.diagnose import summarize_value_structure, value_structure
    from mpo_rs.torch.metrics import explained_variance

    mask = np.asarray(batch.mask, dtype=bool)
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    keys = belief_keys(env, np.asarray(batch.token_ids), mask, offsets)
    lengths = np.diff(offsets)
    scores = np.asarray(batch.trajectory_scores(), dtype=np.float64)
    per_token = np.repeat(np.arange(len(lengths)), lengths)[mask]
    returns = scores[per_token]
    fold = (_index_in_group(np.asarray(batch.group_ids)) % 2)[per_token].astype(np.int64)
    values = cross_fitted_values(keys, returns, fold)
    full = np.zeros(mask.size, dtype=np.float32)
    full[mask] = values
    summary = summarize_value_structure(value_structure(full, mask, offsets), outcome=scores)
    return {
        "explained_variance": explained_variance(values, returns),
        "median_between_share": summary["all"]["median_between_share"],
        "keys": len(set(keys)),
    }
