"""The ``mpo-rs diagnose`` command: its arguments and its run (``mpo_rs.cli`` registers
and calls it; exit codes and message formatting stay with the CLI)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _native, columns
from .. import observation_rewards as _observation
from .._deps import MissingDependencyError, install_hint
from .._native import InvalidBatchError, InvalidOptionError
from .plot import REPORT_DIR, TOOL, require_matplotlib, write_report
from .read import check_batch_rows, diagnose_logs, require_pyarrow
from .summary import format_table

__all__ = ["add_parser", "run"]

# The log's columns the command reads, each named by its flag (--values-col, ...).
_COLUMNS = ("values", "mask", "score", "rewards", "step")


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "diagnose",
        help="does the critic's value structure live on the turn scale?",
        description=(
            "Streams a Parquet rollout log and reports, per trajectory, how much of the "
            "token-weighted value variance lies between turns rather than within them, and "
            "the value jumps at turn boundaries (MPO's evidence, on your own critic)."
        ),
    )
    p.add_argument("input", metavar="INPUT", help="a Parquet file or a directory of Parquet files")
    p.add_argument(
        "-o",
        "--output",
        metavar=REPORT_DIR,
        help="write summary.json and PNG figures here (a new or empty directory, or an earlier report)",
    )
    p.add_argument(
        "--trajectories", metavar="K", help="comma-separated row numbers to draw (default: a success and a failure)"
    )
    score, rewards = columns.SCORE, columns.REWARDS
    columns.add_flags(
        p,
        _COLUMNS,
        helps={"score": f"outcome per trajectory (default: {score}, else the sum of {rewards})"},
    )
    p.add_argument(
        "--observation-rewards",
        choices=_observation.OBSERVATION_REWARDS,
        default=_observation.DEFAULT,
        help=_observation.flag_help() + "; as in mpo-rs advantages",
    )
    p.add_argument("--batch-rows", type=int, default=1024, metavar="N", help="rows per streamed batch (1024)")


def run(args: argparse.Namespace, note: Callable[[str], None] = lambda _: None) -> tuple[str, list[Path]]:
    """Runs the command; returns the table and the files written. Raises InvalidBatchError
    (bad data), InvalidOptionError (usage), MissingDependencyError (pyarrow) or OSError.

    Everything that can fail without reading the log is checked first: options, REPORT_DIR
    (new, empty, or an earlier report of diagnose: docs/reliability.md, "Output safety"),
    pyarrow, matplotlib. Without matplotlib the figures are skipped -- ``note`` gets one
    line saying so and naming the ``plot`` extra -- and summary.json is still written.

    A log without a single usable trajectory (>= 2 turns and varying values) raises
    InvalidBatchError before anything is written; rows of ``--trajectories`` that the log
    does not have get one ``note`` line (the rest of the report is written)."""
    keep = None
    if args.trajectories:
        try:
            keep = [int(x) for x in args.trajectories.split(",") if x.strip()]
        except ValueError:
            raise InvalidOptionError(
                f"--trajectories must be comma-separated row numbers, got {args.trajectories!r}"
            ) from None
    check_batch_rows(args.batch_rows, "--batch-rows")
    if args.score_col and args.rewards_col:
        raise InvalidOptionError("give --score-col or --rewards-col, not both")
    if args.output:
        # The output-safety rule (rust/logs/src/safety.rs): new, empty, or an earlier report.
        _native.check_output_dir(args.output, TOOL, label=REPORT_DIR, inputs=[args.input])
    require_pyarrow()
    figures = bool(args.output)
    if figures:
        try:
            require_matplotlib()
        except MissingDependencyError:
            figures = False
            note(f"figures skipped: they need matplotlib: {install_hint('plot')} (summary.json is written)")
    diag = diagnose_logs(
        args.input,
        **columns.flag_keywords(args, _COLUMNS),
        keep_rows=keep,
        batch_rows=args.batch_rows,
        observation_rewards=args.observation_rewards,
    )
    summary = diag.summary()
    if summary["all"]["trajectories"] == 0:
        # Blank figures and a table of nulls would read as a result; say there is none.
        read = f"{diag.rows:,} read, all excluded" if diag.rows else "the log has no rows"
        raise InvalidBatchError(
            f"{args.input}: no trajectory with >= 2 turns and varying values ({read}); nothing to report"
        )
    if keep:
        drawn = {t.row for t in diag.traces}
        missing = [k for k in dict.fromkeys(keep) if k not in drawn]
        if missing:
            note(
                f"--trajectories: row{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                f"not in the log ({diag.rows:,} rows, numbered from 0); not drawn"
            )
    written = write_report(diag, args.output, figures=figures, inputs=[args.input]) if args.output else []
    return format_table(summary), written
