"""The plug-in's advantage estimators, on verl's padded ``(B, L)`` tensors through
:mod:`mpo_rs.torch` (one trajectory per row; ``response_mask`` 1 on LLM tokens, 0 on tool
/ observation tokens and padding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor

from ... import _native, estimators
from ...exceptions import InvalidBatchError
from ...options import Estimator
from ...torch import padded
from .config import MPOOptions, config_get, discount
from .values_hook import critic_values

__all__ = [
    "compute_gae_advantage_return",
    "compute_mpo_gae_advantage",
    "compute_mpo_grpo_advantage",
    "compute_mpo_mae_advantage",
    "compute_mpo_mae_grpo_advantage",
    "compute_mpo_mae_rloo_advantage",
    "compute_mpo_rloo_advantage",
]


def compute_mpo_gae_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any = None,
    index: Any = None,
    values: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """``mpo_gae``: token GAE over the LLM tokens of each row, observation tokens skipped,
    as verl's ``compute_gae_advantage_return`` (``algorithm.gamma``, ``algorithm.lam``;
    returns = unwhitened advantages + values; advantages whitened unless
    ``algorithm.mpo.whiten=false``). Rewards on observation tokens are ignored, as verl's
    loop ignores them. Advantages and returns are 0 off the LLM tokens.
    """
    values = critic_values(values, "mpo_gae")
    options = MPOOptions.from_config(config)
    lam = float(config_get(config, "lam", 1.0))
    return padded.gae_advantages(
        values,
        response_mask,
        token_level_rewards,
        observation_rewards="drop",
        whiten=options.whiten is None or options.whiten,
        gamma=discount(config),
        lam=lam,
        lam_critic=lam,  # verl's returns = advantages + values
    )


def compute_mpo_mae_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any = None,
    index: Any = None,
    values: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """``mpo_mae``: multiscale advantage estimation with the critic's values.

    A turn is a run of LLM tokens in a row. Options from ``algorithm.mpo`` (:class:`MPOOptions`)
    and ``algorithm.gamma`` (discount per interaction). A reward on an observation token is
    credited to the LLM token before it. Returns are the critic's targets (``lam_critic``).
    """
    values = critic_values(values, "mpo_mae")
    options = MPOOptions.from_config(config)
    return padded.mae_advantages(
        values,
        response_mask,
        token_level_rewards,
        observation_rewards="credit",
        whiten=bool(options.whiten),
        lam=float(options.lam),
        lam_intra=float(options.lam_intra),
        beta=float(options.beta),
        gamma=discount(config),
        lam_critic=float(options.lam_critic),
    )


def _group_ids(index: Any, rows: int, estimator: str) -> np.ndarray:
    if index is None:
        raise InvalidBatchError(
            f"advantage estimator {estimator!r} needs the group ids verl passes as `index` "
            "(non_tensor_batch['uid']), one per row"
        )
    # Dense codes by the group-id rule of `group_advantages` (estimators.group_codes).
    codes, _ = estimators.group_codes(index)
    if codes.shape[0] != rows:
        raise InvalidBatchError(f"`index` has {codes.shape[0]} group ids, expected {rows} (one per row)")
    return codes


def _rows(response_mask: Tensor) -> int:
    if not isinstance(response_mask, Tensor):
        raise TypeError(f"`response_mask` must be a torch.Tensor, got {type(response_mask).__name__}")
    return int(response_mask.shape[0]) if response_mask.dim() > 0 else 0


def _group_advantage_estimator(leave_one_out: bool, name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = MPOOptions.from_config(config)
        norm_std = bool(config_get(config, "norm_adv_by_std_in_grpo", True))
        # eps only where the formula divides by the std (Rust refuses an eps it would ignore).
        divides = norm_std and not leave_one_out
        out = padded.group_advantages(
            token_level_rewards,
            response_mask,
            _group_ids(index, _rows(response_mask), name),
            whiten=bool(options.whiten),
            norm_std=norm_std,
            eps=float(options.eps) if divides else None,
            leave_one_out=leave_one_out,
        )
        return out, out

    return estimator


_grpo = _group_advantage_estimator(False, "mpo_grpo")
_rloo = _group_advantage_estimator(True, "mpo_rloo")


def compute_mpo_grpo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_grpo``: (score - group mean) / (group std + eps), or Dr. GRPO's score - group mean
    with ``algorithm.norm_adv_by_std_in_grpo=false``; broadcast to the row's LLM tokens.
    A group of one gets 0 (verl's ``grpo`` gives it its raw score)."""
    return _grpo(token_level_rewards, response_mask, config, index, **kwargs)


