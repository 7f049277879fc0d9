"""The critic-quality ladder: the arms that read the reference critic degraded to a known
share of its explained variance (:class:`~mpo_lab.reproduce.reference.OnPolicyReference`)."""

from __future__ import annotations

import dataclasses

from .config import Arm, relatives_arms, table1_arms
from .tasks import MAIN_TASK, task_prefix

__all__ = ["LADDER", "ladder_arms"]

LADDER = (1.0, 0.75, 0.5, 0.25, 0.0)
"""The critic-quality ladder: the reference critic's explained variance kept, as a fraction."""


def ladder_arms(task: str = MAIN_TASK) -> tuple[Arm, ...]:
    """The critic-quality ladder on ``task``: MPO, PPO, AReaL's turn-level GAE and RAGEN's
    bi-level GAE (their Table-1 and relatives' estimators and ratios) on the reference critic
    degraded to each fraction of :data:`LADDER` (1: the reference itself). Keys
    ``<prefix><method>_ref<k>``, study ``ladder``; GRPO (no critic) is the table's own arm."""
    p = task_prefix(task)
    learned = {a.key[len(p) :]: a for a in (*table1_arms(task), *relatives_arms(task))}
    out = []
    for k in LADDER:
        for method in ("mpo", "ppo", "areal_turn_gae", "ragen_bilevel"):
            arm = learned[method]
            out.append(
                dataclasses.replace(
                    arm,
                    key=f"{p}{method}_ref{k:g}",
                    label=f"{arm.label}, reference critic x{k:g}",
                    study="ladder",
                    critic="reference",
                    critic_ev=None if k == 1.0 else k,
                )
            )
    return tuple(out)
