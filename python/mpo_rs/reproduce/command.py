"""The ``mpo-rs reproduce`` command: its arguments and its run (``mpo_rs.cli`` registers
and calls it)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._native import InvalidOptionError, check_output_dir
from .._native import claim_output_dir as native_claim

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "reproduce",
        help="train the paper's arms on toy multi-turn tasks and report its claims",
        description=(
            "Trains GRPO, GSPO, PPO, MPO w/ token IS and MPO, the β sweep and the (λ, λ_intra) grid "
            "on KeyDoor, and GRPO/PPO/MPO on GuessNumber, with equal budgets; writes results tables, "
            "learning curves, final-success bars, the critics' value-structure diagnosis and "
            "reproduction.md with a verdict per claim. Needs the torch, arrow and plot extras."
        ),
    )
    p.add_argument("--quick", action="store_true", help="the smoke-test configuration (one seed, a few updates)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda runs the larger GPU configuration")
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
    p.add_argument(
        "--docs",
        metavar="DOCS_DIR",
        help="also write DOCS_DIR/reproduction.md and DOCS_DIR/img/reproduction/ (not with --quick)",
    )


def claim_output_dir(out: Path, config_hash: str, *, overwrite: bool) -> None:
    """Takes ``out`` for a run of the configuration ``config_hash``, by the output-safety
    rule of rust/logs (``mpo_rs._native.claim_output_dir``): a new or empty directory, or
    an earlier output of ``reproduce`` with the same configuration (its finished runs are
    resumed). A directory that reproduce did not write, or one of another configuration,
    is refused with InvalidOptionError unless ``overwrite``; nothing is deleted."""
    try:
        previous = check_output_dir(out, "reproduce", overwrite=overwrite, label="--out")
    except InvalidOptionError as e:
        raise InvalidOptionError(f"{e}, or pass --overwrite to write into it anyway") from None
    if previous is not None and previous != config_hash and not overwrite:
        raise InvalidOptionError(
            f"--out {out} holds the runs of another configuration ({previous}, not {config_hash}); "
            "choose a new directory, or pass --overwrite to write this one's beside them"
        )
    native_claim(out, "reproduce", config_hash, overwrite=overwrite, label="--out")


def run(args: argparse.Namespace, note: Callable[[str], None] = lambda _: None) -> Path:
    """Runs the command; returns the output directory. Raises InvalidOptionError (usage),
    MissingDependencyError (torch, pyarrow, matplotlib) or OSError."""
    from .config import FULL, GPU, QUICK

    if args.quick and args.docs:
        raise InvalidOptionError("--docs writes the committed page; it takes the full run, not --quick")
    for name in ("workers", "seeds"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InvalidOptionError(f"--{name} must be at least 1, got {value}")
    config = QUICK if args.quick else FULL
    if args.device == "cuda":
        config = dataclasses.replace(GPU, budget=QUICK.budget, seeds=1) if args.quick else GPU
    config = config.with_overrides(seeds=args.seeds, workers=args.workers)
    if args.out:
        out = Path(args.out)
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="mpo-reproduce-quick-"))
    else:
        out = Path("reproduce-out")
    from .._deps import require

    require("torch", "mpo-rs reproduce", "torch")
    require("pyarrow", "mpo-rs reproduce", "arrow")
    require("matplotlib", "mpo-rs reproduce", "plot")
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InvalidOptionError("--device cuda: torch sees no CUDA device")
    from .report import write_report
    from .run import run_all

    claim_output_dir(out, config.config_hash(), overwrite=args.overwrite)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    note(
        f"{config.name} configuration ({config.config_hash()}): {len(config.arms)} arms x {config.seeds} seed(s), "
        f"{config.workers} worker(s), output in {out}"
    )
    runs = run_all(config, out, note=note)
    meta: dict[str, Any] = {
        "wall_s": time.perf_counter() - t0,
        "workers": config.workers,
        "started": started,
        "cpus": os.cpu_count(),
    }
    write_report(runs, config, out, meta, docs_dir=args.docs, note=note)
    note(f"done in {meta['wall_s'] / 60:.1f} min")
    return out
