"""Synthetic rollout logs: the one factory of test, benchmark and demo data.

A log is a :class:`FlatBatch`: N multi-turn trajectories in mpo_rs's flat layout (token
arrays plus row offsets). Every trajectory is a prompt, then ``turns`` policy turns
separated by tool observations, then an optional tail of observation tokens; its outcome
(``scores``) is also the reward of its last policy token. :func:`flat_batch` draws one,
seeded; :func:`flat_batches` draws a long log chunk by chunk; :func:`to_arrow` and
:func:`write_parquet` give its Arrow and Parquet forms (pyarrow is imported only there).

Lengths and turn counts are given as a mean ``m`` (drawn uniformly from m//2 .. 3m//2,
at least 1) or as an inclusive range ``(lo, hi)`` (zero allowed: empty prompts, adjacent
turns, trajectories without policy tokens). :data:`TINY` and :data:`DEMO` are the shapes of
the tests' small logs and of ``make demo``; the defaults are the benchmarks' batches.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._deps import require
from .exceptions import InvalidOptionError

__all__ = [
    "DEMO",
    "TINY",
    "FlatBatch",
    "Written",
    "batch_for_tokens",
    "flat_batch",
    "flat_batches",
    "to_arrow",
    "write_parquet",
]

Spread = int | tuple[int, int]
"""A mean ``m`` (uniform on m//2 .. 3m//2, at least 1) or an inclusive range ``(lo, hi)``."""

VOCAB = 151_936

TINY: dict[str, Any] = dict(turns=(1, 3), turn_len=(1, 4), obs_len=(0, 3), score_levels=2, groups="random")
"""Rows of a few tokens: 1-3 turns of 1-4 tokens, observations of 0-3 tokens (the tests)."""

DEMO: dict[str, Any] = dict(
    turns=(6, 10),
    turn_len=(40, 200),
    obs_len=(20, 600),
    prompt_len=(260, 540),
    values="critic",
    score_levels=2,
    prompt_difficulty=True,
    tokens=True,
)
"""Agent trajectories of ~3,500 tokens (``make demo``): a ~400-token prompt, ~8 turns of
~120 policy tokens separated by ~310-token observations, a critic whose values move
towards the outcome from turn to turn, token ids and old log-probabilities."""


@dataclass
class FlatBatch:
    """N multi-turn trajectories, flat + offsets (mpo_rs's layout), with converters to the
    layouts other tools take: padded (B, L) rows (verl), per-trajectory policy-token arrays,
    one policy-token sequence with end flags (torchrl) and a rollout log's columns."""

    values: np.ndarray  # float32[T]
    mask: np.ndarray  # bool[T]
    offsets: np.ndarray  # int64[N+1]
    rewards: np.ndarray  # float32[T]: the outcome on each trajectory's last policy token
    scores: np.ndarray  # float32[N]
    group_ids: np.ndarray  # int64[N]: rollouts of one prompt share an id
    trajectory_ids: np.ndarray | None = None  # int64[N]: the row number in the whole log
    token_ids: np.ndarray | None = None  # int32[T], with `tokens=True`
    old_logprobs: np.ndarray | None = field(default=None)  # float32[T], 0 on observations

    @property
    def n_tokens(self) -> int:
        return int(self.mask.shape[0])

    @property
    def n_trajectories(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_policy_tokens(self) -> int:
        return int(np.count_nonzero(self.mask))

    @property
    def input_bytes(self) -> int:
        """Bytes mpo_rs reads for a token estimator: values, mask, rewards, offsets."""
        return sum(a.nbytes for a in (self.values, self.mask, self.rewards, self.offsets))

    def describe(self) -> dict[str, Any]:
        lengths = np.diff(self.offsets)
        return {
            "trajectories": self.n_trajectories,
            "tokens": self.n_tokens,
            "policy_tokens": self.n_policy_tokens,
            "turns": int(np.count_nonzero(self.mask[1:] & ~self.mask[:-1]) + self.mask[:1].sum()),
            "max_trajectory_tokens": int(lengths.max(initial=0)),
            "group_size": int(np.bincount(self.group_ids).max(initial=0)),
        }

    def padded_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) in the padded layout of every flat token."""
        lengths = np.diff(self.offsets)
        rows = np.repeat(np.arange(self.n_trajectories), lengths)
        cols = np.arange(self.n_tokens) - np.repeat(self.offsets[:-1], lengths)
        return rows, cols

    def padded_shape(self) -> tuple[int, int]:
        return self.n_trajectories, int(np.diff(self.offsets).max(initial=0))

    def padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, rewards, mask) as (B, L) float32 arrays, right-padded with zeros."""
        rows, cols = self.padded_index()
        out = []
        for flat in (np.nan_to_num(self.values), self.rewards, self.mask.astype(np.float32)):
            pad = np.zeros(self.padded_shape(), np.float32)
            pad[rows, cols] = flat
            out.append(pad)
        return out[0], out[1], out[2]

    def policy_only(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per-trajectory (rewards, values) of policy tokens only, float64."""
        rs, vs = [], []
        for j in range(self.n_trajectories):
            sl = slice(self.offsets[j], self.offsets[j + 1])
            m = self.mask[sl]
            rs.append(self.rewards[sl][m].astype(np.float64))
            vs.append(self.values[sl][m].astype(np.float64))
        return rs, vs

    def policy_flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All policy tokens in one sequence: (values, rewards, last) where `last` marks
        each trajectory's last policy token (the `done` flag of RL libraries)."""
        traj_of_token = np.repeat(np.arange(self.n_trajectories), np.diff(self.offsets))[self.mask]
        last = np.ones(traj_of_token.shape[0], bool)
        last[:-1] = traj_of_token[1:] != traj_of_token[:-1]
        return self.values[self.mask], self.rewards[self.mask], last

    def log_columns(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`mpo_rs.rollout_log.RolloutLogWriter.append_flat`
        that hold the batch (all but ``step``)."""
        return {
            "token_ids": self.token_ids,
            "loss_mask": self.mask,
            "offsets": self.offsets,
            "values": self.values,
            "rewards": self.rewards,
            "scores": self.scores,
            "group_ids": self.group_ids,
        }


def _lengths(rng: np.random.Generator, spread: Spread, size: int) -> np.ndarray:
    if isinstance(spread, tuple):
        lo, hi = spread
        return rng.integers(lo, hi + 1, size)
    return np.maximum(1, rng.integers(spread // 2, spread * 3 // 2 + 1, size))


def _turn_count(rng: np.random.Generator, spread: Spread) -> int:
    if isinstance(spread, tuple):
        return int(rng.integers(spread[0], spread[1] + 1))
    return int(rng.integers(max(1, spread // 2), spread * 3 // 2 + 1))


def _check_spread(name: str, spread: Spread) -> None:
    ok = (
        spread >= 1
        if isinstance(spread, int)
        else (isinstance(spread, tuple) and len(spread) == 2 and 0 <= spread[0] <= spread[1])
    )
    if not ok:
        raise InvalidOptionError(
            f"synthetic: `{name}` must be a mean >= 1 or a range (lo, hi) with 0 <= lo <= hi, got {spread!r}"
        )


def _critic_values(rng: np.random.Generator, runs: list[np.ndarray], scores: np.ndarray) -> np.ndarray:
    """A critic's estimate of success that moves towards the outcome from one run of
    tokens (prompt, turn, observation) to the next and wobbles a little inside a run."""
    run_values = np.empty(sum(r.size for r in runs))
    k = 0
    for row, lengths in enumerate(runs):
        v = np.clip(rng.normal(0.5, 0.15), 0.0, 1.0)
        steps = rng.normal(0.0, 0.07, size=lengths.size)
        for i in range(lengths.size):
            v = min(1.0, max(0.0, v + 0.25 * (scores[row] - v) + steps[i]))
            run_values[k] = v
            k += 1
    all_lengths = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    values = np.repeat(run_values, all_lengths)
    return (values + rng.normal(0.0, 0.02, size=values.size)).astype(np.float32)


def _runs(
    rng: np.random.Generator,
    turns: Spread,
    turn_len: Spread,
    obs_len: Spread,
    prompt_len: Spread | None,
    tail_len: Spread,
) -> np.ndarray:
    """One trajectory's run lengths: prompt, turn, observation, turn, ..., turn, tail."""
    k = _turn_count(rng, turns)
    context = _lengths(rng, obs_len, max(k, 1))  # the prompt, then the observation after each turn
    policy = _lengths(rng, turn_len, k)
    if prompt_len is not None:
        context[0] = _lengths(rng, prompt_len, 1)[0]
    lengths = np.zeros(2 * k + 1, np.int64)  # prompt, turn, observation, ..., turn, tail
    lengths[0 : max(2 * k - 1, 1) : 2] = context
    lengths[1 : 2 * k : 2] = policy
    if tail_len != (0, 0):
        lengths[-1] += _lengths(rng, tail_len, 1)[0]  # without turns, the prompt's run
    return lengths


def _group_ids(
    rng: np.random.Generator, groups: str, rows: np.ndarray, group_size: int, groups_in_log: int
) -> np.ndarray:
    if groups == "contiguous":
        return rows // group_size
    if groups == "interleaved":
        return rows % groups_in_log
    if groups == "random":
        return rng.integers(0, groups_in_log, len(rows)).astype(np.int64)
    raise InvalidOptionError(f"synthetic: `groups` must be contiguous, interleaved or random, got {groups!r}")


def _token_values(rng: np.random.Generator, values: str, n_tokens: int) -> np.ndarray:
    """``uniform`` values in [-1, 1) or ``normal`` ones, float32."""
    if values == "uniform":
        token_values = rng.random(n_tokens, dtype=np.float32)
        token_values *= 2
        token_values -= 1  # in place: batches reach 10^8 tokens
        return token_values
    if values == "normal":
        out: np.ndarray = rng.standard_normal(n_tokens, dtype=np.float32)
        return out
    raise InvalidOptionError(f"synthetic: `values` must be uniform, normal or critic, got {values!r}")


def _rewards(
    rng: np.random.Generator, mask: np.ndarray, offsets: np.ndarray, scores: np.ndarray, reward_noise: float
) -> np.ndarray:
    """Shaping noise on policy tokens (``reward_noise``), plus each score on its row's last
    policy token."""
    rewards = np.zeros(mask.shape[0], np.float32)
    if reward_noise:
        rewards[mask] = (reward_noise * rng.standard_normal(int(mask.sum()))).astype(np.float32)
    policy_tokens = np.flatnonzero(mask)
    last = np.searchsorted(policy_tokens, offsets[1:]) - 1
    has_policy = (last >= 0) & (policy_tokens[np.maximum(last, 0)] >= offsets[:-1]) if policy_tokens.size else last >= 0
    rewards[policy_tokens[last[has_policy]]] += scores[has_policy]
    return rewards


def flat_batch(
    n: int,
    *,
    seed: int | np.random.Generator = 0,
    turns: Spread = 8,
    turn_len: Spread = 120,
    obs_len: Spread = 300,
    prompt_len: Spread | None = None,
    tail_len: Spread = (0, 0),
    group_size: int = 8,
    groups: Literal["contiguous", "interleaved", "random"] = "contiguous",
    n_groups: int | None = None,
    values: Literal["uniform", "normal", "critic"] = "uniform",
    nan_observations: bool = False,
    score_levels: int = 5,
    prompt_difficulty: bool = False,
    reward_noise: float = 0.0,
    tokens: bool = False,
    first_row: int = 0,
    total_rows: int | None = None,
) -> FlatBatch:
    """``n`` trajectories drawn from ``seed`` (the same arguments give the same batch).

    Shape: a prompt of ``prompt_len`` tokens (default: drawn like an observation), then
    ``turns`` policy turns of ``turn_len`` tokens separated by ``obs_len``-token
    observations, then ``tail_len`` observation tokens.

    Groups: ``contiguous`` (rows ``group_size`` at a time), ``interleaved`` (row % n_groups:
    every group spans the whole log) or ``random`` (uneven, singletons possible), over
    ``n_groups`` ids (default: ceil(total_rows / group_size)).

    Values: ``uniform`` in [-1, 1), ``normal``, or ``critic`` (moving towards the outcome
    turn by turn); ``nan_observations`` puts NaN on observation tokens (never read).
    Scores: ``score_levels`` partial-credit levels in [0, 1], or with ``prompt_difficulty``
    0/1 with a success rate that depends on the group. ``reward_noise`` adds shaping noise
    to the rewards of policy tokens; ``tokens`` adds token ids and old log-probabilities.

    ``first_row`` and ``total_rows`` place the batch in a longer log (:func:`flat_batches`).
    """
    for name, spread in (("turns", turns), ("turn_len", turn_len), ("obs_len", obs_len), ("tail_len", tail_len)):
        _check_spread(name, spread)
    if prompt_len is not None:
        _check_spread("prompt_len", prompt_len)
    if n < 0 or group_size < 1 or score_levels < 2:
        raise InvalidOptionError("synthetic: need n >= 0, group_size >= 1 and score_levels >= 2")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    total = first_row + n if total_rows is None else total_rows
    groups_in_log = n_groups if n_groups is not None else max(1, math.ceil(total / group_size))
    rows = first_row + np.arange(n, dtype=np.int64)

    runs = [_runs(rng, turns, turn_len, obs_len, prompt_len, tail_len) for _ in range(n)]
    is_policy = [np.arange(r.size) % 2 == 1 for r in runs]
    mask = np.repeat(np.concatenate(is_policy), np.concatenate(runs)) if runs else np.zeros(0, bool)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([int(r.sum()) for r in runs], out=offsets[1:])
    group_ids = _group_ids(rng, groups, rows, group_size, groups_in_log)

    def draw_scores() -> np.ndarray:
        if prompt_difficulty:
            difficulty = (group_ids * 2654435761 + 12345) % 1000 / 1000.0  # shared by a group
            return (rng.random(n) > difficulty).astype(np.float32)
        return (rng.integers(0, score_levels, n) / (score_levels - 1)).astype(np.float32)

    # The order of the draws is part of the batch: critic values follow the scores.
    if values == "critic":
        scores = draw_scores()
        token_values = _critic_values(rng, runs, scores)
    else:
        token_values = _token_values(rng, values, mask.shape[0])
        scores = draw_scores()
    if nan_observations:
        token_values[~mask] = np.nan
    rewards = _rewards(rng, mask, offsets, scores, reward_noise)

    batch = FlatBatch(token_values, mask, offsets, rewards, scores, group_ids.astype(np.int64), rows)
    if tokens:
        batch.token_ids = ((rng.pareto(1.2, size=mask.shape[0]) * 50).astype(np.int64) % VOCAB).astype(np.int32)
        batch.old_logprobs = np.where(mask, -rng.exponential(0.35, size=mask.shape[0]), 0.0).astype(np.float32)
    return batch


def flat_batches(rows: int, chunk_rows: int, *, seed: int = 0, **shape: Any) -> Iterator[FlatBatch]:
    """A log of ``rows`` trajectories drawn ``chunk_rows`` at a time from one seeded
    generator (memory: one chunk); groups and trajectory ids run over the whole log."""
    if chunk_rows < 1:
        raise InvalidOptionError("synthetic: chunk_rows must be at least 1")
    rng = np.random.default_rng(seed)
    for first in range(0, rows, chunk_rows):
        yield flat_batch(min(chunk_rows, rows - first), seed=rng, first_row=first, total_rows=rows, **shape)


def batch_for_tokens(
    tokens: float,
    *,
    turns: int = 8,
    turn_len: int = 120,
    obs_len: int = 300,
    group_size: int = 8,
    seed: int = 0,
    **shape: Any,
) -> FlatBatch:
    """A :func:`flat_batch` of about ``tokens`` tokens (whole groups of trajectories);
    ``shape`` passes the other options of :func:`flat_batch`."""
    mean_traj_tokens = max(1, turns) * (turn_len + obs_len)
    groups = max(1, round(tokens / mean_traj_tokens / group_size))
    return flat_batch(
        groups * group_size,
        seed=seed,
        turns=turns,
        turn_len=turn_len,
        obs_len=obs_len,
        group_size=group_size,
        **shape,
    )


def to_arrow(batch: FlatBatch, *, large: bool = False, chunks: int = 1, string_groups: bool = False) -> Any:
    """The batch as a pyarrow Table, one row per trajectory: ``trajectory_id``,
    ``group_id`` (int64, or ``"prompt-<id>"`` strings), ``score``, then list columns
    ``token_ids`` (when drawn), ``loss_mask`` (bool), ``values``, ``rewards`` and
    ``old_logprobs`` (when drawn). ``large`` uses large_list; ``chunks`` > 1 splits the
    table into that many record batches."""
    require("pyarrow", "mpo_rs.synthetic.to_arrow", "arrow")
    import pyarrow as pa

    list_type = pa.LargeListArray if large else pa.ListArray
    offsets = pa.array(batch.offsets, pa.int64() if large else pa.int32())

    def lists(tokens: np.ndarray) -> Any:
        return list_type.from_arrays(offsets, pa.array(tokens))

    ids = batch.trajectory_ids if batch.trajectory_ids is not None else np.arange(batch.n_trajectories)
    columns: dict[str, Any] = {
        "trajectory_id": pa.array(ids, pa.int64()),
        "group_id": (
            pa.array([f"prompt-{g}" for g in batch.group_ids.tolist()], pa.string())
            if string_groups
            else pa.array(batch.group_ids, pa.int64())
        ),
        "score": pa.array(batch.scores, pa.float32()),
    }
    if batch.token_ids is not None:
        columns["token_ids"] = lists(batch.token_ids)
    columns["loss_mask"] = lists(batch.mask.astype(bool))
    columns["values"] = lists(batch.values)
    columns["rewards"] = lists(batch.rewards)
    if batch.old_logprobs is not None:
        columns["old_logprobs"] = lists(batch.old_logprobs)
    table = pa.table(columns)
    if chunks <= 1:
        return table
    cuts = np.linspace(0, table.num_rows, chunks + 1).astype(int)
    return pa.Table.from_batches(
        [b for lo, hi in itertools.pairwise(cuts) for b in table.slice(lo, hi - lo).to_batches()],
        schema=table.schema,
    )


@dataclass(frozen=True)
class Written:
    """What :func:`write_parquet` wrote."""

    rows: int
    tokens: int
    paths: list[Path]


def write_parquet(
    path: str | os.PathLike[str],
    batches: FlatBatch | Iterable[FlatBatch],
    *,
    row_group_rows: int | None = None,
    files: int | Sequence[int] | None = None,
    compression: str = "snappy",
    large: bool = False,
    string_groups: bool = False,
) -> Written:
    """Writes the log as Parquet (the columns of :func:`to_arrow`), each file atomically
    (a hidden temporary, then a rename).

    Without ``files``, ``path`` is one file; ``batches`` may be an iterable (e.g.
    :func:`flat_batches`), written one at a time. With ``files`` -- a count (rows split
    evenly) or the rows of each file -- ``path`` is a directory of ``part-<i>.parquet``.
    Row groups hold ``row_group_rows`` rows (default: one per batch)."""
    require("pyarrow", "mpo_rs.synthetic.write_parquet", "arrow")
    import pyarrow.parquet as pq

    target = Path(path)
    if files is None:
        parts: list[tuple[Path, Iterable[FlatBatch]]] = [
            (target, [batches] if isinstance(batches, FlatBatch) else batches)
        ]
    else:
        if not isinstance(batches, FlatBatch):
            raise InvalidOptionError("synthetic.write_parquet: `files` splits one FlatBatch")
        n = batches.n_trajectories
        sizes = list(files) if not isinstance(files, int) else _even_split(n, files)
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise InvalidOptionError(f"synthetic.write_parquet: file sizes {sizes} do not add up to the {n} rows")
        target.mkdir(parents=True, exist_ok=True)
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        parts = [
            (target / f"part-{i}.parquet", [_rows(batches, int(lo), int(hi))])
            for i, (lo, hi) in enumerate(itertools.pairwise(starts))
        ]
    rows = tokens = 0
    written = []
    for file, chunk_iter in parts:
        tmp = file.with_name(f".{file.name}.partial")
        writer = None
        try:
            for chunk in chunk_iter:
                table = to_arrow(chunk, large=large, string_groups=string_groups)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema, compression=compression)
                writer.write_table(table, row_group_size=row_group_rows or max(1, table.num_rows))
                rows += chunk.n_trajectories
                tokens += chunk.n_tokens
            if writer is None:
                raise InvalidOptionError(f"synthetic.write_parquet: nothing to write to {file}")
            writer.close()
            writer = None
            os.replace(tmp, file)
        finally:
            if writer is not None:
                writer.close()
            tmp.unlink(missing_ok=True)
        written.append(file)
    return Written(rows, tokens, written)


def _even_split(n: int, files: int) -> list[int]:
    if files < 1:
        raise InvalidOptionError("synthetic.write_parquet: files must be at least 1")
    cuts = np.linspace(0, n, files + 1).astype(int)
    return [int(size) for size in np.diff(cuts)]


def _rows(batch: FlatBatch, lo: int, hi: int) -> FlatBatch:
    """Trajectories lo..hi of a batch, offsets rebased to 0."""
    t0, t1 = int(batch.offsets[lo]), int(batch.offsets[hi])

    def tokens(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[t0:t1]

    return FlatBatch(
        batch.values[t0:t1],
        batch.mask[t0:t1],
        batch.offsets[lo : hi + 1] - t0,
        batch.rewards[t0:t1],
        batch.scores[lo:hi],
        batch.group_ids[lo:hi],
        None if batch.trajectory_ids is None else batch.trajectory_ids[lo:hi],
        tokens(batch.token_ids),
        tokens(batch.old_logprobs),
    )
