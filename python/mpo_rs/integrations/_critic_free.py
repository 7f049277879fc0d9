"""Critic-free MAE, shared by the trainer integrations (verl's ``mpo_mae_grpo`` /
``mpo_mae_rloo``, TRL, OpenRLHF): MAE with each row's group baseline as a constant value.

MAE is linear in (rewards, values): a constant value b per row makes the last turn's
residual R_T - b, so with ``lam=1``, ``beta=0`` every token gets score - b (GRPO / RLOO), and
``lam < 1`` decays the credit once per interaction back from the end. The baseline, the
scale 1/(std + eps) (or 1) and whether a row is alone in its group come from the Rust core's
``group_baselines``: the sums ``group_advantages`` runs, in float64 and trajectory order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _native, estimators
from ..options import Estimator
from ..torch.padded import PaddedBatch

__all__ = ["mae_over_baselines", "row_baselines"]


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
