"""Advantages over a ``ray.data.Dataset`` of rollout rows, for logs larger than one machine.

The dataset holds one trajectory per row with the columns of a rollout log (spec section 5,
``docs/parquet.md``). :func:`add_advantages` appends ``advantages``, ``returns``,
``turn_index`` and ``turn_advantages`` with the same values and types as
``mpo-rs advantages`` writes on one machine:

* ``mae`` and ``gae`` are per trajectory: one ``map_batches`` over Arrow batches, each handed
  to the Rust core through the Arrow C interface without copying its buffers.
* the group baselines (``grpo``, ``drgrpo``, ``rloo``) need every member of a group, and a
  group's rows may sit in any block on any node. A first pass reads only the score and
  group columns and reduces them to per-group count, sum and squared deviation (partial
  statistics per block, merged on the driver with the parallel-variance formula); the
  table, one row per group, is put in the object store once, and the map computes each
  row's advantage from it.

Works unchanged on a multi-node cluster: start Ray there (``ray start``), call
``ray.init(address="auto")`` on the driver, and read and write paths every node can reach
(shared storage or ``s3://`` / ``gs://`` URIs). Needs the ``ray`` extra
(``pip install mpo-rs[ray]``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._deps import missing

try:
    import pyarrow as pa  # type: ignore[import-untyped]
    import ray
    import ray.data
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.integrations.ray", "ray", _e) from None

from .. import _native
from .._native import InvalidBatchError
from ..arrow import ESTIMATORS, OUTPUT_COLUMNS, with_advantages
from ..estimators import broadcast_to_tokens, segment_turns

__all__ = [
    "GROUP_ESTIMATORS",
    "add_advantages",
    "advantages_parquet",
    "group_statistics",
]

GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo")
_DEFAULT_EPS = 1e-6  # mpo_core's GroupParams default, as `mpo-rs advantages` uses


@dataclass(frozen=True)
class _Columns:
    mask: str
    values: str
    group: str
    reward: str
    token_rewards: bool  # True: `reward` is a list of token rewards; False: one score per row


@dataclass(frozen=True)
class _Options:
    estimator: str
    lam: float | None
    lam_intra: float | None
    beta: float | None
    gamma: float | None
    lam_critic: float | None
    eps: float | None

    def keywords(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator,
            "lam": self.lam,
            "lam_intra": self.lam_intra,
            "beta": self.beta,
            "gamma": self.gamma,
            "lam_critic": self.lam_critic,
            "eps": self.eps,
        }


# --------------------------------------------------------------------------- public API


def add_advantages(
    dataset: ray.data.Dataset,
    *,
    estimator: str = "mae",
    lam: float | None = None,
    lam_intra: float | None = None,
    beta: float | None = None,
    gamma: float | None = None,
    lam_critic: float | None = None,
    eps: float | None = None,
    mask_col: str = "loss_mask",
    values_col: str = "values",
    rewards_col: str | None = None,
    score_col: str | None = None,
    group_col: str = "group_id",
    batch_size: int | None = None,
) -> ray.data.Dataset:
    """``dataset`` with the four advantage columns appended to every row.

    Options and column names as :func:`mpo_rs.arrow.with_advantages` and the
    ``mpo-rs advantages`` command (the estimator's defaults for options left None; an option
    it does not use raises :class:`mpo_rs._native.InvalidOptionError`). Options and the
    columns' types are checked here, on the driver, before any task runs.

    ``mae``/``gae`` return a lazy dataset. The group estimators first run the statistics
    pass (a Ray job that reads only the score and group columns) and then return the lazy
    mapped dataset. ``batch_size`` is the rows per ``map_batches`` call (None: one call per
    block). Errors in the data raise from the task that meets them, naming the column and
    the row within the batch.
    """
    options = _Options(estimator, lam, lam_intra, beta, gamma, lam_critic, eps)
    columns = _resolve_columns(_arrow_schema(dataset), options, mask_col, values_col, rewards_col, score_col, group_col)
    if estimator not in GROUP_ESTIMATORS:
        return dataset.map_batches(
            functools.partial(_annotate_batch, options=options, columns=columns),
            batch_format="pyarrow",
            batch_size=batch_size,
            zero_copy_batch=True,
        )
    stats = _group_statistics(dataset, columns)
    # Put once: every task reads the same copy from the object store (see _lookup).
    stats_ref = ray.put(stats)
    return dataset.map_batches(
        functools.partial(_annotate_group_batch, options=options, columns=columns, stats_ref=stats_ref),
        batch_format="pyarrow",
        batch_size=batch_size,
        zero_copy_batch=True,
    )


def group_statistics(
    dataset: ray.data.Dataset,
    *,
    rewards_col: str | None = None,
    score_col: str | None = None,
    group_col: str = "group_id",
    mask_col: str = "loss_mask",
) -> pa.Table:
    """Per-group ``count``, ``sum``, ``mean`` and ``m2`` (sum of squared deviations from the
    mean) of the row scores, one row per distinct ``group`` (sorted). A row's score is its
    ``score_col`` value, or the sum of its token rewards (then rewards on observation tokens
    are refused, as ``mpo-rs advantages`` refuses them). Runs one Ray job."""
    options = _Options("drgrpo", None, None, None, None, None, None)
    columns = _resolve_columns(_arrow_schema(dataset), options, mask_col, "values", rewards_col, score_col, group_col)
    return _group_statistics(dataset, columns)


def advantages_parquet(
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    estimator: str = "mae",
    lam: float | None = None,
    lam_intra: float | None = None,
    beta: float | None = None,
    gamma: float | None = None,
    lam_critic: float | None = None,
    eps: float | None = None,
    mask_col: str = "loss_mask",
    values_col: str = "values",
    rewards_col: str | None = None,
    score_col: str | None = None,
    group_col: str = "group_id",
    batch_size: int | None = None,
    **read_parquet_args: Any,
) -> None:
    """Reads Parquet rollout logs (files, directories or URIs) with ``ray.data.read_parquet``,
    appends the advantage columns and writes the rows as Parquet files under ``output``
    (``Dataset.write_parquet``). Unlike ``mpo-rs advantages``, file names and row order
    follow Ray's blocks; keep an id column to join on, or set
    ``ray.data.DataContext.get_current().execution_options.preserve_order = True``."""
    paths = os.fspath(input) if isinstance(input, (str, os.PathLike)) else [os.fspath(p) for p in input]
    dataset = ray.data.read_parquet(paths, **read_parquet_args)
    annotated = add_advantages(
        dataset,
        estimator=estimator,
        lam=lam,
        lam_intra=lam_intra,
        beta=beta,
        gamma=gamma,
        lam_critic=lam_critic,
        eps=eps,
        mask_col=mask_col,
        values_col=values_col,
        rewards_col=rewards_col,
        score_col=score_col,
        group_col=group_col,
        batch_size=batch_size,
    )
    annotated.write_parquet(os.fspath(output))


# --------------------------------------------------------------------------- driver side


def _arrow_schema(dataset: ray.data.Dataset) -> pa.Schema:
    schema = dataset.schema()
    if schema is None:
        raise ValueError("the dataset has no schema (no rows and no metadata)")
    base = getattr(schema, "base_schema", None)
    if isinstance(base, pa.Schema):
        return base
    return pa.schema(list(zip(schema.names, schema.types)))


def _resolve_columns(
    schema: pa.Schema,
    options: _Options,
    mask_col: str,
    values_col: str,
    rewards_col: str | None,
    score_col: str | None,
    group_col: str,
) -> _Columns:
    if options.estimator not in ESTIMATORS:
        raise _native.InvalidOptionError(
            f"unknown estimator `{options.estimator}`; choose one of {', '.join(ESTIMATORS)}"
        )
    if rewards_col is not None and score_col is not None:
        raise _native.InvalidOptionError("give at most one of `rewards_col` and `score_col`")
    if rewards_col is None and score_col is None:
        # As mpo_rs.arrow.with_advantages: a `rewards` column if present, else `score`.
        rewards_col, score_col = ("rewards", None) if "rewards" in schema.names else (None, "score")
    reward = rewards_col if rewards_col is not None else score_col
    assert reward is not None
    columns = _Columns(mask_col, values_col, group_col, reward, token_rewards=rewards_col is not None)
    # The Rust path checks the options and every column's presence and type on an empty
    # table of this schema, so a bad call fails here rather than inside a remote task.
    with_advantages(
        schema.empty_table(),
        **options.keywords(),
        mask_col=mask_col,
        values_col=values_col,
        rewards_col=rewards_col,
        score_col=score_col,
        group_col=group_col,
    )
    return columns


def _group_statistics(dataset: ray.data.Dataset, columns: _Columns) -> pa.Table:
    needed = [columns.group, columns.reward] + ([columns.mask] if columns.token_rewards else [])
    partial = dataset.select_columns(list(dict.fromkeys(needed))).map_batches(
        functools.partial(_partial_group_statistics, columns=columns),
        batch_format="pyarrow",
        batch_size=None,
        zero_copy_batch=True,
    )
    tables = [t for t in ray.get(partial.to_arrow_refs()) if t.num_rows]
    if not tables:
        return _stats_table(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0))
    return _merge_group_statistics(pa.concat_tables(tables))


def _merge_group_statistics(partial: pa.Table) -> pa.Table:
    """Merges per-block (count, sum, m2) of each group: with n = sum n_i and
    mean = sum s_i / n, m2 = sum(m2_i + n_i (mean_i - mean)^2) (Chan et al.)."""
    keys, inverse = np.unique(_numpy_keys(partial["group"]), return_inverse=True)
    inverse = inverse.reshape(-1)
    n_i = partial["count"].to_numpy().astype(np.float64)
    sum_i = partial["sum"].to_numpy()
    m2_i = partial["m2"].to_numpy()
    count = np.bincount(inverse, weights=n_i)
    total = np.bincount(inverse, weights=sum_i)
    mean = total / count
    spread = m2_i + n_i * (sum_i / n_i - mean[inverse]) ** 2
    return _stats_table(keys, count.astype(np.int64), total, np.bincount(inverse, weights=spread))


def _stats_table(keys: np.ndarray, count: np.ndarray, total: np.ndarray, m2: np.ndarray) -> pa.Table:
    mean = np.divide(total, count, out=np.zeros_like(total, dtype=np.float64), where=count > 0)
    key_type = {"i": pa.int64(), "u": pa.int64(), "f": pa.float64()}.get(keys.dtype.kind, pa.large_string())
    return pa.table(
        {
            "group": pa.array(keys, type=key_type),
            "count": pa.array(count, type=pa.int64()),
            "sum": pa.array(total, type=pa.float64()),
            "mean": pa.array(mean, type=pa.float64()),
            "m2": pa.array(m2, type=pa.float64()),
        }
    )


# --------------------------------------------------------------------------- tasks


def _annotate_batch(batch: pa.Table, options: _Options, columns: _Columns) -> pa.Table:
    """mae / gae: the Rust core over one Arrow batch (rows are independent)."""
    return with_advantages(
        batch,
        **options.keywords(),
        mask_col=columns.mask,
        values_col=columns.values,
        rewards_col=columns.reward if columns.token_rewards else None,
        score_col=None if columns.token_rewards else columns.reward,
        group_col=columns.group,
    )


def _partial_group_statistics(batch: pa.Table, columns: _Columns) -> pa.Table:
    """One block's per-group count, sum and m2 (squared deviations from the block mean)."""
    keys = _group_keys(batch.column(columns.group), columns.group)
    scores = _row_scores(batch, columns).astype(np.float64)
    uniques, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.reshape(-1)
    count = np.bincount(inverse, minlength=uniques.shape[0])
    total = np.bincount(inverse, weights=scores, minlength=uniques.shape[0])
    mean = total / np.maximum(count, 1)
    m2 = np.bincount(inverse, weights=(scores - mean[inverse]) ** 2, minlength=uniques.shape[0])
    return _stats_table(uniques, count, total, m2)


