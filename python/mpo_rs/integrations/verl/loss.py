"""The ``mpo`` and ``mpo_geo_mean`` policy-loss modes: the clipped surrogate of
:mod:`mpo_rs.torch.losses` with MPO's turn ratio, reduced by verl's ``agg_loss``."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as verl_F

from ...exceptions import InvalidRolloutError
from ...torch import losses
from .config import InvalidConfigError, config_get

# verl leaves masked_mean(values, mask) unannotated; bound once with its types so the calls are checked.
_masked_mean: Callable[[Tensor, Tensor], Tensor] = verl_F.masked_mean

__all__ = ["compute_policy_loss_mpo", "compute_policy_loss_mpo_geo_mean"]


def _real(config: Any, key: str, default: float) -> float:
    """The actor config's number ``key`` (``default`` when absent or null). A string is
    refused, as every key of the plug-in's config: nothing converts a YAML spelling."""
    value = config_get(config, key, None)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidConfigError(
            f"`actor_rollout_ref.actor.{key}` must be a number, got {type(value).__name__} {value!r}"
        )
    return float(value)


def _clip_settings(config: Any) -> tuple[float, float, float]:
    if config is None:
        raise InvalidConfigError(
            "the mpo policy loss needs the actor config (clip_ratio, clip_ratio_low/high, "
            "clip_ratio_c, global_batch_info); verl passes it as `config`"
        )
    clip = _real(config, "clip_ratio", 0.2)
    low = _real(config, "clip_ratio_low", clip)
    high = _real(config, "clip_ratio_high", clip)
    dual = _real(config, "clip_ratio_c", 3.0)
    try:
        losses.check_clip_range(low, high, dual, names=("clip_ratio_low", "clip_ratio_high", "clip_ratio_c"))
    except ValueError as e:
        raise InvalidConfigError(str(e)) from None
    return low, high, dual


class _TurnRatioLoss:
    """A policy loss in verl's signature (``loss_mode``): the clipped surrogate with MPO's
    turn ratio ``turn_ratio``, named and documented as users and verl's registry see it."""

    def __init__(self, mode: str, turn_ratio: str, doc: str) -> None:
        self.turn_ratio = turn_ratio
        self.__name__ = self.__qualname__ = f"compute_policy_loss_{mode}"
        self.__doc__ = doc

    def __call__(
        self,
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        low, high, dual = _clip_settings(config)
        if log_prob.dim() != 2:
            raise InvalidRolloutError(
                f"`log_prob` must be padded (batch, response_length), got shape {tuple(log_prob.shape)}"
            )
        mask = response_mask.to(device=log_prob.device) != 0
        # Turns are the runs of LLM tokens in each row, rebuilt on the device from the mask.
        rho = losses.importance_ratio(log_prob, old_log_prob, mask, ratio="turn", turn_ratio=self.turn_ratio)
        adv = torch.where(mask, advantages.to(device=rho.device, dtype=rho.dtype), 0.0)

        # verl's dual-clip PPO surrogate (compute_policy_loss_vanilla) with the turn ratio.
        surrogate = losses.clipped_surrogate(rho, adv, low, high, dual)
        per_token = surrogate.per_token
        if rollout_is_weights is not None:
            per_token = per_token * rollout_is_weights.to(device=per_token.device, dtype=per_token.dtype)
        batch_info = config_get(config, "global_batch_info", None) or {}
        loss = core_algos.agg_loss(loss_mat=per_token, loss_mask=mask, loss_agg_mode=loss_agg_mode, **dict(batch_info))

        with torch.no_grad():
            log_ratio = torch.where(mask, (log_prob.detach() - old_log_prob.to(log_prob.device)).float(), 0.0)
            rho_d = rho.detach()
            policy = mask.float()
            has_tokens = bool(policy.sum() > 0)
            assert surrogate.dual_active is not None  # verl's loss always has the dual clip
            metrics: dict[str, Any] = {
                "actor/pg_clipfrac": _masked_mean((surrogate.clipped > surrogate.unclipped).float(), policy).item(),
                "actor/ppo_kl": _masked_mean(-log_ratio.clamp(-20.0, 20.0), policy).item(),
                "actor/pg_clipfrac_lower": _masked_mean(surrogate.dual_active.float(), policy).item(),
                "actor/mpo_turn_ratio_mean": _masked_mean(rho_d, policy).item() if has_tokens else float("nan"),
                "actor/mpo_turn_ratio_max": rho_d[mask].max().item() if has_tokens else float("nan"),
            }
            # Per-turn ratios before the clamp and the clip, both forms (one host read for all).
            stats = losses.turn_ratio_statistics(log_prob, old_log_prob, mask, clip_low=low, clip_high=high)
            values = torch.stack([v.float() for v in stats.values()]).tolist()
            metrics.update({f"actor/{name}": value for name, value in zip(stats, values, strict=True)})
        return loss, metrics


compute_policy_loss_mpo = _TurnRatioLoss(
    "mpo",
    "product",
    """``loss_mode=mpo``: the clipped surrogate with MPO's turn importance ratio.

    Each turn's ratio rho_t = exp(sum of its tokens' log-ratios) is the forward value on
    every token of the turn, while each token keeps its own gradient
    (rho~ = sg[rho_t] * pi / sg[pi]), so MAE's centred token credit survives. Clip range
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]``, dual clip ``clip_ratio_c`` for negative
    advantages, ``rollout_is_weights`` multiplied in, reduced by verl's ``agg_loss`` with
    ``loss_agg_mode`` and the actor's ``global_batch_info``. Metrics as verl's ``vanilla``
    plus the turn-ratio mean and max and ``actor/turn_ratio_*``, the per-turn statistics of
    :func:`mpo_rs.torch.losses.turn_ratio_statistics`.
    """,
)

compute_policy_loss_mpo_geo_mean = _TurnRatioLoss(
    "mpo_geo_mean",
    "geo_mean",
    """``loss_mode=mpo_geo_mean``: as ``mpo`` with the turn ratio's geometric mean
    rho_t = exp(mean of the turn's token log-ratios), which does not grow with turn length.""",
)
