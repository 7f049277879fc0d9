"""The plug-in's advantage estimators, on verl's padded ``(B, L)`` tensors through
:mod:`mpo_rs.torch` (one trajectory per row; ``response_mask`` 1 on LLM tokens, 0 on tool
/ observation tokens and padding)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor

from ... import estimators
from ...exceptions import InvalidBatchError
from ...torch import critic_free, padded
from .config import EstimatorOptions, estimator_options
from .values_hook import critic_values

__all__ = [
    "compute_gae_advantage_return",
    "compute_mpo_bilevel_gae_advantage",
    "compute_mpo_gae_advantage",
    "compute_mpo_grpo_advantage",
    "compute_mpo_mae_advantage",
    "compute_mpo_mae_grpo_advantage",
    "compute_mpo_mae_rloo_advantage",
    "compute_mpo_rloo_advantage",
]


def _with_critic(
    name: str,
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any,
    values: Tensor | None,
    observation_rewards: str,
) -> tuple[Tensor, Tensor]:
    """A critic estimator of the plug-in: the critic's values, the options of ``config``
    resolved once, one call of :func:`mpo_rs.torch.padded.advantages`."""
    values = critic_values(values, name)
    options = estimator_options(name, config)
    advantages, returns = padded.advantages(
        response_mask,
        token_level_rewards,
        values=values,
        observation_rewards=observation_rewards,
        whiten=options.whiten,
        estimator=options.estimator,
    )
    assert returns is not None  # a critic estimator's
    return advantages, returns


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
    # lam_critic = lam (the config's): verl's returns = advantages + values.
    return _with_critic("mpo_gae", token_level_rewards, response_mask, config, values, observation_rewards="drop")


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
    return _with_critic("mpo_mae", token_level_rewards, response_mask, config, values, observation_rewards="credit")


def compute_mpo_bilevel_gae_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any = None,
    index: Any = None,
    values: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """``mpo_bilevel_gae``: RAGEN's bi-level GAE with the critic's values, turns from the
    mask (``algorithm.gamma``, ``algorithm.lam``, ``algorithm.high_level_gamma``;
    advantages whitened unless ``algorithm.mpo.whiten=false``, as RAGEN whitens them;
    returns = unwhitened advantages + values). A reward on an observation token is credited
    to the LLM token before it (the end of the turn it answers).
    """
    return _with_critic(
        "mpo_bilevel_gae", token_level_rewards, response_mask, config, values, observation_rewards="credit"
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
        raise InvalidBatchError(f"`response_mask` must be a torch.Tensor, got {type(response_mask).__name__}")
    return int(response_mask.shape[0]) if response_mask.dim() > 0 else 0


# How a critic-free estimator of the plug-in computes its (B, L) advantages from its
# options, the rewards, the mask and the rows' dense group ids.
_Grouped = Callable[[EstimatorOptions, Tensor, Tensor, np.ndarray], Tensor]


def _with_groups(name: str, advantages: _Grouped) -> Callable[..., tuple[Tensor, Tensor]]:
    """A critic-free estimator in verl's signature: the options of ``config`` resolved once,
    the group ids read from ``index``; its advantages are its returns too (as verl's)."""

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = estimator_options(name, config)
        out = advantages(options, token_level_rewards, response_mask, _group_ids(index, _rows(response_mask), name))
        return out, out

    return estimator


def _group_baseline(options: EstimatorOptions, rewards: Tensor, mask: Tensor, ids: np.ndarray) -> Tensor:
    out, _ = padded.advantages(mask, rewards, group_ids=ids, whiten=options.whiten, estimator=options.estimator)
    return out


def _mae_over_group_baseline(options: EstimatorOptions, rewards: Tensor, mask: Tensor, ids: np.ndarray) -> Tensor:
    group = options.group
    assert group is not None
    batch = padded.PaddedBatch.of(mask, like=rewards)
    baseline, row_scale = critic_free.row_baselines(batch.row_scores(rewards), ids, group)
    advantages = critic_free.mae_over_baselines(
        batch, baseline, row_scale, options.estimator, rewards=batch.policy_rewards(rewards, "credit")
    )
    return batch.padded(batch.whitened(advantages) if options.whiten else advantages)


_grpo = _with_groups("mpo_grpo", _group_baseline)
_rloo = _with_groups("mpo_rloo", _group_baseline)


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


_mae_grpo = _with_groups("mpo_mae_grpo", _mae_over_group_baseline)
_mae_rloo = _with_groups("mpo_mae_rloo", _mae_over_group_baseline)


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
    config = {"gamma": gamma, "lam": lam}  # judged by the options table, as from verl's config
    return compute_mpo_gae_advantage(token_level_rewards, response_mask, config, values=values)