class _GroupLookup:
    """The merged statistics, sorted by group, as numpy arrays for a binary search."""

    def __init__(self, stats: pa.Table) -> None:
        self.keys = _numpy_keys(stats["group"])
        self.count = stats["count"].to_numpy()
        self.sum = stats["sum"].to_numpy()
        self.mean = stats["mean"].to_numpy()
        self.m2 = stats["m2"].to_numpy()

    def find(self, keys: np.ndarray, column: str) -> np.ndarray:
        if self.keys.shape[0] == 0:
            where = np.zeros(keys.shape[0], dtype=np.int64)
            found = np.zeros(keys.shape[0], dtype=bool)
        else:
            where = np.minimum(np.searchsorted(self.keys, keys), self.keys.shape[0] - 1)
            found = self.keys[where] == keys
        if not np.all(found):
            row = int(np.flatnonzero(~found)[0])
            raise InvalidBatchError(
                f"row {row} of a batch, column `{column}`: group id {keys[row]!r} not seen by the "
                "statistics pass (did the input change during the run?)"
            )
        return where


# One lookup per worker process, rebuilt only when a new statistics table arrives.
_lookup_cache: dict[str, _GroupLookup] = {}


def _lookup(stats_ref: Any) -> _GroupLookup:
    key = stats_ref.hex() if hasattr(stats_ref, "hex") else str(id(stats_ref))
    lookup = _lookup_cache.get(key)
    if lookup is None:
        stats = ray.get(stats_ref) if isinstance(stats_ref, ray.ObjectRef) else stats_ref
        lookup = _GroupLookup(stats)
        _lookup_cache.clear()
        _lookup_cache[key] = lookup
    return lookup


