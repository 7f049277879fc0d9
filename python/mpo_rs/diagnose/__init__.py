"""``mpo-rs diagnose``: does the critic's value structure live on the turn scale?

Streams a Parquet rollout log (a file or a directory of files) and computes in Rust, per
trajectory, the between/within-turn split of the token-weighted value variance and the
boundary jumps. Aggregates: median between-turn share, fraction of trajectories with
between > within, the jump distribution, split by outcome and by training step when a step
column exists. Writes a JSON summary and PNG figures.

Rooms: :mod:`.read` (Parquet → per-trajectory results), :mod:`.summary` (the in-memory
decomposition and the one aggregate), :mod:`.plot` (figures, matplotlib imported lazily),
:mod:`.command` (the command's arguments and run).
"""

from __future__ import annotations

from .command import add_parser, run
from .plot import write_report
from .read import Diagnosis, TrajectoryTrace, diagnose_logs
from .summary import ValueStructure, format_table, summarize_value_structure, value_structure

__all__ = [
    "Diagnosis",
    "TrajectoryTrace",
    "ValueStructure",
    "add_parser",
    "diagnose_logs",
    "format_table",
    "run",
    "summarize_value_structure",
    "value_structure",
    "write_report",
]
