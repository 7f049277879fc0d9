"""Advantage columns for rollout logs held as Arrow tables.

A rollout log has one row per trajectory; its token columns are lists (``list`` or
``large_list``). :func:`with_advantages` reads the mask, values and reward columns through
the Arrow PyCapsule interface -- no copy of their buffers -- and returns the same kind of
object with four columns appended:

``advantages``        list<float32>, per token, 0 on observation tokens
``returns``           list<float32>, per token value targets (= advantages for the
                      critic-free group estimators, as in verl)
``turn_index``        list<int32>, the token's turn within its trajectory, -1 off-policy
``turn_advantages``   list<float32>, one per turn (MAE: A_t^turn; other estimators: the
                      turn's mean token advantage)

pyarrow ``Table`` / ``RecordBatch`` / struct ``ChunkedArray`` in, the same out; polars
``DataFrame`` / struct ``Series`` in, the same out. The input's columns are shared, not
copied. The lists of the outputs have the mask column's offset width.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

from . import _native
from . import observation_rewards as _observation
from ._deps import needs
from .columns import (
    OUTPUT_COLUMNS,
    REWARDS,
    SCORE,
    TOKEN_IDS,
    TRUNCATED,
    TURN_REWARDS,
    TURN_STATE_IDS,
    Columns,
    missing_column,
    missing_column_hint,
    with_hint,
)
from .estimators import CHECK_TOLERANCE
from .exceptions import InvalidBatchError, InvalidOptionError
from .options import ESTIMATORS, Estimator, resolve

__all__ = [
    "ESTIMATORS",
    "OUTPUT_COLUMNS",
    "Columns",
    "InvalidOptionError",
    "advantages_parquet",
    "with_advantages",
]


class _Run(NamedTuple):
    """The columns of a run and the two settings that go with them to
    ``_native.arrow_advantages``."""

    columns: Columns
    check_tolerance: float = CHECK_TOLERANCE
    observation_rewards: str = _observation.DEFAULT


# Tried, in this order, when neither a rewards nor a score column is named.
_DEFAULT_REWARDS = REWARDS
_DEFAULT_SCORE = SCORE


def with_advantages(
    table: Any,
    *,
    estimator: str | Estimator = "mae",
    columns: Columns | None = None,
    check_tolerance: float = CHECK_TOLERANCE,
    observation_rewards: str = _observation.DEFAULT,
    **options: Any,
) -> Any:
    """Returns ``table`` with the advantage columns appended.

    ``columns`` (an :class:`mpo_rs.Columns`; None: the defaults) names the log's columns;
    the column keywords ``mask_col``, ``values_col``, ``rewards_col``, ``score_col``,
    ``group_col``, ``turn_rewards_col``, ``truncated_col``, ``check_score_col``,
    ``turn_state_ids_col`` and ``token_ids_col`` are sugar that builds one (``mask_col="m"``
    is ``columns=Columns(mask="m")``).

    ``estimator`` is a name or an :class:`mpo_rs.Estimator`: ``"mae"`` (default), ``"gae"``,
    ``"bilevel"``, a critic-free group baseline over ``group_col``: ``"grpo"``, ``"drgrpo"`` or
    ``"rloo"``, or ``"gigpo"`` (groups over ``group_col`` and step groups by anchor state:
    a ``turn_state_ids_col`` list of one integer id per turn, else a ``token_ids_col`` list
    aligned with the mask, hashed as :func:`mpo_rs.gigpo_advantages` hashes it; with neither
    named, the ``turn_state_ids`` or ``token_ids`` column, in that order). ``options`` (``lam=0.9``, ...) override the estimator's options; None
    means the default. An unknown option, or one the estimator does not take, raises
    :class:`mpo_rs.InvalidOptionError` (see docs/estimators.md for the table).

    The reward signal is ``rewards_col`` (token-level list) or ``score_col`` (one number per
    row) or ``turn_rewards_col`` (a list of one reward per turn, placed on each turn's last
    policy token); with none named, the first of ``rewards``, ``score`` and ``turn_rewards``
    present is used. A row whose turn rewards are not one per turn raises
    ``InvalidBatchError`` naming the row and both counts; ``check_score_col`` names a score
    column the turn rewards must sum to (within ``check_tolerance * max(1, |score|)``).
    The group estimators score a row by the sum of its token (or turn) rewards.

    ``truncated_col`` (bool, one per row; the ``truncated`` column is read when present)
    marks rows cut off before their episode ended: MAE and GAE bootstrap the end from the
    last policy token's value instead of 0 (docs/estimators.md, "Truncation").

    ``observation_rewards`` says what happens to a token reward where the mask is 0
    (:data:`mpo_rs.observation_rewards.OBSERVATION_REWARDS`): ``"error"`` (default)
    refuses it, ``"drop"`` ignores it, ``"credit"`` moves it to the last policy token before
    it in its row (a score written into a padded row's last column), dropping it if there
    is none. Only the estimators (and the group scores) see the moved reward; the rewards
    column is returned as given. Per-turn rewards (placed on policy tokens) and scores have
    nothing to move; a truncated row is relocated like any other.

    Bad data raises :class:`mpo_rs.InvalidBatchError` naming the row (in the whole table),
    the column and the token: null lists or elements, list lengths that disagree within a
    row, mask values other than 0/1, NaN/Inf where read, rewards on observation tokens.
    """
    cols, options = Columns.split(columns, options)
    est = resolve(estimator, options, "mae")
    run = _Run(cols, check_tolerance, _observation.check(observation_rewards))
    try:
        return _with_advantages(table, est, _wanted_columns(cols, est), run)
    except InvalidBatchError as e:
        raise _with_missing_column_hint(e, table, cols) from None


def _with_advantages(table: Any, est: Estimator, names: list[str], columns: _Run) -> Any:
    polars = _module_of(table, "polars")
    if polars is not None:
        return _with_advantages_polars(polars, table, names, est, columns)

    pa = _pyarrow()
    if isinstance(table, pa.Table):
        _refuse_existing_outputs(table.column_names)
        out = _compute(table.select([n for n in names if n in table.column_names]), est, columns)
        for field, column in zip(out.schema, out.columns, strict=True):
            table = table.append_column(field, column)
        return table
    if isinstance(table, pa.RecordBatch):
        _refuse_existing_outputs(table.schema.names)
        out = _compute(table.select([n for n in names if n in table.schema.names]), est, columns)
        schema = table.schema
        for field in out.schema:
            schema = schema.append(field)
        new = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in out.columns]
        return pa.RecordBatch.from_arrays([*table.columns, *new], schema=schema)
    if isinstance(table, pa.ChunkedArray):
        if not pa.types.is_struct(table.type):
            raise InvalidBatchError(
                f"a ChunkedArray must be of struct type, one field per column of the log; got {table.type}"
            )
        return _with_advantages_struct_chunks(pa, table, est, columns)
    if hasattr(table, "__arrow_c_stream__") or hasattr(table, "__arrow_c_array__"):
        return _with_advantages(pa.table(table), est, names, columns)
    raise InvalidBatchError(
        "expected a pyarrow Table/RecordBatch/ChunkedArray, a polars DataFrame/Series, or an "
        f"object with the Arrow PyCapsule interface; got {type(table).__name__}"
    )


def _input_column_names(table: Any) -> list[str] | None:
    """The column names of a ``with_advantages`` input, as the user passed it."""
    for attr in ("column_names", "columns"):
        names = getattr(table, attr, None)
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return names
    schema = getattr(table, "schema", None)
    if schema is not None and isinstance(getattr(schema, "names", None), list):
        return list(schema.names)
    for dtype in (getattr(table, "type", None), getattr(table, "dtype", None)):
        fields = getattr(dtype, "fields", None)
        if fields is not None:
            try:
                return [str(f.name) for f in fields]
            except (AttributeError, TypeError):
                pass
        if dtype is not None and hasattr(dtype, "num_fields"):
            return [dtype.field(i).name for i in range(dtype.num_fields)]
    return None


def _with_missing_column_hint(e: InvalidBatchError, table: Any, columns: Columns) -> InvalidBatchError:
    """A missing-column error from Rust lists the columns it was passed (only those the
    estimator reads); name the input's own columns and the keyword that maps one."""
    hint = missing_column_hint(e, columns.chosen())
    if hint is None:
        return e
    names = _input_column_names(table)
    if names is not None and e.missing is not None and len(e.missing) == 1:
        # Rust listed (and matched against) only the columns handed over: use the input's.
        e.args = (missing_column(e.missing[0], names, "the input's "),)
    return with_hint(e, hint)


def advantages_parquet(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    estimator: str | Estimator = "mae",
    columns: Columns | None = None,
    check_tolerance: float = CHECK_TOLERANCE,
    observation_rewards: str = _observation.DEFAULT,
    progress: Callable[[str, int, int, int, float], object] | None = None,
    **options: Any,
) -> dict[str, int | float]:
    """What ``mpo-rs advantages INPUT -o OUTPUT`` does, from Python (see docs/parquet.md).

    Streams a Parquet file, or a directory of them, through the estimator in bounded
    memory and writes OUTPUT with the columns of :func:`with_advantages` appended --
    atomically: OUTPUT appears whole when the run succeeds and is left as it was otherwise.
    ``progress(phase, rows, tokens, total_rows, seconds)`` is called about ten times a
    second (phase ``"group-statistics"`` or ``"write"``); an exception raised in it, or
    Ctrl-C, stops the run. Returns the run's summary: files, row_groups, rows, tokens,
    policy_tokens, turns, input_bytes, output_bytes, seconds.

    ``estimator``, ``options``, ``observation_rewards``, ``columns`` and the column keywords are those of
    :func:`with_advantages` (the rewards column is written out as given).

    OUTPUT must be new or an earlier output of the tool (the output-safety rule,
    docs/reliability.md): an existing file or directory that is not, a device or a FIFO is
    never replaced.

    Raises :class:`mpo_rs.InvalidBatchError` for bad or corrupt data (the message names the
    file, row group, row and column), :class:`mpo_rs.InvalidOptionError` for unusable
    options or paths (OUTPUT equal to INPUT, an OUTPUT that is not an earlier output, two
    names of one input file, ...), and :class:`OSError` for I/O failures.
    """
    cols, options = Columns.split(columns, options)
    return _native.advantages_parquet(
        os.fspath(input),
        os.fspath(output),
        resolve(estimator, options, "mae"),
        cols,
        progress=progress,
        check_tolerance=check_tolerance,  # judged by Rust, with or without a check column
        observation_rewards=_observation.check(observation_rewards),
    )


def _wanted_columns(c: Columns, estimator: Estimator) -> list[str]:
    """Columns worth exporting to Rust (exporting only these keeps wide logs cheap)."""
    names = [c.mask, c.values, c.group, c.truncated or TRUNCATED]
    named = [x for x in (c.rewards, c.score, c.turn_rewards) if x is not None]
    names += named or [_DEFAULT_REWARDS, _DEFAULT_SCORE, TURN_REWARDS]
    names += [c.check_score] if c.check_score is not None else []
    anchors = [x for x in (c.turn_state_ids, c.token_ids) if x is not None]
    if estimator.family == "gigpo" or anchors:  # a named one reaches Rust, which refuses it elsewhere
        names += anchors or [TURN_STATE_IDS, TOKEN_IDS]
    return list(dict.fromkeys(names))


def _refuse_existing_outputs(names: list[str]) -> None:
    """Only the read columns go to Rust, so the clash with an output is checked here."""
    for name in OUTPUT_COLUMNS:
        if name in names:
            raise InvalidBatchError(
                f"column `{name}` is already in the input; the tool appends it and will not overwrite it"
            )


def _module_of(obj: Any, name: str) -> Any:
    """The library ``obj`` belongs to, if it is ``name`` (imported only if already loaded)."""
    import sys

    module = sys.modules.get(name)
    if module is None:
        return None
    if isinstance(obj, (module.DataFrame, module.Series)):
        return module
    if hasattr(module, "LazyFrame") and isinstance(obj, module.LazyFrame):
        raise InvalidBatchError("a polars LazyFrame has no data yet; pass `lazy_frame.collect()`")
    return None


def _pyarrow() -> Any:
    """pyarrow, or the one-line error naming the extra that installs it."""
    with needs("mpo_rs.arrow", "arrow"):
        import pyarrow
    return pyarrow


def _native_table(data: Any, estimator: Estimator, run: _Run) -> Any:
    return _native.arrow_advantages(
        data,
        estimator,
        run.columns,
        check_tolerance=run.check_tolerance,
        observation_rewards=run.observation_rewards,
    )


def _compute(data: Any, estimator: Estimator, columns: _Run) -> Any:
    """The output columns as a pyarrow Table, one chunk per input batch."""
    return _pyarrow().table(_native_table(data, estimator, columns))


def _with_advantages_polars(pl: Any, frame: Any, names: list[str], estimator: Estimator, columns: _Run) -> Any:
    if isinstance(frame, pl.Series):
        if not isinstance(frame.dtype, pl.Struct):
            raise InvalidBatchError(
                f"a polars Series must be a struct, one field per column of the log; got {frame.dtype}"
            )
        df = frame.struct.unnest()
        return _with_advantages_polars(pl, df, names, estimator, columns).to_struct(frame.name)
    _refuse_existing_outputs(frame.columns)
    narrow = frame.select([n for n in names if n in frame.columns])
    out = _native_table(narrow, estimator, columns)
    try:
        new = pl.DataFrame(out)
    except TypeError:  # polars releases without PyCapsule import go through pyarrow
        new = pl.from_arrow(_pyarrow().table(out))
    return frame.hstack(new.get_columns())


def _with_advantages_struct_chunks(pa: Any, chunked: Any, estimator: Estimator, columns: _Run) -> Any:
    batches = [pa.RecordBatch.from_struct_array(chunk) for chunk in chunked.chunks]
    table = pa.Table.from_batches(batches, schema=pa.schema(list(chunked.type)))
    out = _compute(table, estimator, columns)
    fields = [*chunked.type, *out.schema]
    chunks = []
    offset = 0
    for batch in batches:
        new = out.slice(offset, batch.num_rows)  # aligned to the input chunk, no copy
        offset += batch.num_rows
        arrays = [*batch.columns, *(c.combine_chunks() for c in new.columns)]
        chunks.append(pa.StructArray.from_arrays(arrays, fields=fields))
    return pa.chunked_array(chunks, type=pa.struct(fields))