def _group_row_advantages(
    scores: np.ndarray, where: np.ndarray, lookup: _GroupLookup, estimator: str, eps: float
) -> np.ndarray:
    """mpo_core's group formulas (spec 2.3) in float64, rounded to float32 like it."""
    s = scores.astype(np.float32).astype(np.float64)
    n = lookup.count[where].astype(np.float64)
    others = np.maximum(n - 1.0, 1.0)
    if estimator == "rloo":
        adv = s - (lookup.sum[where] - s) / others
    elif estimator == "grpo":
        adv = (s - lookup.mean[where]) / (np.sqrt(lookup.m2[where] / others) + eps)
    else:  # drgrpo
        adv = s - lookup.mean[where]
    return np.where(n < 2, 0.0, adv).astype(np.float32)


def _annotate_group_batch(batch: pa.Table, options: _Options, columns: _Columns, stats_ref: Any) -> pa.Table:
    lookup = _lookup(stats_ref)
    keys = _group_keys(batch.column(columns.group), columns.group)
    where = lookup.find(keys, columns.group)
    eps = _DEFAULT_EPS if options.eps is None else float(options.eps)
    per_row = _group_row_advantages(_row_scores(batch, columns), where, lookup, options.estimator, eps)

    mask_list = _one_chunk(batch.column(columns.mask))
    mask, offsets = _flat_mask(mask_list, columns.mask)
    advantages = broadcast_to_tokens(per_row, mask, offsets)
    turns = segment_turns(mask, offsets)
    lengths = np.diff(offsets)
    row_of_token = np.repeat(np.arange(lengths.shape[0]), lengths)
    first_turn = turns.traj_offsets[:-1][row_of_token]
    turn_index = np.where(turns.token_turn >= 0, turns.token_turn - first_turn, -1).astype(np.int32)
    turn_advantages = np.repeat(per_row, np.diff(turns.traj_offsets))

    large = pa.types.is_large_list(mask_list.type)
    values = [advantages, advantages, turn_index, turn_advantages]
    list_offsets = [offsets, offsets, offsets, turns.traj_offsets]
    for name, flat, offs in zip(OUTPUT_COLUMNS, values, list_offsets):
        batch = batch.append_column(*_list_column(name, flat, offs, large))
    return batch


