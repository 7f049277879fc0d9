"""Rollout logs from a live trainer: append each training batch to Parquet.

:class:`RolloutLogWriter` writes the batches a trainer hands it (padded ``(B, L)`` rows or
mpo_rs's flat layout, torch tensors or numpy arrays) into a directory of Parquet files in
the schema ``mpo-rs advantages`` and ``mpo-rs diagnose`` read (docs/parquet.md): one row
per trajectory, list columns ``token_ids``, ``loss_mask``, ``values``, ``rewards``, and
``score``, ``group_id``, ``step``. docs/rollout-logs.md says what it writes and what a kill
loses.

Files are written whole or not at all by the rule of ``mpo-rs advantages``
(``rust/logs/src/atomic.rs``, as :class:`mpo_rs._native.StagedFile`): a hidden temporary
``.NAME.mpo-rs-PID-NANOS-N.tmp`` beside the target (readers skip hidden names), fsynced,
then named ``part-<n>-step-<first step>.parquet`` by a hard link that never replaces an
existing file, and the directory fsynced. A new file is started once the current one
reaches ``max_file_bytes``. Needs the ``arrow`` extra (pyarrow).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import _log_rows, columns
from ._deps import require
from ._native import StagedFile
from .exceptions import InvalidBatchError, InvalidOptionError

__all__ = ["COLUMNS", "LOG_METADATA_KEY", "RolloutLogWriter"]

# The roles the log readers know take their default names from the column spec (the same
# defaults as `mpo-rs advantages` / `diagnose`); token ids are the writer's own column.
COLUMNS: Mapping[str, str] = {
    "token_ids": "token_ids",  # list<int32>: every token of the trajectory, prompt included
    "loss_mask": columns.MASK,  # list<bool>: 1 on policy (LLM) tokens
    "values": columns.VALUES,  # list<float32>: the critic's value per token (read on policy tokens)
    "rewards": columns.REWARDS,  # list<float32>: token rewards, 0 off-policy
    "score": columns.SCORE,  # float32: the trajectory's outcome
    "group_id": columns.GROUP,  # int64 or string: rollouts of one prompt share it
    "step": columns.STEP,  # int64: the training step that produced the row
}
"""The column names the writer uses by default (keys: the roles; values: the names), the
defaults of ``mpo-rs advantages`` / ``diagnose`` (``--mask-col`` etc.). ``columns=`` renames."""

LOG_METADATA_KEY = b"mpo_rs.rollout_log"
"""Schema metadata key that marks a file as a part of a log written by this writer."""

_PART = re.compile(r"^part-(\d{6,})-step-(-?\d+)\.parquet$")
_DEFAULT_MAX_FILE_BYTES = 256 << 20
_DEFAULT_ROW_GROUP_BYTES = 64 << 20

# Held (strongly) until closed, so that a writer dropped without close() still finishes
# its last part at exit rather than being collected with its rows.
_open_writers: set[RolloutLogWriter] = set()


@atexit.register
def _close_open_writers() -> None:
    """A trainer that exits without close() still finishes its last file (only in the
    process that opened the writer: a forked child must not finish its parent's part)."""
    for writer in list(_open_writers):
        if writer._pid != os.getpid():
            continue
        try:
            writer.close()
        except Exception:  # at exit, one failing log must not hide the others
            pass


def _feature() -> str:
    return "mpo_rs.rollout_log"


class RolloutLogWriter:
    """Appends training batches to a directory of Parquet files, one row per trajectory.

    Args:
        directory: where the parts go; created if missing. It must be empty or hold only
            parts of a log this class wrote (numbering then continues after the last one)
            and hidden names (leftover temporaries of a kill); anything else is refused.
        max_file_bytes: a file is finished, and the next one started, once it holds at least
            this many (compressed) bytes; 256 MiB by default.
        row_group_bytes: rows are buffered in memory and written as one Parquet row group
            once their decoded size reaches this (64 MiB by default, at most
            ``max_file_bytes``); also the most memory the buffer holds beyond one batch.
        compression: the Parquet codec (``"zstd"`` by default; any pyarrow codec).
        columns: new names for some columns, by role (the keys of :data:`COLUMNS`), for a
            log read with ``--mask-col`` etc.

    What a kill loses: the rows appended since the last finished file (those buffered in
    memory and those in the current file's hidden temporary). Finished files are complete
    and durable. :meth:`flush` finishes the current file now; :meth:`close` (or leaving the
    ``with`` block, or the interpreter's normal exit) finishes it too. An error while writing
    a part (a full disk, Ctrl-C) loses the same rows, removes the part's temporary, closes
    the writer and is raised. One call at a time runs (a lock), so threads may share it.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_file_bytes: int = _DEFAULT_MAX_FILE_BYTES,
        row_group_bytes: int | None = None,
        compression: str = "zstd",
        columns: Mapping[str, str] | None = None,
    ) -> None:
        require("pyarrow", _feature(), "arrow")

        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 1:
            raise InvalidOptionError(
                f"RolloutLogWriter: `max_file_bytes` must be a positive integer, got {max_file_bytes!r}"
            )
        if row_group_bytes is None:
            row_group_bytes = min(_DEFAULT_ROW_GROUP_BYTES, max_file_bytes)
        if isinstance(row_group_bytes, bool) or not isinstance(row_group_bytes, int) or row_group_bytes < 1:
            raise InvalidOptionError(
                f"RolloutLogWriter: `row_group_bytes` must be a positive integer, got {row_group_bytes!r}"
            )
        names = dict(COLUMNS)
        for role, name in (columns or {}).items():
            if role not in COLUMNS:
                raise InvalidOptionError(
                    f"RolloutLogWriter: `columns` has unknown role {role!r}; roles are {', '.join(COLUMNS)}"
                )
            if not isinstance(name, str) or not name:
                raise InvalidOptionError(f"RolloutLogWriter: `columns[{role!r}]` must be a non-empty string")
            names[role] = name
        if len(set(names.values())) != len(names):
            raise InvalidOptionError(f"RolloutLogWriter: `columns` gives two roles one name: {names}")
        import pyarrow as pa

        try:
            available = str(compression).lower() == "none" or pa.Codec.is_available(compression)
        except (ValueError, TypeError):
            available = False
        if not available:
            raise InvalidOptionError(
                f"RolloutLogWriter: `compression` {compression!r} is not a codec this pyarrow can write "
                "(e.g. 'zstd', 'snappy', 'lz4', 'gzip', 'none')"
            )

        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.row_group_bytes = row_group_bytes
        self.compression = compression
        self.names: dict[str, str] = names
        self._files: list[Path] = []
        self._next_part, self._existing_schema = self._scan_directory()
        self._schema: Any = None  # fixed by the first append (or the existing parts)
        self._buffer: list[Any] = []
        self._buffer_bytes = 0
        self._file: Any = None  # (StagedFile, python file, pq.ParquetWriter, first step)
        self._rows_in_file = 0
        self._closed = False
        self._failure: str | None = None
        self._lock = threading.RLock()  # one append, flush or close at a time
        self._pid = os.getpid()
        self.rows_written = 0
        """Rows in finished files (durable)."""
        self.rows_appended = 0
        """Rows appended (including those not yet in a finished file)."""
        _open_writers.add(self)

    # ------------------------------------------------------------------ public API

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called, or an error while writing a part closed the
        writer (the error was raised then)."""
        return self._closed

    @property
    def files(self) -> list[Path]:
        """The finished files this writer wrote, in order."""
        return list(self._files)

    def append_padded(
        self,
        *,
        input_ids: Any,
        loss_mask: Any,
        attention_mask: Any = None,
        values: Any = None,
        token_rewards: Any = None,
        scores: Any = None,
        group_ids: Any = None,
        step: int,
    ) -> None:
        """Appends B trajectories given as padded ``(B, L)`` rows (torch tensors or numpy).

        Row b's tokens are the columns where ``attention_mask[b]`` is nonzero, in order, so
        left, right or both-sides padding all work (without ``attention_mask`` every column
        is a token). ``loss_mask`` marks policy tokens (bool or 0/1); it and
        ``token_rewards`` must be 0 on padding (a reward there would be lost). ``values``
        and ``token_rewards`` are ``(B, L)``, ``scores`` and ``group_ids`` ``(B,)``; at
        least one of ``token_rewards`` / ``scores`` is usually given (both may be).
        ``step`` is the training step (an integer). Bad input raises
        :class:`mpo_rs.InvalidBatchError` naming the argument; nothing is appended then.
        """
        self._check_open()
        ids = _log_rows.array(input_ids, "input_ids")
        if ids.ndim != 2:
            raise InvalidBatchError(f"append_padded: `input_ids` must be (B, L), got shape {ids.shape}")
        shape = ids.shape
        mask = _log_rows.mask01(_log_rows.padded(loss_mask, "loss_mask", shape), "loss_mask")
        if attention_mask is None:
            keep = np.ones(shape, bool)
        else:
            keep = _log_rows.mask01(_log_rows.padded(attention_mask, "attention_mask", shape), "attention_mask")
        _log_rows.zero_on_padding(mask, keep, "loss_mask")
        vals = None if values is None else _log_rows.padded(values, "values", shape)
        rews = None if token_rewards is None else _log_rows.padded(token_rewards, "token_rewards", shape)
        if rews is not None:
            _log_rows.zero_on_padding(rews, keep, "token_rewards")
        lengths = keep.sum(axis=1, dtype=np.int64)
        offsets = np.zeros(shape[0] + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        method = "append_padded"
        batch = _log_rows.record_batch(
            ids[keep],
            mask[keep],
            offsets,
            None if vals is None else vals[keep],
            None if rews is None else rews[keep],
            scores,
            group_ids,
            step,
            self.names,
            method,
            ("input_ids", "token_rewards"),
        )
        self._append(batch, method)

    def append_flat(
        self,
        *,
        token_ids: Any,
        loss_mask: Any,
        offsets: Any,
        values: Any = None,
        rewards: Any = None,
        scores: Any = None,
        group_ids: Any = None,
        step: int,
    ) -> None:
        """Appends N trajectories in mpo_rs's flat layout: 1-D ``token_ids``, ``loss_mask``,
        ``values`` and ``rewards`` of T tokens, trajectory j being tokens
        ``offsets[j]:offsets[j+1]`` (``offsets`` int, N+1 entries, from 0 to T);
        ``scores`` and ``group_ids`` of N. Otherwise as :meth:`append_padded`."""
        self._check_open()
        ids = _log_rows.array(token_ids, "token_ids")
        if ids.ndim != 1:
            raise InvalidBatchError(f"append_flat: `token_ids` must be 1-D (T,), got shape {ids.shape}")
        n_tokens = ids.shape[0]
        offs = _log_rows.array(offsets, "offsets")
        if offs.ndim != 1 or offs.shape[0] < 1 or offs.dtype.kind not in "iu":
            raise InvalidBatchError(
                f"append_flat: `offsets` must be a 1-D integer array of N+1 entries, got {offs.dtype} {offs.shape}"
            )
        offs = offs.astype(np.int64)
        if offs[0] != 0 or offs[-1] != n_tokens or np.any(np.diff(offs) < 0):
            raise InvalidBatchError(
                f"append_flat: `offsets` must start at 0, be non-decreasing and end at the token count "
                f"{n_tokens}; got offsets[0]={offs[0]}, offsets[-1]={offs[-1]}"
            )
        mask = _log_rows.mask01(_log_rows.flat(loss_mask, "loss_mask", n_tokens), "loss_mask")
        vals = None if values is None else _log_rows.flat(values, "values", n_tokens)
        rews = None if rewards is None else _log_rows.flat(rewards, "rewards", n_tokens)
        method = "append_flat"
        batch = _log_rows.record_batch(
            ids, mask, offs, vals, rews, scores, group_ids, step, self.names, method, ("token_ids", "rewards")
        )
        self._append(batch, method)

    def flush(self) -> None:
        """Writes the buffered rows and finishes the current file, so that everything
        appended so far is in finished files. The next append starts a new file."""
        with self._lock:
            self._check_open()
            self._write_buffer()
            self._finish_file()

    def close(self) -> None:
        """Finishes the current file (as :meth:`flush`) and closes the writer; idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                self._write_buffer()
                self._finish_file()
            finally:
                self._closed = True
                _open_writers.discard(self)

    def __enter__(self) -> RolloutLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RolloutLogWriter({str(self.directory)!r}, files={len(self._files)}, rows_written={self.rows_written}, "
            f"rows_appended={self.rows_appended})"
        )

    # ------------------------------------------------------------------ batches

    def _check_open(self) -> None:
        if self._closed:
            why = "" if self._failure is None else f" (by an error while writing a part: {self._failure})"
            raise InvalidOptionError(f"RolloutLogWriter({str(self.directory)!r}) is closed{why}")

    def _append(self, batch: Any, method: str) -> None:
        """Buffers a checked batch (None: one of no rows, which adds nothing)."""
        if batch is None:
            return
        n_rows = batch.num_rows
        with self._lock:
            self._check_open()
            self._check_schema(batch, method)
            self._buffer.append(batch)
            self._buffer_bytes += batch.nbytes
            self.rows_appended += n_rows
            if self._buffer_bytes >= self.row_group_bytes:
                self._write_buffer()

    def _check_schema(self, batch: Any, method: str) -> None:
        schema = batch.schema
        expected = self._schema if self._schema is not None else self._existing_schema
        if expected is not None:
            got = [(f.name, _type_name(f.type)) for f in schema]
            want = [(f.name, _type_name(f.type)) for f in expected]
            if got != want:
                where = "earlier batches" if self._schema is not None else "the log's existing parts"
                raise InvalidBatchError(
                    f"{method}: this batch's columns {_describe(got)} differ from those of {where} "
                    f"{_describe(want)}: every row of a log has the same columns (pass the same optional "
                    "arguments each step)"
                )
        if self._schema is None:
            meta = {LOG_METADATA_KEY: json.dumps({"version": 1, "columns": self.names}).encode()}
            self._schema = schema.with_metadata(meta)

    # ------------------------------------------------------------------ files

    def _write_buffer(self) -> None:
        if not self._buffer:
            return
        import pyarrow as pa

        table = pa.Table.from_batches(self._buffer, schema=self._schema)
        try:
            if self._file is None:
                step = int(table.column(self.names["step"])[0].as_py())
                self._start_file(step)
            _, handle, writer, _ = self._file
            writer.write_table(table, row_group_size=max(1, table.num_rows))
        except BaseException as e:
            self._fail(e)
            raise
        self._rows_in_file += table.num_rows
        self._buffer.clear()
        self._buffer_bytes = 0
        if handle.tell() >= self.max_file_bytes:
            self._finish_file()

    def _fail(self, exc: BaseException | None = None) -> None:
        """After an error (a full disk, Ctrl-C) while writing a part: the part's temporary
        is removed, its rows and the buffer are dropped (as a kill would), and the writer
        is closed; finished parts stay as they are."""
        if self._file is not None:
            staged, handle, writer, _ = self._file
            self._file = None
            for step in (writer.close, handle.close):
                try:
                    step()
                except Exception:  # the part is abandoned anyway
                    pass
            staged.discard()
        self._buffer.clear()
        self._buffer_bytes = 0
        self._rows_in_file = 0
        self._closed = True
        _open_writers.discard(self)
        self._failure = "interrupted" if exc is None else f"{type(exc).__name__}: {exc}"

    def _start_file(self, step: int) -> None:
        import pyarrow.parquet as pq

        staged = StagedFile(self._target(self._next_part, step))
        # Rust owns the descriptor (and removes the temporary unless committed).
        handle = open(staged.fileno(), "wb", closefd=False)
        try:
            writer = pq.ParquetWriter(handle, self._schema, compression=self.compression)
        except BaseException:
            handle.close()
            staged.discard()
            raise
        self._file = (staged, handle, writer, step)
        self._rows_in_file = 0

    def _target(self, part: int, step: int) -> Path:
        return self.directory / f"part-{part:06d}-step-{step:06d}.parquet"

    def _finish_file(self) -> None:
        if self._file is None:
            return
        staged, handle, writer, step = self._file
        try:
            writer.close()
            handle.close()  # flushed; the descriptor stays open in `staged`
            while True:
                target = self._target(self._next_part, step)
                self._next_part += 1
                if staged.commit_new(target):  # fsynced, linked, temporary removed, directory fsynced
                    break
                # Another writer took that number: the next one.
            self._file = None
            self._files.append(target)  # complete and visible from here on
            self.rows_written += self._rows_in_file
            self._rows_in_file = 0
        except BaseException as e:
            self._fail(e)
            raise

    def _scan_directory(self) -> tuple[int, Any]:
        """The next part number, and the schema of the existing parts (None if none);
        refuses a directory holding anything this writer did not write."""
        import pyarrow.parquet as pq

        d = self.directory
        if d.exists() and not d.is_dir():
            raise InvalidOptionError(f"RolloutLogWriter: {str(d)!r} exists and is not a directory")
        d.mkdir(parents=True, exist_ok=True)
        next_part = 0
        schema = None
        for entry in sorted(os.listdir(d)):
            if entry.startswith("."):
                continue  # temporaries (ours, or a killed run's) and other hidden files
            path = d / entry
            match = _PART.match(entry)
            if match is None or not path.is_file() or path.is_symlink():
                raise InvalidOptionError(
                    f"RolloutLogWriter: {str(d)!r} holds {entry!r}, which this writer did not write; "
                    "a log directory holds only its own parts (part-NNNNNN-step-S.parquet): "
                    "choose an empty or new directory"
                )
            try:
                part_schema = pq.read_schema(path)
            except Exception as e:  # any unreadable footer: not one of ours
                raise InvalidOptionError(
                    f"RolloutLogWriter: {str(path)!r} is not a readable Parquet file ({e}); it is not a part of a "
                    "log this writer wrote"
                ) from None
            meta = part_schema.metadata or {}
            if LOG_METADATA_KEY not in meta:
                raise InvalidOptionError(
                    f"RolloutLogWriter: {str(path)!r} was not written by RolloutLogWriter (no "
                    f"{LOG_METADATA_KEY.decode()} metadata); choose an empty or new directory"
                )
            if schema is None:
                schema = part_schema
            next_part = max(next_part, int(match.group(1)) + 1)
        return next_part, schema


# ---------------------------------------------------------------------- helpers


def _type_name(kind: Any) -> str:
    """A column type without the name of a list's child (Parquet reads it as ``element``)."""
    import pyarrow as pa

    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{kind.value_type}>"
    return str(kind)


def _describe(fields: list[tuple[str, str]]) -> str:
    return "(" + ", ".join(f"{name}: {kind}" for name, kind in fields) + ")"
