"""Advantages over a ``ray.data.Dataset`` of rollout rows, for logs larger than one machine.

The dataset holds one trajectory per row with the columns of a rollout log
(``docs/parquet.md``). :func:`add_advantages` appends ``advantages``, ``returns``,
``turn_index`` and ``turn_advantages`` with the same values and types as
``mpo-rs advantages`` writes on one machine. Every step runs in the Rust core, each Arrow
batch handed over through the Arrow C interface without copying its buffers:

* ``mae`` and ``gae`` are per trajectory: one ``map_batches``.
* the group baselines (``grpo``, ``drgrpo``, ``rloo``) need every member of a group, and a
  group's rows may sit in any block on any node. A first pass reads only the score, group
  (and, for token rewards, mask) columns and reduces each block to per-group count, sum
  and squared deviation (:class:`mpo_rs._native.GroupStatistics`, shipped as an Arrow
  table); the driver merges them with the parallel-variance formula; the merged table, one
  row per group, is put in the object store once, and the map annotates each batch with it.
* ``gigpo``'s baselines are statistics of a group's rows and their turns' anchor states, so
  the dataset is grouped by the group column (``groupby(...).map_groups``, one shuffle) and
  each group annotated whole by :func:`mpo_rs.arrow.with_advantages`; rows come out
  grouped, not in their input order.

Works unchanged on a multi-node cluster: start Ray there (``ray start``), call
``ray.init(address="auto")`` on the driver, and read and write paths every node can reach
(shared storage or ``s3://`` / ``gs://`` URIs). Needs the ``ray`` extra.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._deps import needs

with needs("mpo_rs.integrations.ray", "ray"):
    import pyarrow as pa
    import ray
    import ray.data

from .. import observation_rewards as _observation
from .._native import GroupStatistics, annotate_batch, check_dataset_output, check_group_column, resolve_log_columns
from ..arrow import with_advantages
from ..columns import Columns
from ..exceptions import InvalidBatchError, InvalidOptionError
from ..options import Estimator, resolve

__all__ = ["add_advantages", "advantages_parquet", "group_statistics"]


@dataclass(frozen=True)
class _Resolved:
    """The columns as resolved on the driver: exactly one of ``rewards``, ``score`` and
    ``turn_rewards`` is set (no check of turn rewards against a score)."""

    columns: Columns
    statistics: tuple[str, ...]  # what the statistics pass reads
    observation_rewards: str

    @classmethod
    def resolve(
        cls, dataset: ray.data.Dataset, estimator: Estimator, observation_rewards: object, columns: Columns
    ) -> _Resolved:
        # Checks the columns' presence and types here, so a bad call fails on the driver
        # rather than inside a remote task.
        mode = _observation.check(observation_rewards)
        columns.refuse("check_score", where="the Ray adapter")
        rewards, score, turn, read = resolve_log_columns(_arrow_schema(dataset), estimator, columns=columns)
        resolved = replace(columns, rewards=rewards, score=score, turn_rewards=turn)
        return cls(resolved, tuple(dict.fromkeys(read)), mode)


def add_advantages(
    dataset: ray.data.Dataset,
    *,
    estimator: str | Estimator = "mae",
    columns: Columns | None = None,
    observation_rewards: str = _observation.DEFAULT,
    batch_size: int | None = None,
    **options: Any,
) -> ray.data.Dataset:
    """``dataset`` with the four advantage columns appended to every row.

    ``estimator`` (a name or an :class:`mpo_rs.Estimator`), the options of the Rust table
    (``lam=0.9``, ``norm_std=False``, ...; None meaning the default) and the columns
    (``columns``, an :class:`mpo_rs.Columns`, or the column keywords ``mask_col=``, ... that
    build one; a check-score column is refused, this adapter does not check turn rewards)
    and ``observation_rewards`` are those of :func:`mpo_rs.arrow.with_advantages` and the
    ``mpo-rs advantages`` command, resolved by the same :func:`mpo_rs.options.resolve`: an unknown option, or one
    the estimator does not take, raises :class:`mpo_rs.InvalidOptionError`. Options and
    the columns' types are checked here, on the driver, before any task runs.

    ``mae``/``gae`` return a lazy dataset. The group estimators first run the statistics
    pass (a Ray job that reads only the score and group columns) and then return the lazy
    mapped dataset. ``gigpo`` (anchor states from a ``turn_state_ids_col`` or
    ``token_ids_col`` list column, as in :func:`mpo_rs.arrow.with_advantages`) returns the
    dataset grouped by ``group_col`` with each group annotated whole, one call per group
    (``batch_size`` does not apply): its rows come out grouped. ``batch_size`` is the rows
    per ``map_batches`` call (None: one call per block). Errors in the data raise :class:`mpo_rs.InvalidBatchError` from the task that
    meets them, naming the column and the row within the batch; blocks whose group ids one
    log cannot hold together (the group-id rule) are refused naming the blocks.
    """
    cols, options = Columns.split(columns, options)
    est = resolve(estimator, options, "mae")
    resolved = _Resolved.resolve(dataset, est, observation_rewards, cols)
    if est.family == "gigpo":
        # Both baselines are within a group: each group's rows in one call, annotated whole.
        each = functools.partial(
            _annotate_group, estimator=est, columns=cols, observation_rewards=resolved.observation_rewards
        )
        return dataset.groupby(cols.group).map_groups(each, batch_format="pyarrow")
    # Put once: every task reads the same copy from the object store (see _statistics).
    stats_ref = ray.put(_group_statistics(dataset, resolved)) if est.family == "group" else None
    return dataset.map_batches(
        functools.partial(_annotate, estimator=est, columns=resolved, stats_ref=stats_ref),
        batch_format="pyarrow",
        batch_size=batch_size,
        zero_copy_batch=True,
    )


def group_statistics(
    dataset: ray.data.Dataset,
    *,
    columns: Columns | None = None,
    observation_rewards: str = _observation.DEFAULT,
    **column_keywords: str | None,
) -> pa.Table:
    """Per-group ``count``, ``sum``, ``mean`` and ``m2`` (sum of squared deviations from the
    mean) of the row scores, one row per distinct ``group`` (sorted; int64, uint64, float64
    or large_string: the one type that holds every id exactly). A row's score is its
    ``score_col`` value, the sum of its token rewards or of its per-turn rewards (``turn_rewards_col``) (then rewards on observation tokens
    are refused, dropped or credited as ``observation_rewards`` says, as in ``mpo-rs
    advantages``). ``columns`` (or the column keywords ``group_col=``, ``mask_col=``,
    ``rewards_col=``, ``score_col=``, ``turn_rewards_col=``) as in :func:`add_advantages`;
    the values and truncation columns are not read here. Runs one Ray job."""
    cols, rest = Columns.split(columns, column_keywords)
    if rest:
        raise InvalidOptionError(f"group_statistics takes no `{next(iter(rest))}`")
    cols.refuse("values", "truncated", where="group_statistics")
    return _group_statistics(dataset, _Resolved.resolve(dataset, Estimator("drgrpo"), observation_rewards, cols))


def advantages_parquet(
    input: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    estimator: str | Estimator = "mae",
    columns: Columns | None = None,
    observation_rewards: str = _observation.DEFAULT,
    batch_size: int | None = None,
    read_parquet_args: Mapping[str, Any] | None = None,
    **options: Any,
) -> None:
    """Reads Parquet rollout logs (files, directories or URIs) with ``ray.data.read_parquet``
    (``read_parquet_args`` passed on to it), appends the advantage columns and writes the
    rows as Parquet files under ``output`` (``Dataset.write_parquet``). ``estimator``,
    ``options`` and the columns are those of :func:`add_advantages`. Unlike
    ``mpo-rs advantages``, file names and row order follow Ray's blocks; keep an id column
    to join on, or set
    ``ray.data.DataContext.get_current().execution_options.preserve_order = True``.

    For the group estimators, local inputs are first checked as ``mpo-rs advantages``
    checks them (their footers only): files holding string group ids beside files holding
    number ids raise :class:`mpo_rs.InvalidBatchError` naming both, where Ray's reader would
    fail with Arrow's schema-merge error.

    ``output`` is never written into when it holds anything: Ray adds its files beside
    what is there (they would be read together later), so a local ``output`` must be new or
    an empty directory, must not be or lie inside an input, and no two local inputs may be
    one file (a symlink or hard link beside its target would be read twice); these raise
    :class:`mpo_rs.InvalidOptionError` before anything is read. Inputs and outputs given as
    URIs are not checked."""
    cols, options = Columns.split(columns, options)
    est = resolve(estimator, options, "mae")
    paths = [os.fspath(input)] if isinstance(input, (str, os.PathLike)) else [os.fspath(p) for p in input]
    local = [p for p in paths if os.path.exists(p)]
    out = os.fspath(output)
    check_dataset_output(local, None if "://" in out else out)
    read_args = dict(read_parquet_args or {})
    if est.family in ("group", "gigpo") and local and len(local) == len(paths):
        check_group_column(local, cols.group)
        if "schema" not in read_args:
            schema = _one_group_type(local, cols.group)
            if schema is not None:
                read_args["schema"] = schema
    source = paths[0] if isinstance(input, (str, os.PathLike)) else paths
    dataset = ray.data.read_parquet(source, **read_args)
    annotated = add_advantages(
        dataset, estimator=est, columns=cols, observation_rewards=observation_rewards, batch_size=batch_size
    )
    annotated.write_parquet(out)


def _one_group_type(inputs: list[str], group_col: str) -> pa.Schema | None:
    """For files whose group columns are numbers of different types (int64 here, double
    there): the unified schema with the group column in the one type of the group-id rule
    (float64 beside floats, else int64), so that Ray's reader casts every file to it -- left
    to itself it may pick the first file's int64 and truncate 0.5. None when the files
    agree (or have no such column)."""
    import pyarrow.parquet as pq

    from .._native import list_parquet_inputs

    schemas = [pq.read_schema(f) for path in inputs for f in list_parquet_inputs(path)]
    types = {s.field(group_col).type for s in schemas if group_col in s.names}
    if len(types) < 2:
        return None
    values = [t.value_type if pa.types.is_dictionary(t) else t for t in types]
    one = pa.float64() if any(pa.types.is_floating(t) for t in values) else pa.int64()
    unified = pa.unify_schemas(schemas, promote_options="permissive")
    return unified.set(unified.get_field_index(group_col), unified.field(group_col).with_type(one))


def _arrow_schema(dataset: ray.data.Dataset) -> pa.Schema:
    schema = dataset.schema()
    if schema is None:
        raise InvalidBatchError("the dataset has no schema (no rows and no metadata)")
    base = getattr(schema, "base_schema", None)
    if isinstance(base, pa.Schema):
        return base
    return pa.schema(list(zip(schema.names, schema.types, strict=True)))


def _group_statistics(dataset: ray.data.Dataset, columns: _Resolved) -> pa.Table:
    """The statistics pass: one partial table per block, merged here in block order."""
    partial = dataset.select_columns(list(columns.statistics)).map_batches(
        functools.partial(_partial_statistics, columns=columns),
        batch_format="pyarrow",
        batch_size=None,
        zero_copy_batch=True,
    )
    # In block order, empty blocks included, so an error of the group-id rule names the
    # blocks as the dataset numbers them.
    tables = ray.get(partial.to_arrow_refs())
    labels = [f"block {i}" for i in range(len(tables))]
    return pa.table(GroupStatistics.merge(tables, labels=labels).to_arrow())


def _partial_statistics(batch: pa.Table, columns: _Resolved) -> pa.Table:
    stats = GroupStatistics.scan(batch, columns=columns.columns, observation_rewards=columns.observation_rewards)
    return pa.table(stats.to_arrow())


# One statistics object per worker process, rebuilt only when a new table arrives.
_statistics_cache: dict[str, GroupStatistics] = {}


def _statistics(stats_ref: Any) -> GroupStatistics:
    key = stats_ref.hex() if hasattr(stats_ref, "hex") else str(id(stats_ref))
    stats = _statistics_cache.get(key)
    if stats is None:
        table = ray.get(stats_ref) if isinstance(stats_ref, ray.ObjectRef) else stats_ref
        stats = GroupStatistics.merge([table])  # a merged table merged alone is itself
        _statistics_cache.clear()
        _statistics_cache[key] = stats
    return stats


def _annotate_group(batch: pa.Table, estimator: Estimator, columns: Columns, observation_rewards: str) -> pa.Table:
    table: pa.Table = with_advantages(
        batch, estimator=estimator, columns=columns, observation_rewards=observation_rewards
    )
    return table


def _annotate(batch: pa.Table, estimator: Estimator, columns: _Resolved, stats_ref: Any) -> pa.Table:
    stats = None if stats_ref is None else _statistics(stats_ref)
    return pa.table(
        annotate_batch(
            batch, estimator, stats, columns=columns.columns, observation_rewards=columns.observation_rewards
        )
    )