# --------------------------------------------------------------------------- Arrow helpers


def _one_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _list_values(array: pa.Array, name: str) -> tuple[pa.Array, np.ndarray]:
    """The flattened values of a list column and its offsets from 0 (int64)."""
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise TypeError(f"column `{name}` must be a list, got {array.type}")
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidBatchError(f"row {row} of a batch, column `{name}`: null list")
    raw = array.offsets.to_numpy()
    values = array.flatten()
    if values.null_count:
        raise InvalidBatchError(f"column `{name}` holds a null element")
    return values, (raw - raw[0]).astype(np.int64)


def _flat_mask(array: pa.Array, name: str) -> tuple[np.ndarray, np.ndarray]:
    values, offsets = _list_values(array, name)
    flat = values.to_numpy(zero_copy_only=False)
    if flat.dtype == np.bool_:
        return flat.view(np.uint8), offsets
    bad = np.flatnonzero((flat != 0) & (flat != 1))
    if bad.size:
        raise InvalidBatchError(f"column `{name}` must hold 0 or 1, found {flat[bad[0]]!r}")
    return flat.astype(np.uint8), offsets


def _row_scores(batch: pa.Table, columns: _Columns) -> np.ndarray:
    """One float32 score per row, read as mpo-rs advantages reads it: the score column, or
    each row's token rewards summed in float64 in order."""
    column = _one_chunk(batch.column(columns.reward))
    name = columns.reward
    if not columns.token_rewards:
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise InvalidBatchError(f"row {row} of a batch, column `{name}`: null score")
        scores = column.to_numpy(zero_copy_only=False).astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            raise InvalidBatchError(f"row {bad[0]} of a batch, column `{name}`: score is {scores[bad[0]]}")
        return scores
    values, offsets = _list_values(column, name)
    rewards = values.to_numpy(zero_copy_only=False).astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise InvalidBatchError(f"column `{name}`: reward {rewards[bad[0]]} at token {bad[0]} of a batch")
    mask, mask_offsets = _flat_mask(_one_chunk(batch.column(columns.mask)), columns.mask)
    if not np.array_equal(offsets, mask_offsets):
        row = int(np.flatnonzero(np.diff(offsets) != np.diff(mask_offsets))[0])
        raise InvalidBatchError(f"row {row} of a batch: `{name}` and `{columns.mask}` have different lengths")
    on_observation = np.flatnonzero((mask == 0) & (rewards != 0))
    if on_observation.size:
        token = int(on_observation[0])
        row = int(np.searchsorted(offsets, token, side="right") - 1)
        raise InvalidBatchError(
            f"row {row} of a batch, column `{name}`: reward {rewards[token]} on observation token "
            f"{token - offsets[row]}; rewards must be 0 where the mask is 0"
        )
    rows = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    sums = np.bincount(rows, weights=rewards.astype(np.float64), minlength=offsets.shape[0] - 1)
    return sums.astype(np.float32)


