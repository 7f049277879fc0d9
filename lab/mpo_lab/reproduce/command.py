"""The ``reproduce`` command: its arguments and its run (``mpo-lab reproduce``, and
``mpo-rs reproduce`` through the entry point :func:`mpo_lab.cli.reproduce_command`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpo_rs.exceptions import InvalidOptionError

from .api import build_config, run_config
from .budgets import BUDGETS, NAMED_CONFIGS

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "add_parser", "run"]

DESCRIPTION = (
    "Trains the paper's arms (GRPO, PPO, MPO w/ token IS, MPO and their relatives) on toy multi-turn "
    "tasks, each from a behaviour-cloned base policy with equal budgets, and writes the results tables, "
    "figures and reproduction.md with a paired verdict per comparison. Without flags it runs the smoke "
    "test (--budget quick: every arm a few updates, about a minute; its numbers are not evidence); "
    "--config instrument is the committed page's run on the gated tasks (lab/docs/reproduction.md, 156 "
    "min on 2 cores) and --budget full the paper configuration's. With --env, the same protocol on your "
    "own MultiTurnEnv (lab/docs/reproduction.md, 'Does MPO help on my task?')."
)


HELP = "train the paper's arms on toy multi-turn tasks (or your own) and report its claims"


def add_parser(commands: Any) -> None:
    """Adds ``reproduce`` to the subcommands ``commands`` (``mpo-lab``'s)."""
    add_arguments(commands.add_parser("reproduce", help=HELP, description=DESCRIPTION))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's arguments, on ``p`` (``mpo-rs reproduce`` builds a parser of its own)."""
    p.add_argument("--quick", action="store_true", help="the smoke test: --budget quick (one seed, a few updates)")
    p.add_argument(
        "--budget",
        choices=BUDGETS,
        help=(
            "quick (the default: a smoke test of every arm in about a minute; its numbers are not evidence), "
            "small (a quarter of the full run's updates: a first look), pilot (the full budget on the pilot's "
            "own seeds, which size the final run's: docs/analysis-plan.md) or full (the paper configuration's "
            "run, whose tasks failed their gates: docs/paper/reproduction.md; about an hour on 2 cores)"
        ),
    )
    p.add_argument(
        "--config",
        choices=NAMED_CONFIGS,
        help=(
            "a committed configuration by name instead of a budget: instrument runs the tasks that passed their "
            "gates, with the turn-length sweep, GiGPO and the critic-quality ladder (docs/instrument.md; the "
            "committed page's run, 156 min on 2 cores); instrument-quick is its smoke test"
        ),
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda runs the larger GPU configuration")
    p.add_argument(
        "--env",
        metavar="MODULE:FACTORY",
        help=(
            "run on your own environment: a callable returning a MultiTurnEnv, importable from the current "
            "directory or PYTHONPATH (e.g. examples.my_env:make); the arms of Table 1 unless --arms"
        ),
    )
    p.add_argument(
        "--env-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the --env factory (repeatable; VALUE is read as JSON, else as a string)",
    )
    p.add_argument(
        "--demonstrator",
        metavar="MODULE:CALLABLE",
        help=(
            "with --env: the arms start from a base policy behaviour-cloned from this callable's episodes, as each "
            "built-in task's is from its noisy oracle: it maps the observations so far (lists of token ids, the "
            "prompt first) to the next action's token ids (e.g. examples.my_env:demonstrate). Without it or "
            "--base-policy, a user env's arms start from a random initialisation"
        ),
    )
    p.add_argument(
        "--base-policy",
        metavar="PATH",
        help=(
            "with --env: every seed's arms start from this policy file (torch.save of the run's model's state dict, "
            "such as OUT/base/<task>-seed<seed>.pt of an earlier run); a file of another model is refused"
        ),
    )
    p.add_argument(
        "--arms",
        metavar="KEYS",
        help="comma-separated arm keys to run (e.g. mpo,ppo); an unknown key is refused with the known ones",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help=(
            "output directory (default: reproduce-out, or a new temporary one with --quick); an existing one must be "
            "empty or an earlier output of reproduce (a run of the same configuration resumes from its finished runs)"
        ),
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out that is not an earlier output of this configuration",
    )
    p.add_argument("--workers", type=int, metavar="N", help="parallel runs (CPU; default: the configuration's)")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per arm (default: the configuration's)")
    p.add_argument("--first-seed", type=int, metavar="S", help="run seeds S, S+1, ... (default: the configuration's)")
    p.add_argument(
        "--gates",
        metavar="FILE",
        help=(
            "the gates measured on a pilot (mpo-lab gates --json FILE); without it the run "
            "measures its own base policies on its first two seeds. A comparison on a task that does not pass "
            "its gates gets no verdict"
        ),
    )
    p.add_argument(
        "--docs",
        metavar="DOCS_DIR",
        help="also write DOCS_DIR/reproduction.md, DOCS_DIR/img/reproduction/ and the README's summary (with "
        "--config instrument only)",
    )


def _env_params(pairs: list[str]) -> dict[str, Any]:
    """--env-param KEY=VALUE pairs; VALUE as JSON when it parses (5, 0.1, true, "x"), else as a string."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise InvalidOptionError(f"--env-param {pair!r}: expected KEY=VALUE with KEY a Python identifier")
        try:
            params[key] = json.loads(text)
        except ValueError:
            params[key] = text
    return params


def run(args: argparse.Namespace, note: Callable[[str], None] = lambda _: None) -> Path:
    """Runs the command (through :func:`mpo_lab.reproduce.api.run_config`, as ``compare``
    does); returns the output directory. Raises InvalidOptionError (usage),
    InvalidConfigError (--env), MissingDependencyError (torch, pyarrow, matplotlib) or OSError."""
    if args.quick and args.budget not in (None, "quick"):
        raise InvalidOptionError(f"--quick is --budget quick; it cannot be combined with --budget {args.budget}")
    named = getattr(args, "config", None)
    if named and (args.quick or args.budget or args.env):
        raise InvalidOptionError("--config names a whole configuration; it takes no --quick, --budget or --env")
    budget = "quick" if args.quick else (args.budget or "quick")
    if args.docs and (args.env or named != "instrument"):
        raise InvalidOptionError(
            "--docs writes the committed page, the instrument configuration's; it takes --config instrument, not "
            "--quick, --budget or --env"
        )
    config = build_config(
        args.env,
        env_params=_env_params(args.env_param),
        arms=args.arms,  # checked there, as compare's are
        seeds=args.seeds,
        first_seed=args.first_seed,
        budget=budget,
        device=args.device,
        workers=args.workers,
        demonstrator=args.demonstrator,
        base_policy=args.base_policy,
        config_name=named,
    )
    gates = getattr(args, "gates", None)
    return run_config(config, args.out, overwrite=args.overwrite, docs=args.docs, note=note, gates_file=gates).out
