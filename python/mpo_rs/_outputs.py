"""Report files, written by the one rule of rust/logs/src/atomic.rs: whole or not at all,
and never through a link (``mpo_rs._native.write_output_file``). A symlink where a report
file or one of its directories goes is replaced, never followed, so a report never writes
outside its directory. Every file ``mpo-rs diagnose -o`` and ``mpo-rs reproduce --out``
write goes through :func:`write_file`; figures, tables and checkpoints are rendered to
bytes first."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from . import _native

__all__ = ["figure_bytes", "output_subdir", "table_bytes", "write_file"]


def write_file(path: str | os.PathLike[str], data: bytes | str, *, root: str | os.PathLike[str] | None = None) -> Path:
    """Writes ``data`` (text as UTF-8) to ``path``; no component of ``path`` below ``root``
    (default: its directory) is followed if it is a link. Returns the path."""
    target = Path(path)
    base = target.parent if root is None else Path(root)
    raw = data.encode() if isinstance(data, str) else data
    return Path(_native.write_output_file(base, target.relative_to(base), raw))


def output_subdir(root: str | os.PathLike[str], relative: str | os.PathLike[str]) -> Path:
    """``root/relative``, created, with no link below ``root`` (one there is replaced)."""
    return Path(_native.output_subdir(root, relative))


def figure_bytes(fig: Any, **savefig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (``savefig``'s keyword arguments passed on)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    return buf.getvalue()


def table_bytes(table: Any) -> bytes:
    """A pyarrow table as the bytes of a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())
