"""``mpo-rs check module:function --convention verl-gae``: the kit from the command line.

Imports the function, runs :func:`mpo_rs.testing.check_advantages` on it and prints the
report; exit code 0 when every invariant held, 1 (with the counterexamples) when one
failed or the function cannot be imported, 2 for a usage error. A line on stderr before
each invariant shows progress. Needs the ``testing`` extra; this module imports
hypothesis only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from ..exceptions import InvalidOptionError

__all__ = ["CONVENTION_ESTIMATORS", "add_parser", "load_function", "run"]

CONVENTION_ESTIMATORS = {
    "flat": "gae",
    "flat-group": "grpo",
    "padded": "gae",
    "verl-gae": "gae",
    "verl-group": "grpo",
    "verl-reinforce": "reinforce",
}
"""The estimator a convention is checked as when ``--estimator`` is not given."""


def add_parser(commands: Any) -> None:
    """Adds the ``check`` subcommand to the command line's subparsers."""
    p = commands.add_parser(
        "check",
        help="property-test an advantage function against the invariants of its estimator",
        description=(
            "Runs random multi-turn batches through FUNCTION (module:function, importable from the "
            "current directory) in the calling convention given, checks every invariant its estimator "
            "implies (docs/testing.md) and prints a report; a failure shows the shrunk batch."
        ),
    )
    p.add_argument("function", metavar="FUNCTION", help="module:function, e.g. my_trainer.advantages:compute_gae")
    p.add_argument(
        "--convention",
        choices=sorted(CONVENTION_ESTIMATORS),
        default="flat",
        help="how the function is called (default: flat): see docs/testing.md",
    )
    p.add_argument(
        "--estimator",
        choices=["gae", "mae", "reinforce", "grpo", "drgrpo", "rloo"],
        default=None,
        help="what the function computes (default: the convention's: gae, grpo for the group ones, reinforce for verl-reinforce)",
    )
    p.add_argument(
        "--profile",
        choices=["ci", "fuzz"],
        default=None,
        help="ci: the same 40 examples per invariant on every run (default); fuzz: 1000 random ones",
    )
    p.add_argument("--max-examples", type=int, metavar="N", default=None, help="examples per invariant")
    p.add_argument(
        "--invariant",
        action="append",
        metavar="NAME",
        default=None,
        help="check only this invariant (repeatable; default: all the estimator implies)",
    )


def load_function(spec: str) -> Callable[..., Any]:
    """The function named ``module:function`` (a dotted attribute path after the colon)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidOptionError(f"expected FUNCTION as module:function, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` has it
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidOptionError(f"{spec} is not callable")
    return obj  # type: ignore[no-any-return]


def run(args: argparse.Namespace, note: Callable[[str], None]) -> int:
    """Runs the command; returns its exit code."""
    from ..exceptions import MissingDependencyError, MpoError

    try:
        from .check import check_advantages

        fn = load_function(args.function)
    except MissingDependencyError as e:
        note(f"error: {e}")
        return 1
    except InvalidOptionError as e:  # not module:function, or not a function
        note(f"error: {e}")
        return 1
    except (ImportError, AttributeError) as e:
        note(f"error: cannot load {args.function}: {type(e).__name__}: {e}")
        return 1
    estimator = args.estimator or CONVENTION_ESTIMATORS[args.convention]
    try:
        report = check_advantages(
            fn,
            convention=args.convention,
            estimator=estimator,
            invariants=args.invariant,
            profile=args.profile,
            max_examples=args.max_examples,
            progress=note,
        )
    except MpoError as e:  # an invariant that does not apply to the estimator
        note(f"error: {e}")
        return 2
    except MissingDependencyError as e:
        note(f"error: {e}")
        return 1
    print(report)
    return 0 if report.ok else 1
