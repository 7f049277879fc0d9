"""Reading a Parquet rollout log for ``mpo-rs diagnose``, in bounded memory.

Streams a file or a directory of files record batch by record batch -- memory is bounded
by one batch plus a few numbers per trajectory -- and computes in Rust
(``_native.diagnose_batch``, which also checks every batch as ``mpo-rs advantages`` does),
per trajectory, the between/within-turn split of the token-weighted value variance and the
boundary jumps. The result is a :class:`Diagnosis`; its :meth:`~Diagnosis.summary` is the
one aggregate of :mod:`mpo_rs.diagnose.summary`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .. import _native
from .. import observation_rewards as _observation
from .._deps import require
from .._native import InvalidBatchError, InvalidOptionError
from ..columns import MASK, REWARDS, SCORE, STEP, TURN_REWARDS, VALUES, missing_column_error
from .summary import between_share, summarize

__all__ = ["Diagnosis", "TrajectoryTrace", "check_batch_rows", "diagnose_logs", "require_pyarrow"]

_Scalar = TypeVar("_Scalar", bound=np.generic)


@dataclass
class TrajectoryTrace:
    """The token-level values of one trajectory kept for plotting."""

    row: int
    outcome: float
    values: npt.NDArray[np.float32]
    mask: npt.NDArray[np.bool_]


@dataclass
class Diagnosis:
    """Per-trajectory results of a whole log (rows in file order) and the kept traces."""

    total: npt.NDArray[np.float64]
    between: npt.NDArray[np.float64]
    within: npt.NDArray[np.float64]
    n_turns: npt.NDArray[np.int64]
    outcome: npt.NDArray[np.float64]
    step: npt.NDArray[np.int64] | None
    jumps: npt.NDArray[np.float32]
    """All boundary jumps (NaN-free), with `jump_row` the trajectory of each."""
    jump_row: npt.NDArray[np.int64]
    traces: list[TrajectoryTrace] = field(default_factory=list)
    batches: int = 0

    @property
    def rows(self) -> int:
        return int(self.total.shape[0])

    @property
    def between_share(self) -> npt.NDArray[np.float64]:
        return between_share(self.total, self.between)

    def to_arrow(self) -> Any:
        """Per-trajectory results as a pyarrow Table."""
        import pyarrow as pa

        cols: dict[str, Any] = {
            "total_variance": self.total,
            "between_turn_variance": self.between,
            "within_turn_variance": self.within,
            "between_share": self.between_share,
            "n_turns": self.n_turns,
            "outcome": self.outcome,
        }
        if self.step is not None:
            cols["step"] = self.step
        return pa.table(cols)

    def summary(self) -> dict[str, Any]:
        """The aggregates of :func:`mpo_rs.diagnose.summary.summarize`: over trajectories
        with >= 2 turns and varying values, split by outcome and, with a step column, by
        training step."""
        return summarize(
            self.total,
            self.between,
            self.within,
            self.n_turns,
            self.jumps,
            self.jump_row,
            outcome=self.outcome,
            step=self.step,
        )


MAX_BATCH_ROWS = 2**63 - 1
"""The largest batch the Parquet reader takes (an int64); a row group is never exceeded."""


def check_batch_rows(batch_rows: object, name: str = "batch_rows") -> int:
    """``batch_rows`` as rows per streamed batch: an int from 1 to :data:`MAX_BATCH_ROWS`,
    else :class:`mpo_rs.InvalidOptionError` naming ``name``."""
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, (int, np.integer)):
        raise InvalidOptionError(f"{name} must be an integer, got {type(batch_rows).__name__}")
    if batch_rows < 1:
        raise InvalidOptionError(f"{name} must be at least 1")
    if batch_rows > MAX_BATCH_ROWS:
        raise InvalidOptionError(
            f"{name} must be at most 2**63 - 1 ({MAX_BATCH_ROWS}); a batch never exceeds a row group"
        )
    return int(batch_rows)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _corrupt(file: Path, row_group: int | None, e: BaseException) -> InvalidBatchError:
    """A file pyarrow cannot decode: bad data (exit 1), named as `advantages` names it."""
    where = f"{file}: row group {row_group}" if row_group is not None else str(file)
    return InvalidBatchError(f"{where}: cannot read Parquet: {_one_line(e)}")


@dataclass
class _Columns:
    """The columns read, chosen on the first file's schema and used for every file."""

    values: str
    mask: str
    reward: tuple[str, str]
    """("score", name), ("rewards", name) or ("turn_rewards", name) (a log with per-turn
    rewards only: the outcome is their sum)."""
    step: str | None

    @property
    def names(self) -> list[str]:
        return [c for c in (self.values, self.mask, self.reward[1], self.step) if c]

    @classmethod
    def choose(
        cls, names: set[str], values: str, mask: str, score: str | None, rewards: str | None, step: str | None
    ) -> _Columns:
        if score and rewards:
            raise InvalidOptionError("give --score-col or --rewards-col, not both")
        if score:
            reward = ("score", score)
        elif rewards:
            reward = ("rewards", rewards)
        elif SCORE in names:
            reward = ("score", SCORE)
        elif REWARDS in names:
            reward = ("rewards", REWARDS)
        elif TURN_REWARDS in names:
            reward = ("turn_rewards", TURN_REWARDS)
        else:
            reward = ("score", SCORE)  # reported as missing by the caller
        return cls(values, mask, reward, step or (STEP if STEP in names else None))