def _group_keys(column: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """Group ids as int64 or str numpy arrays (integers of any width compare by value)."""
    array = _one_chunk(column)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if array.null_count:
        row = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidBatchError(f"row {row} of a batch, column `{name}`: null group id")
    kind = array.type
    if pa.types.is_integer(kind):
        try:
            return array.cast(pa.int64()).to_numpy()
        except pa.ArrowInvalid:
            raise InvalidBatchError(f"column `{name}`: group ids beyond int64") from None
    if pa.types.is_floating(kind):
        # The group-id rule (mpo_rs.estimators.group_codes): floats by value, NaN and inf
        # are missing ids and refused like nulls.
        keys = array.cast(pa.float64()).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isfinite(keys))
        if bad.size:
            row = int(bad[0])
            raise InvalidBatchError(f"row {row} of a batch, column `{name}`: group id {keys[row]} is missing")
        return keys + 0.0  # -0.0 and 0.0 are one group
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return array.to_numpy(zero_copy_only=False)
    raise TypeError(
        f"column `{name}` must hold integer, float or string group ids (or a dictionary of them), got {kind}"
    )


def _numpy_keys(column: pa.ChunkedArray) -> np.ndarray:
    array = _one_chunk(column)
    if pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        return array.to_numpy()
    return array.to_numpy(zero_copy_only=False)


def _list_column(name: str, flat: np.ndarray, offsets: np.ndarray, large: bool) -> tuple[pa.Field, pa.Array]:
    """A non-nullable list column like the ones mpo-rs advantages writes."""
    item_type = pa.from_numpy_dtype(flat.dtype)
    item = pa.field("item", item_type, nullable=False)
    list_type = pa.large_list(item) if large else pa.list_(item)
    offset_type = pa.int64() if large else pa.int32()
    array = pa.ListArray if not large else pa.LargeListArray
    built = array.from_arrays(pa.array(offsets, type=offset_type), pa.array(flat, type=item_type), type=list_type)
    return pa.field(name, list_type, nullable=False), built
