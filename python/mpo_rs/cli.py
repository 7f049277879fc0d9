"""The ``mpo-rs`` command line.

``mpo-rs diagnose INPUT [-o REPORT_DIR]`` reports whether the critic's values move at turn
boundaries (``mpo_rs.diagnose``). ``mpo-rs advantages INPUT -o OUTPUT`` streams a Parquet rollout log (a file, or a
directory of files) through the Rust pipeline and writes it with the advantage columns
appended; see ``docs/parquet.md``. ``mpo-rs check module:function`` property-tests an
advantage function (``mpo_rs.testing``, docs/testing.md). Exit codes: 0 done, 1 bad data or I/O failure,
2 usage error. Expected errors print one line and no traceback.

Other installed packages add commands through the entry-point group :data:`COMMANDS`
(``name = "module:function"``; the lab adds ``reproduce``): ``--help`` lists them by name,
and a command's module is imported only when that command runs. Its function takes the
arguments after the command's name and the program name to show (``mpo-rs NAME``) and
returns the exit code.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from collections.abc import Callable, Collection, Sequence
from importlib import metadata
from typing import Any, NoReturn, TextIO

from . import columns, diagnose, observation_rewards
from ._native import closest_name
from .arrow import advantages_parquet
from .columns import Columns
from .estimators import CHECK_TOLERANCE
from .exceptions import InvalidBatchError, InvalidOptionError, MissingDependencyError, MpoError
from .options import ESTIMATORS, Estimator
from .testing import command as check

PROG = "mpo-rs"

COMMANDS = "mpo_rs.commands"
"""The entry-point group of the commands other packages add to ``mpo-rs``."""

# Where a command that is not installed comes from, for its one-line error.
PROVIDERS = {"reproduce": "the lab package, mpo-lab (pip install ./lab from a checkout)"}
BUILT_IN = ("advantages", "check", "diagnose")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit code 2) that suggest the flag or choice a
    misspelling most likely meant and name the help of the subcommand they belong to."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}{self._suggestion(message)} (see `{self.prog} --help`)\n")
        sys.exit(EXIT_USAGE)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        # argparse reports a subcommand's unknown flags from the top-level parser; report
        # them from the subcommand's own, whose flags (and --help) are the relevant ones.
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._subcommand(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _subcommand(self, parsed: argparse.Namespace) -> Parser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, Parser):
                    return chosen
        return self

    def _suggestion(self, message: str) -> str:
        if m := _UNRECOGNIZED.match(message):
            word = next((w.split("=")[0] for w in m.group(1).split() if w.startswith("--")), None)
            flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            guess = closest_name(word, flags) if word else None
        elif m := _INVALID_CHOICE.search(message):
            # Quoted choices up to Python 3.11, bare ones after.
            guess = closest_name(m.group(1), [c.strip().strip("'") for c in m.group(2).split(",")])
        else:
            guess = None
        return "" if guess is None else f"; did you mean {guess}?"


_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(
        prog=PROG,
        description="Advantage estimation for offline LLM-agent rollout logs (MPO).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adv = commands.add_parser(
        "advantages",
        help="append advantage columns to a Parquet rollout log",
        description=(
            "Reads a Parquet rollout log (one row per trajectory, list columns per token) and "
            "writes it with `advantages`, `returns`, `turn_index` and `turn_advantages` "
            "appended. Every input row and column comes out unchanged and in order. OUTPUT "
            "appears only when complete; the inputs are never modified."
        ),
    )
    adv.add_argument("input", metavar="INPUT", help="a Parquet file or a directory of Parquet files")
    adv.add_argument(
        "-o",
        "--output",
        metavar="OUTPUT",
        required=True,
        help=(
            "output file (INPUT a file) or directory (INPUT a directory): a new path or an earlier "
            "output of this command, replaced atomically (nothing else is ever replaced)"
        ),
    )
    adv.add_argument(
        "--estimator",
        choices=ESTIMATORS,
        default="mae",
        help=(
            "mae (default), gae, bilevel (RAGEN's bi-level GAE), a critic-free group baseline: grpo, drgrpo, rloo, "
            "or gigpo (group and anchor-state step baselines; anchors from --turn-state-ids-col or --token-ids-col)"
        ),
    )
    adv.add_argument(
        "--observation-rewards",
        choices=observation_rewards.OBSERVATION_REWARDS,
        default=observation_rewards.DEFAULT,
        help=observation_rewards.flag_help() + " (the rewards column is written out as given)",
    )
    add_option_flags(adv.add_argument_group("estimator options (defaults: the estimator's own)"))
    column_flags = adv.add_argument_group("columns")
    columns.add_flags(
        column_flags,
        (
            "mask",
            "values",
            "rewards",
            "score",
            "turn_rewards",
            "check_score",
            "truncated",
            "group",
            "turn_state_ids",
            "token_ids",
        ),
    )
    column_flags.add_argument(
        "--check-tolerance",
        type=float,
        metavar="F",
        default=CHECK_TOLERANCE,
        help=f"the turn rewards must sum to --check-score-col within F x max(1, |score|) (default: {CHECK_TOLERANCE:g})",
    )
    adv.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress (a status line on a terminal, a line every 10 s in a log) and no summary",
    )
    diagnose.add_parser(commands)
    check.add_parser(commands)
    for name, entry in sorted(added_commands().items()):
        commands.add_parser(name, help=f"from {_distribution(entry)} (`{PROG} {name} --help`)", add_help=False)
    return parser


def added_commands() -> dict[str, metadata.EntryPoint]:
    """The commands installed packages add (:data:`COMMANDS`), by name; none is imported."""
    return {e.name: e for e in metadata.entry_points(group=COMMANDS) if e.name not in BUILT_IN}


def _distribution(entry: metadata.EntryPoint) -> str:
    return entry.dist.name if entry.dist is not None else entry.value.partition(":")[0]


def _run_added(name: str, argv: list[str], added: dict[str, metadata.EntryPoint]) -> int:
    """Runs the added command ``name`` (of ``added``, :func:`added_commands`) on ``argv`` (the
    arguments after its name); one that is not installed is one line naming the package that
    provides it (exit 1)."""
    entry = added.get(name)
    if entry is None:
        return _fail(f"`{PROG} {name}` is not installed: it comes with {PROVIDERS[name]}", EXIT_FAILED)
    try:
        command: Callable[[list[str], str], int] = entry.load()
    except ImportError as e:  # installed, but its package does not import here
        return _fail(f"`{PROG} {name}` ({entry.value}) does not load: {e}", EXIT_FAILED)
    return command(argv, f"{PROG} {name}")


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _option_rows(names: Collection[str] | None) -> list[dict[str, Any]]:
    return [row for row in Estimator.option_table() if names is None or row["name"] in names]


def add_option_flags(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, names: Collection[str] | None = None
) -> None:
    """One flag per row of the options table (``lam_intra`` -> ``--lam-intra``), so an
    option added in Rust is a flag here too; ``names`` keeps only those options (for a tool
    that takes some of them). Unset flags stay None: the estimator's default."""
    for row in _option_rows(names):
        defaults = ", ".join(f"{name} {_shown(value)}" for name, value in row["defaults"].items())
        help = f"{row['doc']}; in {row['domain']}; default: {defaults}".replace("%", "%%")
        if row["kind"] == "bool":
            group.add_argument(_flag(row["name"]), action=argparse.BooleanOptionalAction, default=None, help=help)
        elif row["kind"] == "choice":
            group.add_argument(_flag(row["name"]), choices=row["choices"], default=None, help=help)
        else:
            group.add_argument(_flag(row["name"]), type=float, metavar="F", default=None, help=help)


