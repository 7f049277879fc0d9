"""Output directories and report files, by the one output-safety rule of rust/logs.

- An output directory is *claimed* before anything is written: a new or empty directory,
  or one this tool wrote before (its ``.mpo-rs-output`` marker names the tool and, where
  given, the configuration). A directory the tool did not write, an input, a file, a FIFO
  or a device is refused with :class:`~mpo_rs.InvalidOptionError` unless ``overwrite``;
  nothing is deleted. :func:`check_output_dir` asks the same question without claiming.
- A report file is written whole or not at all, and never through a link: a symlink where
  a report file or one of its directories goes is replaced, never followed, so a report
  never writes outside its directory (:func:`write_file`, :func:`output_subdir`).

Every file ``mpo-rs diagnose -o`` writes goes through these functions, and so does every file
of a tool built on mpo_rs that uses them (the lab's ``reproduce --out``); figures and tables
are rendered to bytes first (:func:`figure_bytes`, :func:`table_bytes`)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from . import _native

__all__ = [
    "check_output_dir",
    "claim_output_dir",
    "figure_bytes",
    "output_dir_marker",
    "output_subdir",
    "table_bytes",
    "write_file",
]

# The claim and its check are the Rust rule itself (rust/logs/src/safety.rs).
check_output_dir = _native.check_output_dir
claim_output_dir = _native.claim_output_dir
output_dir_marker = _native.output_dir_marker


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
