"""Critic-free MAE on padded ``(B, L)`` tensors (needs torch): MAE with each row's group
baseline as a constant value. :func:`mae_group_advantages` is the padded API's form; the
trainer integrations (verl's ``mpo_mae_grpo`` / ``mpo_mae_rloo``, TRL, OpenRLHF) use its two
steps, :func:`row_baselines` and :func:`mae_over_baselines`.

MAE is linear in (rewards, values): a constant value b per row makes the last turn's
residual R_T - b, so with ``lam=1``, ``beta=0`` every token gets score - b (GRPO / RLOO), and
``lam < 1`` decays the credit once per interaction back from the end. The baseline, the
scale 1/(std + eps) (or 1) and whether a row is alone in its group come from the Rust core's
``group_baselines``: the sums ``group_advantages`` runs, in float64 and trajectory order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from .. import _native, estimators
from .. import observation_rewards as _observation
from ..exceptions import InvalidBatchError
from ..options import Estimator, resolve_family
from .padded import PaddedBatch, _host_scores

__all__ = ["mae_group_advantages", "mae_over_baselines", "row_baselines"]


def row_baselines(scores: Any, ids: np.ndarray, group: Estimator) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the value baseline (group mean, or leave-one-out mean; float32) and the scale
    of its advantages (1 / (std + eps), or 1; 0 for a row alone in its group, which has no
    baseline). ``ids`` are dense group codes (``estimators.group_codes``); ``group`` is a
    group-family estimator (``grpo``, ``drgrpo``, ``rloo``)."""
    s = np.ascontiguousarray(scores, dtype=np.float32)
    # The group estimator refuses scores whose advantages overflow float32.
    estimators.group_advantages(s, ids, estimator=group)
    n_groups = int(ids.max()) + 1 if ids.shape[0] else 0
    baseline, scale, alone = _native.group_baselines(s, np.ascontiguousarray(ids, dtype=np.int64), n_groups, group)
    return baseline.astype(np.float32), np.where(alone, 0.0, scale).astype(np.float32)


def mae_over_baselines(
    batch: PaddedBatch, baseline: np.ndarray, row_scale: np.ndarray, estimator: Estimator, **source: Any
) -> np.ndarray:
    """Flat MAE advantages of ``batch`` with every token of row j valued ``baseline[j]``,
    scaled by ``row_scale[j]`` (:func:`row_baselines`). ``source`` is the reward:
    ``rewards=`` (flat, per token) or ``scores=`` (one per row, on its last policy token),
    as :func:`mpo_rs.estimators.mae_advantages` takes them; ``estimator`` a ``mae`` estimator."""
    rows, cols = batch.shape
    values = np.repeat(baseline.astype(np.float32), cols)
    result = estimators.mae_advantages(values, batch.mask_u8, batch.offsets, estimator=estimator, **source)
    out: np.ndarray = (result.advantages.reshape(rows, cols) * row_scale.astype(np.float32)[:, None]).reshape(-1)
    return out


def mae_group_advantages(
    response_mask: Tensor,
    group_ids: Any,
    token_level_rewards: Tensor | None = None,
    *,
    scores: Any = None,
    baseline: str | Estimator = "grpo",
    estimator: str | Estimator = "mae",
    observation_rewards: str = _observation.DEFAULT,
    whiten: bool = False,
) -> Tensor:
    """Critic-free MAE over ``(B, L)`` rows: every token of row j is valued at its group's
    baseline (``baseline``: ``"grpo"`` the group mean with advantages scaled by
    1/(std + eps), ``"drgrpo"`` the mean unscaled, ``"rloo"`` the mean of the other rows, or
    an ``mpo_rs.Estimator`` of that family), then MAE (``estimator``, a ``mae`` name or
    ``Estimator``) credits the turns, the runs of ones of ``response_mask``. With ``lam=1``,
    ``beta=0`` and an outcome reward this is GRPO / RLOO. A row alone in its group gets 0.

    Rewards, ``observation_rewards`` and ``whiten`` as :func:`mpo_rs.torch.mae_advantages`;
    a row's score for its baseline is ``scores[j]`` or the sum of its token rewards.
    ``group_ids``: one per row (ints, strings, objects). Returns the ``(B, L)`` advantages.
    """
    group = resolve_family(baseline, "group", "`baseline`")
    mae = resolve_family(estimator, "mae", "`estimator`")
    _observation.check(observation_rewards)  # refused with `scores` too, where it has no effect
    estimators.one_reward_source(token_level_rewards=token_level_rewards, scores=scores)
    if group_ids is None:
        raise InvalidBatchError("`group_ids` is missing: give one group id per row")
    if token_level_rewards is not None:
        batch = PaddedBatch.of(response_mask, like=token_level_rewards, like_name="token_level_rewards")
        row_scores = batch.row_scores(token_level_rewards)
        source: dict[str, Any] = {"rewards": batch.policy_rewards(token_level_rewards, observation_rewards)}
    else:
        batch = PaddedBatch.of(response_mask)
        row_scores = _host_scores(scores, batch.shape[0])
        source = {"scores": row_scores}
    ids, _ = estimators.group_codes(group_ids)
    if ids.shape[0] != batch.shape[0]:
        raise InvalidBatchError(f"`group_ids` has {ids.shape[0]} ids, expected {batch.shape[0]} (one per row)")
    base, scale = row_baselines(row_scores, ids, group)
    advantages = mae_over_baselines(batch, base, scale, mae, **source)
    return batch.padded(batch.whitened(advantages) if whiten else advantages)
