"""A reproduction task's name and role: the main task, the premise tasks and the controls,
each environment's arm-key prefix, and the variants of one environment (numpy-free)."""

from __future__ import annotations

__all__ = [
    "CONTROL_TASKS",
    "MAIN_TASK",
    "PREMISE_TASKS",
    "ROLES",
    "STATE_ANCHOR",
    "TASK_PREFIX",
    "VARIANT",
    "registry_name",
    "state_anchor",
    "task_prefix",
    "task_role",
]

MAIN_TASK = "search"
"""The main task: Table 1 there keeps the unprefixed arm keys, and the β sweep, the (λ, λ_intra)
grid, the advantage-scale ablation and the relatives run there."""
TASK_PREFIX = {
    "search": "",
    "multi_hop": "hop_",
    "frozen_lake": "lake_",
    "sokoban": "sok_",
    "coin_collector": "coin_",
    "key_door": "door_",
    "guess_number": "guess_",
}
"""Arm keys are ``<prefix><method>``: ``mpo`` (search), ``hop_mpo``, ``lake_mpo``, ``sok_mpo``,
``coin_mpo``, ``door_mpo``, ``guess_mpo``."""
VARIANT = "@"
"""Separates a registry name from a variant's label in a task's name: ``search@think16`` is
Search with the parameters its :class:`TaskSpec` gives, beside ``search`` in one configuration."""


def registry_name(task: str) -> str:
    """The environment a task's name makes: ``search`` for ``search@think16``."""
    return task.split(VARIANT, 1)[0]


def task_prefix(task: str) -> str:
    """The prefix of a task's arm keys: :data:`TASK_PREFIX` of its environment, then the
    variant's label (``think16_`` for ``search@think16``; ``""`` for a user env)."""
    base, _, variant = task.partition(VARIANT)
    return TASK_PREFIX.get(base, "") + (f"{variant}_" if variant else "")


PREMISE_TASKS = ("search", "multi_hop", "frozen_lake", "sokoban", "coin_collector")
"""The tasks that meet MPO's premise (measured before training, docs/envs.md)."""
CONTROL_TASKS = ("key_door", "guess_number")
"""The controls: KeyDoor fails the premise; GuessNumber's chance is above the base band."""


STATE_ANCHOR = {"frozen_lake": "observation", "sokoban": "observation", "coin_collector": "observation"}
"""GiGPO's anchor per environment: the turns of a group that start from one environment state
share a step baseline. FrozenLake's and Sokoban's observation is their state (the grid with the
player, and the boxes), Coin Collector's the room the player is in (with the way it came in);
Search's, MultiHop's and a user env's state is the history so far, which ``"prefix"`` hashes
(identical histories of one task's rollouts are one state)."""


def state_anchor(task: str) -> str:
    """GiGPO's ``anchor`` for ``task`` (:data:`STATE_ANCHOR`, else ``"prefix"``)."""
    return STATE_ANCHOR.get(registry_name(task), "prefix")


ROLES = ("premise", "control", "chance", "user")
"""A task's role for the gates: a premise task, the negative control (KeyDoor, where the premise
fails), a control at chance (GuessNumber) or a user's environment."""


def task_role(task: str) -> str:
    """The role of a task (:data:`ROLES`): ``premise`` for :data:`PREMISE_TASKS`, ``control`` for
    the first of :data:`CONTROL_TASKS` (the negative control), ``chance`` for the other controls,
    ``user`` for any other environment; variants take their environment's role."""
    kind = registry_name(task)
    if kind in PREMISE_TASKS:
        return "premise"
    if kind == CONTROL_TASKS[0]:
        return "control"
    return "chance" if kind in CONTROL_TASKS else "user"
