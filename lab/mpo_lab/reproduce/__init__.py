"""``reproduce`` (``mpo-lab reproduce``, also ``mpo-rs reproduce``): the paper's experiments at
toy scale (lab/docs/reproduction.md).

Rooms: :mod:`.config` (the arms, budgets, models and tasks, numpy only), :mod:`.presets` (the
committed configurations: QUICK / PILOT / FULL / GPU and the instrument's), :mod:`.plan` (the analysis plan fixed before the final runs and the seed
sizing from the pilot, numpy only), :mod:`.stats` (confidence intervals and the verdict
rule, numpy only), :mod:`.base` (the base policy of a task and seed, behaviour-cloned from a
noisy oracle, and the critic warm-up; needs torch), :mod:`.run` (one run = an arm trained
from one seed, and the pool of runs; needs torch), :mod:`.report`
(tables, figures, claims and the generated page; needs pyarrow and matplotlib),
:mod:`.api` (:func:`compare`: the protocol on your own ``MultiTurnEnv``, which the command
runs), :mod:`.command` (the command's arguments and run; the seeds are :mod:`mpo_lab.seeds`), :mod:`.env` (a task's environment: found, checked, identified, sized), :mod:`.userbase`
(a user env's own base policy: a demonstrator's clone or a policy file, :mod:`.sources`) and
:mod:`.pool` (the worker processes, which a stop always ends).
"""

from __future__ import annotations

# The command's run() is mpo_lab.reproduce.command.run: `run` here is the submodule.
from . import config, presets
from .api import CompareResult, compare
from .command import add_parser

# The configurations and their types, as config and presets export them (their __all__ list them once).
from .config import *  # noqa: F403
from .presets import *  # noqa: F403

__all__ = [*config.__all__, *presets.__all__, "CompareResult", "add_parser", "compare"]