def compute_mpo_rloo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_rloo``: score - mean of the other rollouts of the group, as verl's ``rloo``.
    A group of one gets 0 (verl's ``rloo`` gives it its raw score)."""
    return _rloo(token_level_rewards, response_mask, config, index, **kwargs)


def _group_baselines(
    scores: np.ndarray, ids: np.ndarray, estimator: Estimator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the value baseline (group mean, or leave-one-out mean), the advantage
    scale (1 / (std + eps), or 1) and whether the row is alone in its group (then it has no
    baseline and gets advantage 0): the statistics of ``estimators.group_advantages``, in
    float64, from the Rust core. ``ids`` are dense group codes."""
    n_groups = int(ids.max()) + 1 if ids.shape[0] else 0
    s = np.ascontiguousarray(scores, dtype=np.float32)
    return _native.group_baselines(s, np.ascontiguousarray(ids, dtype=np.int64), n_groups, estimator)


def _mae_with_group_baseline(leave_one_out: bool, name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = MPOOptions.from_config(config)
        batch = padded.PaddedBatch.of(response_mask, like=token_level_rewards)
        rows, cols = batch.shape
        ids = _group_ids(index, rows, name)
        norm_std = bool(config_get(config, "norm_adv_by_std_in_grpo", True)) and not leave_one_out
        scores = batch.row_scores(token_level_rewards)
        # eps only where the formula divides by the std (Rust refuses an eps it would ignore).
        eps = {"eps": float(options.eps)} if norm_std and not leave_one_out else {}
        group = Estimator("grpo", norm_std=norm_std, leave_one_out=leave_one_out, **eps)
        # The group estimator refuses scores whose advantages overflow float32.
        estimators.group_advantages(scores, ids, estimator=group)
        baseline, scale, alone = _group_baselines(scores, ids, group)
        # MAE is linear in (rewards, values): a constant value b per row makes the last
        # turn's residual R_T - b, so with lam=1, beta=0 every token gets score - b (GRPO /
        # RLOO), and lam < 1 decays the credit once per interaction back from the end.
        values = np.repeat(baseline.astype(np.float32), cols)
        result = estimators.mae_advantages(
            values,
            batch.mask_u8,
            batch.offsets,
            rewards=batch.policy_rewards(token_level_rewards, "credit"),
            lam=float(options.lam),
            lam_intra=float(options.lam_intra),
            beta=float(options.beta),
            gamma=discount(config),
        )
        row_scale = np.where(alone, 0.0, scale).astype(np.float32)
        advantages = (result.advantages.reshape(rows, cols) * row_scale[:, None]).reshape(-1)
        if options.whiten:
            advantages = batch.whitened(advantages)
        out = batch.padded(advantages)
        return out, out

    return estimator


_mae_grpo = _mae_with_group_baseline(False, "mpo_mae_grpo")
_mae_rloo = _mae_with_group_baseline(True, "mpo_mae_rloo")


def compute_mpo_mae_grpo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_mae_grpo``: critic-free MAE. The value of every token of a row is its group's
    mean score; advantages are divided by (group std + eps) unless
    ``algorithm.norm_adv_by_std_in_grpo=false``. With ``algorithm.mpo.lam=1`` and
    ``beta=0`` (and an outcome reward) this is GRPO. A group of one gets 0."""
    return _mae_grpo(token_level_rewards, response_mask, config, index, **kwargs)


def compute_mpo_mae_rloo_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, index: Any = None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """``mpo_mae_rloo``: critic-free MAE with each row's value the mean score of the other
    rollouts of its group. With ``lam=1``, ``beta=0`` this is RLOO. A group of one gets 0."""
    return _mae_rloo(token_level_rewards, response_mask, config, index, **kwargs)


def compute_gae_advantage_return(
    token_level_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Same signature and results (on LLM tokens) as verl's
    ``core_algos.compute_gae_advantage_return``, computed by ``mpo_gae``: a replacement for
    code that calls verl's function directly."""
    config = {"gamma": float(gamma), "lam": float(lam)}
    return compute_mpo_gae_advantage(token_level_rewards, response_mask, config, values=values)
