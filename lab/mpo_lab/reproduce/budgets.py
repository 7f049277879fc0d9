"""The named budgets and what a configuration is: :data:`BUDGETS`, the committed
configuration each starts from (:func:`base_config`), the arms a user environment can run
(:func:`template_arms`), and, back from a configuration, its budget's name, whether it is
the committed one and the ``mpo-rs reproduce`` flags that run it."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from typing import Any

from mpo_rs.exceptions import InvalidOptionError

from .config import Arm, Budget, ReproduceConfig
from .presets import FULL, GPU, INSTRUMENT, INSTRUMENT_QUICK, PILOT, QUICK, get_config
from .sources import Demonstrator, SavedPolicy

__all__ = [
    "BUDGETS",
    "NAMED_CONFIGS",
    "arm_keys",
    "base_config",
    "budget_name",
    "command_line",
    "is_committed",
    "template_arms",
]


def _small(budget: Budget) -> Budget:
    """A quarter of ``budget``'s updates, evaluated as often relative to the run's length."""
    updates = max(1, budget.updates // 4)
    return dataclasses.replace(budget, updates=updates, eval_every=max(1, budget.eval_every // 4))


BUDGETS = ("quick", "small", "pilot", "full")
"""The named budgets: ``quick`` (the smoke test's: a few updates, one seed), ``small`` (the
full run's with a quarter of its updates), ``pilot`` (the full run's budget on the pilot's
own seeds, :data:`~mpo_lab.reproduce.config.PILOT`, which sizes the final run's seeds through
the analysis plan) and ``full`` (the reported run's)."""


NAMED_CONFIGS = (INSTRUMENT.name, INSTRUMENT_QUICK.name)
"""The committed configurations ``mpo-rs reproduce --config`` runs by name (the others are the
named budgets' own)."""


def base_config(budget: str | Budget, device: str) -> ReproduceConfig:
    """The committed configuration a budget starts from (QUICK, FULL or GPU, as before)."""
    if device not in ("cpu", "cuda"):
        raise InvalidOptionError(f"device must be 'cpu' or 'cuda', got {device!r}")
    full = GPU if device == "cuda" else FULL
    if isinstance(budget, Budget):
        return dataclasses.replace(full, name="custom", budget=budget)
    if budget == "quick":
        return dataclasses.replace(GPU, budget=QUICK.budget, seeds=1) if device == "cuda" else QUICK
    if budget == "small":
        return dataclasses.replace(full, name=f"{full.name}-small", budget=_small(full.budget))
    if budget == "pilot":
        if device == "cuda":
            raise InvalidOptionError(
                "the pilot is the CPU run's (--budget pilot sizes FULL's seeds); it has no cuda form"
            )
        return PILOT
    if budget == "full":
        return full
    raise InvalidOptionError(f"unknown budget {budget!r}; known: {', '.join(BUDGETS)} (or a Budget)")


def template_arms(base: ReproduceConfig) -> dict[str, Arm]:
    """The arms a user env can run: those of the base configuration's main task (the MPO
    arm's), in its order; their keys stay, so the confirmatory comparisons apply as they are."""
    main = base.arm("mpo").task
    return {a.key: a for a in base.arms if a.task == main}


def arm_keys(env: str | Callable[..., Any] | None = None, budget: str | Budget = "full") -> tuple[str, ...]:
    """The arm keys ``arms=`` accepts: every arm of the configuration (``env`` None), or
    the arms of the main task that a user env can run."""
    base = base_config(budget, "cpu")
    return tuple(template_arms(base) if env is not None else (a.key for a in base.arms))


def budget_name(config: ReproduceConfig) -> str | None:
    """``quick``, ``small``, ``pilot`` or ``full`` when ``config`` runs that named budget, else
    None (a Budget of the caller's)."""
    if config.name == PILOT.name and config.budget == PILOT.budget:
        return "pilot"
    for full in (FULL, GPU):
        for name, budget in (("quick", QUICK.budget), ("small", _small(full.budget)), ("full", full.budget)):
            if config.budget == budget:
                return name
    return None


def is_committed(config: ReproduceConfig) -> bool:
    """Whether ``config`` is the committed full configuration (FULL, or GPU) unchanged:
    the run ``make reproduce`` writes the page from."""
    return config.config_hash() in (FULL.config_hash(), GPU.config_hash(), INSTRUMENT.config_hash())


def command_line(config: ReproduceConfig) -> str:
    """The ``mpo-rs reproduce`` flags that run ``config`` (without ``--out``), or "" when
    only the Python API can (a Budget of the caller's)."""
    named = get_config(config.name) if config.name in NAMED_CONFIGS else None
    if named is not None and config.budget == named.budget and config.device == named.device:
        default = [a.key for a in named.arms]
        return " ".join(["mpo-rs reproduce", f"--config {config.name}", *_differences(config, named, default)])
    budget = budget_name(config)
    if budget is None:
        return ""
    parts = ["mpo-rs reproduce"]
    if budget != "full":
        parts.append("--quick" if budget == "quick" else f"--budget {budget}")
    if config.device == "cuda":
        parts.append("--device cuda")
    base = base_config(budget, config.device)
    user = [t for t in config.tasks if ":" in t.name]
    if user:
        parts.append(f"--env {user[0].name}")
        parts += [f"--env-param {k}={json.dumps(v)}" for k, v in user[0].params]
        source = None if config.base is None else config.base.source
        if isinstance(source, Demonstrator):
            parts.append(f"--demonstrator {source.spec}")
        elif isinstance(source, SavedPolicy):
            parts.append(f"--base-policy {shlex.quote(source.path)}")
        template = template_arms(base)
        default = [a.key for a in template.values() if a.study == template["mpo"].study]
    else:
        default = [a.key for a in base.arms]
    return " ".join(parts + _differences(config, base, default))


def _differences(config: ReproduceConfig, base: ReproduceConfig, default: list[str]) -> list[str]:
    """The flags that take ``base`` to ``config``: its arms (unless they are ``default``), seeds
    and first seed."""
    parts = []
    keys = [a.key for a in config.arms]
    if keys != default:
        parts.append(f"--arms {','.join(keys)}")
    if config.seeds != base.seeds:
        parts.append(f"--seeds {config.seeds}")
    if config.first_seed != base.first_seed:
        parts.append(f"--first-seed {config.first_seed}")
    return parts