def _shown(value: object) -> str:
    if isinstance(value, str):
        return value
    return "unset" if value is None else str(value).lower() if isinstance(value, bool) else f"{value:g}"


def option_args(args: argparse.Namespace, names: Collection[str] | None = None) -> dict[str, Any]:
    """The options given on the command line (flags of :func:`add_option_flags` with the
    same ``names``), by their table names."""
    given = {row["name"]: getattr(args, row["name"]) for row in _option_rows(names)}
    return {name: value for name, value in given.items() if value is not None}


# How often a run whose stderr is not a terminal (a log file under a batch scheduler)
# prints a progress line.
LOG_PERIOD_S = 10.0


class _Progress:
    """Progress on stderr: a self-overwriting status line on a terminal; elsewhere (a log
    file) one line every ``period`` seconds, so a long run shows it is alive."""

    def __init__(self, stream: TextIO, enabled: bool, terminal: bool = True, period: float | None = None) -> None:
        period = LOG_PERIOD_S if period is None else period
        self.stream = stream
        self.enabled = enabled
        self.terminal = terminal
        self.period = period
        self.width = 0
        self.next_line = time.monotonic() + period

    def update(self, phase: str, rows: int, tokens: int, total_rows: int, seconds: float) -> None:
        done = f"{rows:,}/{total_rows:,} rows"
        if phase == "write":
            rate = tokens / seconds if seconds > 0 else 0.0
            line = f"{PROG}: writing {done}, {_si(tokens)} tokens, {_si(rate)} tokens/s"
        else:
            line = f"{PROG}: group statistics {done}"
        if not self.terminal:
            now = time.monotonic()
            if now >= self.next_line:
                self.next_line = now + self.period
                self.stream.write(f"{line} ({seconds:.0f} s)\n")
                self.stream.flush()
            return
        self.width = max(self.width, len(line))
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()

    def clear(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def summary_line(output: str, s: dict[str, int | float]) -> str:
    """The one-line report of a finished run."""
    seconds = float(s["seconds"])
    rate = s["tokens"] / seconds if seconds > 0 else 0.0
    files = f"{s['files']} file{'s' if s['files'] != 1 else ''}"
    return (
        f"{PROG}: wrote {output}: {s['rows']:,} rows, {s['tokens']:,} tokens "
        f"({s['policy_tokens']:,} policy) in {s['turns']:,} turns; {files}, "
        f"{s['row_groups']:,} row groups; {seconds:.2f} s ({_si(rate)} tokens/s)"
    )


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return code


# The errors a command reports in one line (no traceback); anything else is a bug.
_EXPECTED = (MpoError, MissingDependencyError, OSError, KeyboardInterrupt)


def leave_signal_stops(e: BaseException) -> None:
    """Re-raises a stop by SIGTERM or SIGHUP (a KeyboardInterrupt whose ``signum`` is not
    SIGINT's, raised by the console script's handler): the console script reports it, with
    128 + the signal, while it ignores further signals."""
    if isinstance(e, KeyboardInterrupt) and getattr(e, "signum", signal.SIGINT) != signal.SIGINT:
        raise e


def _failed(e: BaseException) -> int:
    """Prints the one-line message of an expected error and returns its exit code: a usage
    problem 2, bad data, a missing dependency or the operating system 1, Ctrl-C 130."""
    leave_signal_stops(e)
    if isinstance(e, InvalidOptionError):
        return _fail(str(e), EXIT_USAGE)
    if isinstance(e, KeyboardInterrupt):
        return _fail("interrupted", EXIT_INTERRUPTED)
    if isinstance(e, OSError) and e.strerror and e.errno is not None and not e.filename:
        # Errors from the extension carry the whole message (path, action, cause) as strerror.
        return _fail(e.strerror, EXIT_FAILED)
    return _fail(str(e), EXIT_FAILED)


def _with_column_hint(e: BaseException, args: argparse.Namespace) -> BaseException:
    """A "missing column" error, with the flag that names another column (``--mask-col``)."""
    if not isinstance(e, InvalidBatchError):
        return e
    chosen = {
        r["name"]: getattr(args, columns.keyword(r["name"]))
        for r in columns.COLUMN_SPEC
        if hasattr(args, columns.keyword(r["name"]))
    }
    hint = columns.missing_column_hint(e, chosen, columns.flag)
    return e if hint is None else columns.with_hint(e, hint)


def _advantages(args: argparse.Namespace) -> int:
    progress = _Progress(sys.stderr, enabled=not args.quiet, terminal=sys.stderr.isatty())
    try:
        try:
            summary = advantages_parquet(
                args.input,
                args.output,
                estimator=args.estimator,
                columns=Columns(**{name: getattr(args, columns.keyword(name)) for name in Columns().chosen()}),
                check_tolerance=args.check_tolerance,
                observation_rewards=args.observation_rewards,
                progress=progress.update if progress.enabled else None,
                **option_args(args),
            )
        finally:
            # Before any message, and before SIGTERM's exception leaves for the console script.
            progress.clear()
    except _EXPECTED as e:
        return _failed(_with_column_hint(e, args))  # on Ctrl-C, OUTPUT is the earlier one, or complete
    if not args.quiet:
        print(summary_line(args.output, summary))
    return EXIT_OK


def _note(line: str) -> None:
    """A progress line on stderr, prefixed with the program's name."""
    sys.stderr.write(f"{PROG}: {line}\n")


def _diagnose(args: argparse.Namespace) -> int:
    try:
        table, written = diagnose.run(args, note=_note)
    except _EXPECTED as e:
        return _failed(_with_column_hint(e, args))
    print(table)
    for path in written:
        print(f"wrote {path}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code. The ``mpo-rs`` console script calls it
    through ``mpo_rs_cli.main``, which first makes SIGTERM and SIGHUP stop a run the way
    Ctrl-C does."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words and words[0] not in BUILT_IN and not words[0].startswith("-"):
        added = added_commands()
        if words[0] in added or words[0] in PROVIDERS:
            return _run_added(words[0], words[1:], added)
    args = _parser().parse_args(words)
    if args.command == "advantages":
        return _advantages(args)
    if args.command == "diagnose":
        return _diagnose(args)
    if args.command == "check":
        return check.run(args, note=_note)
    return _fail(f"unknown command {args.command!r}", EXIT_USAGE)  # argparse prevents this


if __name__ == "__main__":
    from mpo_rs_cli import main as console_script

    sys.exit(console_script())
