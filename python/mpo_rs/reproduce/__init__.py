"""``mpo-rs reproduce``: the paper's experiments at toy scale (docs/reproduction.md).

Rooms: :mod:`.config` (the arms, budgets and the QUICK / FULL / GPU configurations, numpy
only), :mod:`.stats` (confidence intervals and the verdict rule, numpy only), :mod:`.run`
(one run = an arm trained from one seed, and the pool of runs; needs torch), :mod:`.report`
(tables, figures, claims and the generated page; needs pyarrow and matplotlib),
:mod:`.command` (the command's arguments and run).
"""

from __future__ import annotations

# The command's run() is mpo_rs.reproduce.command.run: `run` here is the submodule.
from .command import add_parser
from .config import ARMS, CONFIGS, FULL, GPU, QUICK, Arm, Budget, ModelSpec, ReproduceConfig, TaskSpec, get_config

__all__ = [
    "ARMS",
    "CONFIGS",
    "FULL",
    "GPU",
    "QUICK",
    "Arm",
    "Budget",
    "ModelSpec",
    "ReproduceConfig",
    "TaskSpec",
    "add_parser",
    "get_config",
]