def _open(file: Path, cols: _Columns | None, options: dict[str, Any]) -> tuple[Any, _Columns]:
    """Opens one input (footer and schema) and checks its columns' names and types, the
    same checks as a batch's, before anything is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(file, "rb"):  # the OS's own errors (permissions, a vanished file) stay OSError
        pass
    try:
        # pre_buffer would read the selected columns of every row group ahead: unbounded.
        # Page checksums, where the writer stored them, are verified.
        pf = pq.ParquetFile(file, pre_buffer=False, page_checksum_verification=True)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _corrupt(file, None, e) from None
    names = set(schema.names)
    have = ", ".join(schema.names) or "none"
    if cols is None:
        if not (options["score"] or options["rewards"] or names & {SCORE, REWARDS, TURN_REWARDS}):
            raise InvalidBatchError(
                f"{file}: missing column `{SCORE}` or `{REWARDS}` (columns are: {have}); "
                "name the outcome with --score-col or --rewards-col"
            )
        cols = _Columns.choose(names, **options)
    absent = [c for c in cols.names if c not in names]
    if absent:
        raise missing_column_error(absent[0], schema.names, str(file))
    empty = pa.RecordBatch.from_pylist([], schema=pa.schema([schema.field(c) for c in cols.names]))
    _native.diagnose_batch(empty, file, None, 0, cols.mask, cols.values, cols.reward, cols.step)
    return pf, cols


def diagnose_logs(
    path: str | os.PathLike[str],
    *,
    values_col: str = VALUES,
    mask_col: str = MASK,
    score_col: str | None = None,
    rewards_col: str | None = None,
    step_col: str | None = None,
    keep_rows: list[int] | None = None,
    batch_rows: int = 1024,
    observation_rewards: str = _observation.DEFAULT,
) -> Diagnosis:
    """Streams the log and returns the per-trajectory results.

    ``path`` is a Parquet file or a directory, whose files are found as ``mpo-rs
    advantages`` finds them (one implementation, in Rust: recursively, in name order,
    hidden and ``_`` names skipped; two names of one file, a symlink or a hard link beside
    its target, raise :class:`mpo_rs.InvalidOptionError`). Every file is opened and its columns checked before
    any row is read; every batch is checked as ``advantages`` checks it (types, nulls,
    list lengths, mask values, finite values and outcomes), and bad data raises
    :class:`mpo_rs.InvalidBatchError` naming file, row group, row (in the file) and column.

    The outcome of a trajectory is ``score_col`` if given (default: ``score`` when present),
    else the sum of ``rewards_col`` (default: ``rewards``); the column is chosen on the
    first file; a token reward where the mask is 0 is refused, dropped or credited to the
    last policy token before it as ``observation_rewards`` says (as in ``mpo-rs
    advantages``). ``step_col`` (default: ``step`` when present) splits the aggregates by
    training step. Traces for figures are kept for the rows in ``keep_rows`` (row numbers
    over the whole log), else for the first success and the first failure with at least
    two turns.
    """
    batch_rows = check_batch_rows(batch_rows)
    mode = _observation.check(observation_rewards)
    require_pyarrow()
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("total", "between", "within", "n_turns", "outcome", "step", "jumps", "jump_row")
    }
    traces: list[TrajectoryTrace] = []
    wanted = set(keep_rows or [])
    seen_kinds: set[bool] = set()
    options = dict(values=values_col, mask=mask_col, score=score_col, rewards=rewards_col, step=step_col)
    cols: _Columns | None = None
    sources = []
    for file in _native.list_parquet_inputs(path):
        pf, cols = _open(Path(file), cols, options)
        sources.append((Path(file), pf))
    assert cols is not None  # the listing is never empty
    import pyarrow as pa

    row0 = 0
    batches = 0
    for file, pf in sources:
        file_row = 0
        for g in range(pf.metadata.num_row_groups):
            group_start = file_row
            stream = pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=cols.names)
            while True:
                try:
                    batch = next(stream, None)
                except (pa.ArrowException, OSError, ValueError) as e:
                    raise _corrupt(file, g, e) from None
                if batch is None:
                    break
                (values, mask, offsets, outcome, step, total, between, within, jumps, n_turns) = _native.diagnose_batch(
                    batch, file, g, file_row, cols.mask, cols.values, cols.reward, cols.step, mode
                )
                rows = np.arange(row0, row0 + batch.num_rows)
                finite = np.isfinite(jumps)
                parts["total"].append(total)
                parts["between"].append(between)
                parts["within"].append(within)
                parts["n_turns"].append(n_turns)
                parts["outcome"].append(outcome)
                if step is not None:
                    parts["step"].append(step)
                parts["jumps"].append(jumps[finite])
                parts["jump_row"].append(np.repeat(rows, n_turns)[finite])
                for k, row in enumerate(rows):
                    success = bool(outcome[k] > 0)
                    keep = row in wanted if wanted else (n_turns[k] >= 2 and success not in seen_kinds)
                    if keep:
                        seen_kinds.add(success)
                        sl = slice(offsets[k], offsets[k + 1])
                        traces.append(
                            TrajectoryTrace(int(row), float(outcome[k]), values[sl].copy(), mask[sl].astype(bool))
                        )
                row0 += batch.num_rows
                file_row += batch.num_rows
                batches += 1
            expected = pf.metadata.row_group(g).num_rows
            if file_row - group_start != expected:
                raise _corrupt(
                    file, g, ValueError(f"decoded {file_row - group_start} rows, the footer says {expected}")
                )
    return Diagnosis(
        total=_concat(parts["total"], np.float64),
        between=_concat(parts["between"], np.float64),
        within=_concat(parts["within"], np.float64),
        n_turns=_concat(parts["n_turns"], np.int64),
        outcome=_concat(parts["outcome"], np.float64),
        step=_concat(parts["step"], np.int64) if cols.step else None,
        jumps=_concat(parts["jumps"], np.float32),
        jump_row=_concat(parts["jump_row"], np.int64),
        traces=traces,
        batches=batches,
    )


def _concat(parts: list[np.ndarray], dtype: type[_Scalar]) -> npt.NDArray[_Scalar]:
    """The batches' arrays end to end as ``dtype`` (an empty array when there are none)."""
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def require_pyarrow() -> None:
    require("pyarrow", "mpo-rs diagnose", "arrow")
