"""The ``mpo-rs reproduce`` command: its arguments and its run (``mpo_rs.cli`` registers
and calls it)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._native import InvalidOptionError, check_output_dir
from .._native import claim_output_dir as native_claim
from .api import BUDGETS, build_config, run_config

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "reproduce",
        help="train the paper's arms on toy multi-turn tasks (or your own) and report its claims",
        description=(
            "Trains Table 1's arms (GRPO, GSPO, PPO, MPO w/ token IS, MPO) on five tasks (search, multi_hop and "
            "frozen_lake, where MPO's premise holds; key_door and guess_number, the controls), MPO's public "
            "relatives (AReaL's turn-level GAE, RAGEN's bi-level GAE), the β sweep and the (λ, λ_intra) grid "
            "on search, each from a behaviour-cloned base policy, with equal budgets; writes results tables, "
            "learning curves, final-success bars, the critics' value-structure diagnosis and "
            "reproduction.md with a verdict per claim. With --env, the same protocol on your own "
            "MultiTurnEnv (docs/reproduction.md, 'Does MPO help on my task?'). Needs the torch, "
            "arrow and plot extras."
        ),
    )
    p.add_argument("--quick", action="store_true", help="the smoke test: --budget quick (one seed, a few updates)")
    p.add_argument(
        "--budget",
        choices=BUDGETS,
        help=(
            "quick (smoke test), small (a quarter of the full run's updates: a first look), pilot (the full "
            "budget on the pilot's own seeds, which size the final run's: docs/analysis-plan.md) or full (default)"
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
        "--docs",
        metavar="DOCS_DIR",
        help="also write DOCS_DIR/reproduction.md and DOCS_DIR/img/reproduction/ (the full budget, no --env)",
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


def claim_output_dir(out: Path, config_hash: str, *, overwrite: bool) -> None:
    """Takes ``out`` for a run of the configuration ``config_hash``, by the output-safety
    rule of rust/logs (``mpo_rs._native.claim_output_dir``): a new or empty directory, or
    an earlier output of ``reproduce`` with the same configuration (its finished runs are
    resumed). A directory that reproduce did not write, or one of another configuration,
    is refused with InvalidOptionError unless ``overwrite``; nothing is deleted."""
    try:
        previous = check_output_dir(out, "reproduce", overwrite=overwrite, label="--out")
    except InvalidOptionError as e:
        # Advise --overwrite only where it would lift the refusal (not for a file, a FIFO,
        # a device, a dangling link or an input: those messages say what helps).
        if overwrite or not _overwrite_helps(out):
            raise
        raise InvalidOptionError(f"{e}, or pass --overwrite to write into it anyway") from None
    if previous is not None and previous != config_hash and not overwrite:
        raise InvalidOptionError(
            f"--out {out} holds the runs of another configuration ({previous}, not {config_hash}); "
            "choose a new directory, or pass --overwrite to write this one's beside them"
        )
    native_claim(out, "reproduce", config_hash, overwrite=overwrite, label="--out")


def _overwrite_helps(out: Path) -> bool:
    try:
        check_output_dir(out, "reproduce", overwrite=True, label="--out")
    except InvalidOptionError:
        return False
    return True


def run(args: argparse.Namespace, note: Callable[[str], None] = lambda _: None) -> Path:
    """Runs the command (through :func:`mpo_rs.reproduce.api.run_config`, as ``compare``
    does); returns the output directory. Raises InvalidOptionError (usage),
    InvalidConfigError (--env), MissingDependencyError (torch, pyarrow, matplotlib) or OSError."""
    if args.quick and args.budget not in (None, "quick"):
        raise InvalidOptionError(f"--quick is --budget quick; it cannot be combined with --budget {args.budget}")
    budget = "quick" if args.quick else (args.budget or "full")
    if args.docs and (budget != "full" or args.env):
        raise InvalidOptionError(
            "--docs writes the committed page; it takes the full run, not --quick, --budget or --env"
        )
    arms = None
    if args.arms is not None:
        arms = [key.strip() for key in args.arms.split(",") if key.strip()]
        if not arms:
            raise InvalidOptionError("--arms: give at least one arm key, e.g. --arms mpo,ppo")
    for name in ("workers", "seeds"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InvalidOptionError(f"--{name} must be at least 1, got {value}")
    if args.first_seed is not None and args.first_seed < 0:
        raise InvalidOptionError(f"--first-seed must be at least 0, got {args.first_seed}")
    config = build_config(
        args.env,
        env_params=_env_params(args.env_param),
        arms=arms,
        seeds=args.seeds,
        first_seed=args.first_seed,
        budget=budget,
        device=args.device,
        workers=args.workers,
    )
    return run_config(config, args.out, overwrite=args.overwrite, docs=args.docs, note=note).out
