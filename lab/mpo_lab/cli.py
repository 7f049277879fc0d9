"""The ``mpo-lab`` command line, and ``mpo-rs reproduce`` (an entry point of ``mpo-rs``).

- ``mpo-lab reproduce …``: train the arms and write the page (:mod:`mpo_lab.reproduce.command`);
- ``mpo-lab gates …``: measure a configuration's gates on a pilot (:mod:`mpo_lab.reproduce.gates`);
- ``mpo-lab plan [NAME]``: print an analysis plan as committed (:mod:`mpo_lab.reproduce.plan`);
- ``mpo-lab page [DOCS]``: render a committed page again from its records (:mod:`mpo_lab.reproduce.report`);
- ``mpo-lab premise …``: measure the built-in tasks' premise before training (:mod:`mpo_lab.envs.premise`).

Exit codes as ``mpo-rs``'s: 0 done, 1 failed, 2 usage, 128 + the signal when stopped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from mpo_rs.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Parser, leave_signal_stops
from mpo_rs.exceptions import MissingDependencyError, MpoError

__all__ = ["COMMANDS", "main", "reproduce_command"]

PROG = "mpo-lab"


def _fail(prog: str, message: str, code: int) -> int:
    sys.stderr.write(f"{prog}: error: {message}\n")
    return code


def reproduce_command(argv: Sequence[str], prog: str = f"{PROG} reproduce") -> int:
    """``reproduce`` on ``argv`` (the arguments after its name); returns the exit code. It is
    also ``mpo-rs reproduce``: the library's command line finds it through the entry point
    group ``mpo_rs.commands``."""
    from .reproduce import command

    parser = Parser(prog=prog, description=command.DESCRIPTION)
    command.add_arguments(parser)
    args = parser.parse_args(list(argv))

    tool = prog.split()[0]  # the console script's name, as its own messages give it

    def note(line: str) -> None:
        sys.stderr.write(f"{tool}: {line}\n")

    try:
        out = command.run(args, note=note)
    except MpoError as e:  # a bad flag, or a bad --env (InvalidConfigError)
        return _fail(tool, str(e), EXIT_USAGE)
    except (MissingDependencyError, OSError) as e:
        return _fail(tool, str(e), EXIT_FAILED)
    except KeyboardInterrupt as e:
        leave_signal_stops(e)  # a SIGTERM or SIGHUP before the runs started: the console script's
        # A stop of the runs (reproduce.run.RunsStopped) says what was kept, and its signal.
        return _fail(tool, str(e) or "interrupted", getattr(e, "exit_code", EXIT_INTERRUPTED))
    print(f"wrote {out / 'reproduction.md'}")
    return EXIT_OK


def _gates(argv: Sequence[str], prog: str) -> int:
    from .reproduce import gates

    return gates.main(argv, prog=prog)


def _plan(argv: Sequence[str], prog: str) -> int:
    from .reproduce import plan

    parser = Parser(prog=prog, description="Print an analysis plan as committed (markdown, with its hash).")
    parser.add_argument(
        "name", nargs="?", default="paper", choices=sorted(plan.PLANS), help="the plan (default: paper)"
    )
    args = parser.parse_args(list(argv))
    print(plan.render_markdown(plan.PLANS[args.name]), end="")
    return EXIT_OK


def _page(argv: Sequence[str], prog: str) -> int:
    from .reproduce import report

    parser = Parser(
        prog=prog,
        description="Render a committed reproduction page again from its records (DOCS/full/results.json), "
        "and the README's summary beside DOCS.",
    )
    parser.add_argument("docs", nargs="?", default="docs", help="the docs directory holding the page (default: docs)")
    args = parser.parse_args(list(argv))
    for line in report.write_committed_page(args.docs):
        print(line)
    return EXIT_OK


def _premise(argv: Sequence[str], prog: str) -> int:
    from .envs import premise

    return premise.main(argv, prog=prog)


COMMANDS: dict[str, tuple[Callable[[Sequence[str], str], int], str]] = {
    "reproduce": (reproduce_command, "train the arms on toy multi-turn tasks (or your own) and write the page"),
    "gates": (_gates, "measure a configuration's gates (base policies, learning) on a pilot"),
    "plan": (_plan, "print an analysis plan as committed, with its hash"),
    "page": (_page, "render a committed page again from its records"),
    "premise": (_premise, "measure the built-in tasks' premise (between-turn share) before any training"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """The ``mpo-lab`` command line; returns the exit code. The console script runs it
    through :func:`mpo_rs_cli.console`, which makes SIGTERM and SIGHUP stop a run as Ctrl-C does."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in COMMANDS:
        run, _ = COMMANDS[words[0]]
        return run(words[1:], f"{PROG} {words[0]}")
    parser = Parser(prog=PROG, description="The mpo_rs lab: does MPO help, and when? Experiments on toy tasks.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, help=text, add_help=False)
    parser.parse_args(words)  # --help, --version or a usage error: exits
    return EXIT_USAGE
