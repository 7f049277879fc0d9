"""GiGPO over a ragged batch: the typed alias of :func:`mpo_rs.advantages` with
``estimator="gigpo"`` (docs/estimators.md, "GiGPO")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .estimators import Turns, _estimate, of_family
from .options import Estimator

__all__ = ["GiGPOResult", "gigpo_advantages"]


@dataclass(frozen=True, eq=False)
class GiGPOResult:
    advantages: npt.NDArray[np.float32]
    """Per token: A_E(j) + step_weight * A_S(j, t) on the policy tokens of turn t; 0
    off-policy. GiGPO has no critic: these are also its returns."""
    episode_advantages: npt.NDArray[np.float32]
    """Per trajectory: A_E, the return minus its group's mean (over trajectories)."""
    step_advantages: npt.NDArray[np.float32]
    """Per turn: A_S, the discounted return from the turn minus its step group's mean."""
    step_groups: npt.NDArray[np.int64]
    """Per turn: the step group's id (dense; numbered group by group, in order of first
    appearance inside a group)."""
    turns: Turns
    """The segmentation the per-turn arrays index."""


def gigpo_advantages(
    mask: Any,
    offsets: Any,
    *,
    group_ids: Any,
    rewards: Any = None,
    scores: Any = None,
    turn_rewards: Any = None,
    turn_state_ids: Any = None,
    token_ids: Any = None,
    estimator: str | Estimator | None = None,
    **options: Any,
) -> GiGPOResult:
    """GiGPO: GRPO's episode baseline plus a baseline among the turns of one group that
    start from the same anchor state.

    Per trajectory j of group g, with per-turn rewards r_{j,t}: the episode advantage
    A_E(j) = R_j - mean_g(R) (R_j = sum_t r_{j,t}; each trajectory counts once), the step
    advantage A_S(j,t) = G_{j,t} - mean_S(G) over the step group S (the turns of group g
    with the same anchor state; G_{j,t} the return from turn t, ``gamma`` once per turn);
    with ``norm_std`` both are divided by their unbiased std plus ``eps``; a group or step
    group of one gets 0. Every policy token of turn t gets A_E(j) + ``step_weight`` *
    A_S(j,t).

    Exactly one reward source: ``rewards`` (per token, summed per turn), ``scores`` (per
    trajectory, on its last turn) or ``turn_rewards`` (per turn, as in
    :func:`mpo_rs.mae_advantages`). ``group_ids`` as for the group estimators. Anchor
    states, exactly one source: ``turn_state_ids`` (int64 values, one per turn: flat, or
    one sequence per trajectory), or ``token_ids`` (one per token, aligned with ``mask``)
    read per ``anchor``: ``"observation"`` (default) the tokens since the previous turn's
    last policy token (the prompt for the first turn), ``"prefix"`` every token before the
    turn; turns are one state when those tokens are equal (a hash finds candidates, the
    tokens decide). Neither given raises :class:`mpo_rs.InvalidBatchError` naming both;
    both, or ``anchor="prefix"`` beside ``turn_state_ids``, :class:`mpo_rs.InvalidOptionError`.

    ``estimator`` is ``"gigpo"`` (default) or an ``Estimator("gigpo", ...)``; ``options``
    override its options (defaults, verl-agent's: gamma=0.95, step_weight=1,
    norm_std=False, eps=1e-6 (given only with norm_std=True), anchor="observation").
    :func:`mpo_rs.advantages` with
    ``estimator="gigpo"``, typed.
    """
    est = of_family(estimator, options, "gigpo", "gigpo_advantages")
    raw = _estimate(
        est,
        mask,
        offsets,
        rewards=rewards,
        scores=scores,
        turn_rewards=turn_rewards,
        group_ids=group_ids,
        turn_state_ids=turn_state_ids,
        token_ids=token_ids,
    )
    return GiGPOResult(raw.advantages, raw.per_trajectory, raw.step_advantages, raw.step_groups, Turns(*raw.turns))
