"""The learner's estimator adapter: runs an :class:`mpo_rs.Estimator` on a
:class:`~mpo_rs.torch.batch.RolloutBatch` (needs torch).

The estimator is a name or an ``Estimator`` (options resolved once, by the Rust options
table, :func:`mpo_rs.options.resolve`); every estimator of the table works: ``mae``,
``gae``, ``bilevel`` (critic estimators: advantages and critic targets from the values), the group
family ``grpo``, ``drgrpo``, ``rloo`` (critic-free: one advantage per trajectory from the
group baseline, written on its policy tokens) and ``gigpo`` (critic-free: the group's
episode baseline plus step baselines over anchor states hashed from the batch's token
ids). A critic-free estimator used with a critic gives the critic discounted Monte-Carlo
returns as targets (:func:`critic_targets_estimator`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .. import estimators
from ..exceptions import InvalidOptionError, InvalidRolloutError
from ..options import CRITIC_FREE_FAMILIES, Estimator, resolve
from .batch import RolloutBatch

__all__ = [
    "CRITIC_FREE_FAMILIES",
    "NATURAL_RATIO",
    "as_estimator",
    "critic_targets_estimator",
    "estimate",
    "natural_ratio",
]

NATURAL_RATIO = {"mae": "turn", "gae": "token", "group": "token", "bilevel": "token", "gigpo": "token"}
"""The policy loss's ratio per estimator family when the learner is not told one: MPO
updates with the turn ratio, PPO, RAGEN's bi-level GAE, the GRPO family and GiGPO with
token ratios."""


def as_estimator(estimator: Any, name: str = "estimator") -> Estimator:
    """``estimator`` (a name or an ``Estimator``) as an ``Estimator``; raises
    :class:`mpo_rs.InvalidOptionError` for anything else or an unknown name."""
    if isinstance(estimator, Estimator):
        return estimator
    if not isinstance(estimator, str):
        raise InvalidOptionError(f"`{name}` must be an estimator name or an mpo_rs.Estimator, got {estimator!r:.80}")
    return resolve(estimator, {}, "mae")


def natural_ratio(estimator: Estimator) -> str:
    """The policy ratio of ``estimator``'s family (:data:`NATURAL_RATIO`)."""
    return NATURAL_RATIO[estimator.family]


def critic_targets_estimator(estimator: Estimator) -> Estimator:
    """The estimator whose ``returns`` are a critic-free estimator's critic targets:
    discounted Monte-Carlo returns (``lam = lam_critic = 1``), discounted by ``estimator``'s
    gamma if it has one, else 1 (the group family has none). GiGPO discounts once per turn,
    so its targets are MAE's returns (gamma once per interaction)."""
    return _monte_carlo(float(estimator.options.get("gamma", 1.0)), estimator.family == "gigpo")


@lru_cache(maxsize=8)
def _monte_carlo(gamma: float, per_turn: bool = False) -> Estimator:
    if per_turn:
        return Estimator("mae", gamma=gamma, lam=1.0, lam_critic=1.0)
    return Estimator("gae", gamma=gamma, lam=1.0, lam_critic=1.0)


def estimate(
    estimator: Estimator, batch: RolloutBatch, values: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-token advantages (0 off-policy) and critic targets of ``batch`` by the Rust core.

    Critic estimators need ``values`` (one per token) and return their own targets. A
    critic-free estimator needs ``batch.group_ids`` (gigpo also reads ``batch.token_ids``,
    its anchor states); its targets are the Monte-Carlo returns when ``values`` are given (a
    critic is trained alongside), None otherwise. Raises
    :class:`mpo_rs.InvalidRolloutError` naming what is missing.
    """
    rewards: dict[str, Any] = {"rewards": batch.rewards} if batch.rewards is not None else {"scores": batch.scores}
    if estimator.family in CRITIC_FREE_FAMILIES:
        if batch.group_ids is None:
            raise InvalidRolloutError(f"estimator={estimator.name!r} needs `group_ids` in the batch")
        if estimator.family == "gigpo":
            inputs: dict[str, Any] = {"token_ids": batch.token_ids, **rewards}
        else:
            inputs = {"scores": batch.trajectory_scores()}
        advantages = estimators._estimate(
            estimator, batch.mask, batch.offsets, group_ids=batch.group_ids, **inputs
        ).advantages
        if values is None:
            return advantages, None
        # The critic trained beside a critic-free estimator learns the Monte-Carlo returns.
        targets = estimators._estimate(
            critic_targets_estimator(estimator), batch.mask, batch.offsets, values, **rewards
        ).returns
        return advantages, targets
    if values is None:
        raise InvalidRolloutError(
            f"estimator={estimator.name!r} needs values: give the learner a critic or the batch `values`"
        )
    raw = estimators._estimate(estimator, batch.mask, batch.offsets, values, **rewards)
    return raw.advantages, raw.returns
