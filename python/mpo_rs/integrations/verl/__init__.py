"""verl plug-in: the Rust estimators and the turn-ratio MPO loss in verl's registries.

Importing this module (verl does, in every process, through the ``verl.plugins`` entry
point that ``mpo-rs`` declares) registers

advantage estimators (``algorithm.adv_estimator=...``), all on verl's padded ``(B, L)``
tensors, one trajectory per row, ``response_mask`` 1 on LLM tokens and 0 on tool /
observation tokens and padding:

=================  =========  ============================================================
name               critic     what
=================  =========  ============================================================
``mpo_gae``        yes        token GAE equal to verl's ``gae`` (whitened like it unless
                              ``algorithm.mpo.whiten=false``), computed in Rust
``mpo_mae``        yes        multiscale advantage estimation (the MPO estimator)
``mpo_grpo``       no         GRPO / Dr. GRPO (``algorithm.norm_adv_by_std_in_grpo``)
``mpo_rloo``       no         RLOO (leave-one-out mean)
``mpo_mae_grpo``   no         MAE with the group mean as a constant value baseline, scaled
                              by 1/(group std + eps) like GRPO
``mpo_mae_rloo``   no         MAE with the leave-one-out mean as the value baseline
=================  =========  ============================================================

and policy-loss modes (``actor_rollout_ref.actor.policy_loss.loss_mode=...``) ``mpo``
(turn ratio = product of the turn's token ratios) and ``mpo_geo_mean`` (its geometric
mean), reduced through verl's ``agg_loss`` with the actor's ``loss_agg_mode``, clip
ratios and dual-clip constant.

verl calls registered estimators without ``values``. The critic estimators get them
through a wrapper around verl's ``compute_advantage`` (:func:`install_values_hook`),
installed on import unless ``MPO_RS_VERL_VALUES_HOOK=0``; the critic itself runs only with
``critic.enable=True``. The same hook makes verl's v1 trainer group multi-output sessions
for ``mpo_grpo`` as it does for ``grpo`` (:data:`SESSION_GROUPED_ESTIMATORS`). Estimator
options beyond ``algorithm.gamma`` / ``algorithm.lam`` live under ``algorithm.mpo`` (see
:class:`MPOOptions`). Details: ``docs/integrations.md``.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

import numpy as np

from .._deps import missing

try:
    import torch
    from torch import Tensor
    from verl.trainer.ppo import core_algos
    from verl.utils import torch_functional as verl_F
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.integrations.verl", "verl", _e) from None

from .. import losses as mpo_losses
from .._native import InvalidBatchError
from ..estimators import broadcast_to_tokens, gae_advantages, group_advantages, group_codes, mae_advantages

__all__ = [
    "CRITIC_ESTIMATORS",
    "ESTIMATORS",
    "LOSS_MODES",
    "VALUES_HOOK_ENV",
    "InvalidConfigError",
    "MPOOptions",
    "MissingCriticValuesError",
    "SESSION_GROUPED_ESTIMATORS",
    "compute_gae_advantage_return",
    "compute_mpo_gae_advantage",
    "compute_mpo_grpo_advantage",
    "compute_mpo_mae_advantage",
    "compute_mpo_mae_grpo_advantage",
    "compute_mpo_mae_rloo_advantage",
    "compute_mpo_rloo_advantage",
    "compute_policy_loss_mpo",
    "compute_policy_loss_mpo_geo_mean",
    "install_values_hook",
    "register",
]

CRITIC_ESTIMATORS = ("mpo_gae", "mpo_mae")
CRITIC_FREE_ESTIMATORS = ("mpo_grpo", "mpo_rloo", "mpo_mae_grpo", "mpo_mae_rloo")
ESTIMATORS = CRITIC_ESTIMATORS + CRITIC_FREE_ESTIMATORS
LOSS_MODES = ("mpo", "mpo_geo_mean")
VALUES_HOOK_ENV = "MPO_RS_VERL_VALUES_HOOK"

_RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
_V1_UTILS = "verl.trainer.ppo.v1.utils"

# Plug-in estimator -> the verl estimator whose multi-output session grouping it gets in the
# v1 trainer. verl 0.9.1's compute_advantage_for_multi_trajectories groups `{uid}_{session}`
# outputs only for "grpo": it scores each session by its final output and gives that row's
# advantage to every output of the session, which is right only for one advantage per row.
SESSION_GROUPED_ESTIMATORS = {"mpo_grpo": "grpo"}


class MissingCriticValuesError(ValueError):
    """A critic estimator was called without critic values."""


class InvalidConfigError(ValueError):
    """An ``algorithm.mpo`` option is unknown or out of range, or a config is missing."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class MPOOptions:
    """Options read from ``algorithm.mpo`` (all optional). ``algorithm.gamma`` is the
    discount of every estimator; ``algorithm.lam`` is ``mpo_gae``'s token lambda, as for
    verl's ``gae``."""

    lam: float = 0.8
    """MAE: turn-scale lambda (credit decays once per interaction)."""
    lam_intra: float = 0.95
    """MAE: token lambda inside a turn."""
    beta: float = 1.0
    """MAE: weight of the centred intra-turn refinement (0 = one advantage per turn)."""
    lam_critic: float = 1.0
    """MAE: lambda of the critic's value targets (1 = discounted Monte-Carlo return)."""
    eps: float = 1e-6
    """Group estimators: added to the group std before dividing."""
    whiten: bool | None = None
    """Whiten advantages over the batch's LLM tokens (verl's ``masked_whiten`` formula).
    None = the estimator's default: on for ``mpo_gae`` (as verl's ``gae``), off otherwise."""

    @classmethod
    def from_config(cls, config: Any) -> MPOOptions:
        section = _config_get(config, "mpo", None)
        if section is None:
            return cls()
        try:
            given = dict(section.items())
        except AttributeError:
            raise InvalidConfigError(
                f"`algorithm.mpo` must be a mapping of options, got {type(section).__name__}"
            ) from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise InvalidConfigError(
                f"unknown `algorithm.mpo` option(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
            )
        options = cls(**given)
        for name in ("lam", "lam_intra", "beta", "lam_critic", "eps"):
            value = getattr(options, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidConfigError(f"`algorithm.mpo.{name}` must be a number, got {value!r}")
        if options.whiten is not None and not isinstance(options.whiten, bool):
            raise InvalidConfigError(f"`algorithm.mpo.whiten` must be true, false or null, got {options.whiten!r}")
        for name in ("lam", "lam_intra", "lam_critic"):
            value = getattr(options, name)
            if not 0.0 <= float(value) <= 1.0:
                raise InvalidConfigError(f"`algorithm.mpo.{name}` must be in [0, 1], got {value}")
        if not float(options.beta) >= 0.0:
            raise InvalidConfigError(f"`algorithm.mpo.beta` must be >= 0, got {options.beta}")
        if not float(options.eps) >= 0.0:
            raise InvalidConfigError(f"`algorithm.mpo.eps` must be >= 0, got {options.eps}")
        return options


def _config_get(config: Any, key: str, default: Any) -> Any:
    """``config[key]`` for an OmegaConf DictConfig, a verl dataclass config or a dict."""
    if config is None:
        return default
    get = getattr(config, "get", None)
    if callable(get):
        return get(key, default)
    return getattr(config, key, default)


def _gamma(config: Any) -> float:
    return float(_config_get(config, "gamma", 1.0))


# --------------------------------------------------------------------------- padded batches


@dataclass(frozen=True)
class _PaddedBatch:
    """verl's padded ``(B, L)`` batch viewed as the flat ragged batch the Rust core reads:
    row j is trajectory j, tokens ``j*L:(j+1)*L``. Per-token work stays in numpy on flat
    arrays (no copy of float32 CPU tensors) until the results go back as tensors."""

    shape: tuple[int, int]
    device: torch.device
    dtype: torch.dtype
    policy: np.ndarray  # bool (B*L,): the LLM tokens
    offsets: np.ndarray  # int64 (B+1,)

    @classmethod
    def of(cls, token_level_rewards: Tensor, response_mask: Tensor) -> _PaddedBatch:
        for name, t in (("token_level_rewards", token_level_rewards), ("response_mask", response_mask)):
            if not isinstance(t, Tensor):
                raise TypeError(f"`{name}` must be a torch.Tensor, got {type(t).__name__}")
        if token_level_rewards.dim() != 2:
            raise ValueError(
                f"`token_level_rewards` must be padded (batch, response_length), got shape "
                f"{tuple(token_level_rewards.shape)}"
            )
        if response_mask.shape != token_level_rewards.shape:
            raise ValueError(
                f"`response_mask` has shape {tuple(response_mask.shape)}, expected "
                f"{tuple(token_level_rewards.shape)} like `token_level_rewards`"
            )
        rows, cols = token_level_rewards.shape
        mask = response_mask.detach().cpu().reshape(-1)
        if mask.dtype == torch.bool:
            policy = mask.numpy()  # read only
        elif mask.dtype in (torch.bfloat16, torch.float16):  # no numpy view of these
            policy = (mask != 0).numpy()
        else:
            policy = mask.numpy() != 0  # numpy: one pass, no torch dispatch
        return cls(
            shape=(rows, cols),
            device=token_level_rewards.device,
            dtype=token_level_rewards.dtype if token_level_rewards.dtype.is_floating_point else torch.float32,
            policy=policy,
            offsets=np.arange(rows + 1, dtype=np.int64) * cols,
        )

    @property
    def mask_u8(self) -> np.ndarray:
        return self.policy.view(np.uint8)

    def flat(self, x: Tensor, name: str) -> np.ndarray:
        """A float32 host view (or copy, if it must) of a ``(B, L)`` tensor, flattened."""
        if not isinstance(x, Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != self.shape:
            raise ValueError(f"`{name}` has shape {tuple(x.shape)}, expected {self.shape}")
        return x.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1).numpy()

    def padded(self, flat: np.ndarray) -> Tensor:
        """A flat per-token result as a ``(B, L)`` tensor on the caller's device and dtype."""
        return torch.from_numpy(flat).reshape(self.shape).to(device=self.device, dtype=self.dtype)

    def policy_rewards(self, token_level_rewards: Tensor, credit_observations: bool) -> np.ndarray:
        """Flat rewards with every reward on an observation token moved off it.

        ``credit_observations=False`` drops them, as verl's GAE loop does (it never reads a
        reward where the mask is 0). ``True`` credits each to the last LLM token before it
        in its row (the action the tool output answered); one with no LLM token before it
        is dropped.
        """
        rewards = self.flat(token_level_rewards, "token_level_rewards")
        observed = rewards != 0
        observed &= ~self.policy
        if not observed.any():  # the usual case: nothing to move, no copy
            return rewards
        kept = np.where(self.policy, rewards, np.float32(0.0))
        if credit_observations:
            tokens = np.flatnonzero(observed)
            positions = np.arange(self.policy.shape[0])
            last_llm = np.maximum.accumulate(np.where(self.policy, positions, -1))[tokens]
            row_start = tokens - tokens % self.shape[1]
            same_row = last_llm >= row_start
            np.add.at(kept, last_llm[same_row], rewards[tokens[same_row]])
        return kept


def _whiten(advantages: np.ndarray, policy: np.ndarray) -> np.ndarray:
    """verl's ``masked_whiten`` over the LLM tokens: (A - mean) / sqrt(var + 1e-8) with the
    unbiased variance; everything else stays 0. The statistics are taken in float64 over
    the LLM tokens only, which is verl's formula without its 10 passes over the padding."""
    selected = advantages[policy]
    n = selected.shape[0]
    if n < 2:
        raise InvalidBatchError(f"whitening needs at least 2 LLM tokens in the batch, got {n}")
    mean = selected.mean(dtype=np.float64)
    centred = selected - mean
    var = float(np.dot(centred, centred)) / (n - 1)
    out = np.zeros_like(advantages)
    out[policy] = (centred / np.sqrt(var + 1e-8)).astype(np.float32)
    return out


# --------------------------------------------------------------------------- critic values

# Set by the compute_advantage wrapper for the duration of one call (see install_values_hook).
_CRITIC_VALUES: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "mpo_rs_verl_critic_values", default=None
)


# Set by the compute_advantage_for_multi_trajectories wrapper to the plug-in estimator that
# verl's session grouping, run for the mirrored name, must call instead (see install_values_hook).
_SESSION_ESTIMATOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpo_rs_verl_session_estimator", default=None
)


def _critic_values(values: Tensor | None, estimator: str) -> Tensor:
    if values is not None:
        return values
    hooked = _CRITIC_VALUES.get()
    if hooked is not None:
        return hooked
    raise MissingCriticValuesError(
        f"advantage estimator {estimator!r} needs critic values, and verl passes `values` only "
        "to its own 'gae'. Set `critic.enable=True` (verl runs the critic by default only for "
        "adv_estimator=gae) and keep the mpo_rs values hook installed: it is installed when verl "
        f"loads the mpo_rs plug-in unless {VALUES_HOOK_ENV}=0, or call "
        "mpo_rs.integrations.verl.install_values_hook(). When calling the estimator directly, "
        "pass values=<(batch, response_length) tensor>."
    )


# --------------------------------------------------------------------------- estimators


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
    values = _critic_values(values, "mpo_gae")
    options = MPOOptions.from_config(config)
    batch = _PaddedBatch.of(token_level_rewards, response_mask)
    lam = float(_config_get(config, "lam", 1.0))
    result = gae_advantages(
        batch.flat(values, "values"),
        batch.mask_u8,
        batch.offsets,
        rewards=batch.policy_rewards(token_level_rewards, credit_observations=False),
        gamma=_gamma(config),
        lam=lam,
        lam_critic=lam,  # verl's returns = advantages + values
    )
    advantages = result.advantages
    if options.whiten is None or options.whiten:
        advantages = _whiten(advantages, batch.policy)
    return batch.padded(advantages), batch.padded(result.returns)


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
    values = _critic_values(values, "mpo_mae")
    options = MPOOptions.from_config(config)
    batch = _PaddedBatch.of(token_level_rewards, response_mask)
    result = mae_advantages(
        batch.flat(values, "values"),
        batch.mask_u8,
        batch.offsets,
        rewards=batch.policy_rewards(token_level_rewards, credit_observations=True),
        lam=float(options.lam),
        lam_intra=float(options.lam_intra),
        beta=float(options.beta),
        gamma=_gamma(config),
        lam_critic=float(options.lam_critic),
    )
    advantages = result.advantages
    if options.whiten:
        advantages = _whiten(advantages, batch.policy)
    return batch.padded(advantages), batch.padded(result.returns)


def _group_ids(index: Any, rows: int, estimator: str) -> np.ndarray:
    if index is None:
        raise InvalidBatchError(
            f"advantage estimator {estimator!r} needs the group ids verl passes as `index` "
            "(non_tensor_batch['uid']), one per row"
        )
    # Dense codes by the group-id rule of `group_advantages` (estimators.group_codes).
    codes, _ = group_codes(index)
    if codes.shape[0] != rows:
        raise InvalidBatchError(f"`index` has {codes.shape[0]} group ids, expected {rows} (one per row)")
    return codes


def _outcome_scores(token_level_rewards: Tensor) -> Tensor:
    # As verl's GRPO/RLOO: a row's score is the sum of all its token rewards.
    return token_level_rewards.detach().to(device="cpu", dtype=torch.float32).sum(dim=-1)


def _group_advantage_estimator(leave_one_out: bool, name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = MPOOptions.from_config(config)
        batch = _PaddedBatch.of(token_level_rewards, response_mask)
        per_row = group_advantages(
            _outcome_scores(token_level_rewards).numpy(),
            _group_ids(index, batch.shape[0], name),
            norm_std=bool(_config_get(config, "norm_adv_by_std_in_grpo", True)),
            eps=float(options.eps),
            leave_one_out=leave_one_out,
        )
        advantages = broadcast_to_tokens(per_row, batch.mask_u8, batch.offsets)
        if options.whiten:
            advantages = _whiten(advantages, batch.policy)
        out = batch.padded(advantages)
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
    scores: np.ndarray, ids: np.ndarray, leave_one_out: bool, norm_std: bool, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the value baseline, the advantage scale, and whether the row is alone in
    its group (then it has no baseline and gets advantage 0)."""
    _, inverse = np.unique(ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    s = scores.astype(np.float64)
    count = np.bincount(inverse)
    total = np.bincount(inverse, weights=s)
    n = count[inverse].astype(np.float64)
    alone = n < 2
    others = np.maximum(n - 1, 1)
    if leave_one_out:
        baseline = (total[inverse] - s) / others
        scale = np.ones_like(s)
    else:
        mean = total / count
        baseline = mean[inverse]
        scale = np.ones_like(s)
        if norm_std:
            sq_dev = np.bincount(inverse, weights=(s - baseline) ** 2)
            std = np.sqrt(sq_dev[inverse] / others)
            scale = 1.0 / (std + eps)
    return baseline, scale, alone


def _mae_with_group_baseline(leave_one_out: bool, name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = MPOOptions.from_config(config)
        batch = _PaddedBatch.of(token_level_rewards, response_mask)
        rows, cols = batch.shape
        ids = _group_ids(index, rows, name)
        norm_std = bool(_config_get(config, "norm_adv_by_std_in_grpo", True)) and not leave_one_out
        baseline, scale, alone = _group_baselines(
            _outcome_scores(token_level_rewards).numpy(), ids, leave_one_out, norm_std, float(options.eps)
        )
        # MAE is linear in (rewards, values): a constant value b per row makes the last
        # turn's residual R_T - b, so with lam=1, beta=0 every token gets score - b (GRPO /
        # RLOO), and lam < 1 decays the credit once per interaction back from the end.
        values = np.repeat(baseline.astype(np.float32), cols)
        result = mae_advantages(
            values,
            batch.mask_u8,
            batch.offsets,
            rewards=batch.policy_rewards(token_level_rewards, credit_observations=True),
            lam=float(options.lam),
            lam_intra=float(options.lam_intra),
            beta=float(options.beta),
            gamma=_gamma(config),
        )
        row_scale = np.where(alone, 0.0, scale).astype(np.float32)
        advantages = (result.advantages.reshape(rows, cols) * row_scale[:, None]).reshape(-1)
        if options.whiten:
            advantages = _whiten(advantages, batch.policy)
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


# --------------------------------------------------------------------------- policy loss


def _clip_settings(config: Any) -> tuple[float, float, float]:
    if config is None:
        raise InvalidConfigError(
            "the mpo policy loss needs the actor config (clip_ratio, clip_ratio_low/high, "
            "clip_ratio_c, global_batch_info); verl passes it as `config`"
        )
    clip = _config_get(config, "clip_ratio", 0.2)
    low = _config_get(config, "clip_ratio_low", None)
    high = _config_get(config, "clip_ratio_high", None)
    low = float(clip if low is None else low)
    high = float(clip if high is None else high)
    dual = float(_config_get(config, "clip_ratio_c", 3.0))
    if not (0.0 <= low < 1.0 and high >= 0.0):
        raise InvalidConfigError(f"need 0 <= clip_ratio_low < 1 and clip_ratio_high >= 0, got {low}, {high}")
    if not dual > 1.0:
        raise InvalidConfigError(f"clip_ratio_c (dual clip) must be greater than 1, got {dual}")
    return low, high, dual


def _turn_ratio_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: Tensor | None,
    turn_ratio: str,
) -> tuple[Tensor, dict[str, Any]]:
    low, high, dual = _clip_settings(config)
    if log_prob.dim() != 2:
        raise ValueError(f"`log_prob` must be padded (batch, response_length), got shape {tuple(log_prob.shape)}")
    mask = response_mask.to(device=log_prob.device) != 0
    # Turns are the runs of LLM tokens in each row, rebuilt on the device from the mask.
    rho = mpo_losses.importance_ratio(log_prob, old_log_prob, mask, ratio="turn", turn_ratio=turn_ratio)
    adv = torch.where(mask, advantages.to(device=rho.device, dtype=rho.dtype), 0.0)

    # verl's dual-clip PPO surrogate (compute_policy_loss_vanilla) with the turn ratio.
    unclipped = -adv * rho
    clipped = -adv * rho.clamp(1.0 - low, 1.0 + high)
    clip_max = torch.maximum(unclipped, clipped)
    dual_bound = -adv * dual
    per_token = torch.where(adv < 0, torch.minimum(dual_bound, clip_max), clip_max)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.to(device=per_token.device, dtype=per_token.dtype)
    batch_info = _config_get(config, "global_batch_info", None) or {}
    loss = core_algos.agg_loss(loss_mat=per_token, loss_mask=mask, loss_agg_mode=loss_agg_mode, **dict(batch_info))

    with torch.no_grad():
        log_ratio = torch.where(mask, (log_prob.detach() - old_log_prob.to(log_prob.device)).float(), 0.0)
        rho_d = rho.detach()
        policy = mask.float()
        has_tokens = bool(policy.sum() > 0)
        metrics: dict[str, Any] = {
            "actor/pg_clipfrac": verl_F.masked_mean((clipped > unclipped).float(), policy).item(),
            "actor/ppo_kl": verl_F.masked_mean(-log_ratio.clamp(-20.0, 20.0), policy).item(),
            "actor/pg_clipfrac_lower": verl_F.masked_mean(((clip_max > dual_bound) & (adv < 0)).float(), policy).item(),
            "actor/mpo_turn_ratio_mean": verl_F.masked_mean(rho_d, policy).item() if has_tokens else float("nan"),
            "actor/mpo_turn_ratio_max": rho_d[mask].max().item() if has_tokens else float("nan"),
        }
    return loss, metrics


def compute_policy_loss_mpo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """``loss_mode=mpo``: the clipped surrogate with MPO's turn importance ratio.

    Each turn's ratio rho_t = exp(sum of its tokens' log-ratios) is the forward value on
    every token of the turn, while each token keeps its own gradient
    (rho~ = sg[rho_t] * pi / sg[pi]), so MAE's centred token credit survives. Clip range
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]``, dual clip ``clip_ratio_c`` for negative
    advantages, ``rollout_is_weights`` multiplied in, reduced by verl's ``agg_loss`` with
    ``loss_agg_mode`` and the actor's ``global_batch_info``. Metrics as verl's ``vanilla``
    plus the turn-ratio mean and max.
    """
    return _turn_ratio_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "product"
    )


def compute_policy_loss_mpo_geo_mean(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """``loss_mode=mpo_geo_mean``: as ``mpo`` with the turn ratio's geometric mean
    rho_t = exp(mean of the turn's token log-ratios), which does not grow with turn length."""
    return _turn_ratio_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "geo_mean"
    )


# --------------------------------------------------------------------------- values hook


def _wrap_compute_advantage(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``compute_advantage``, which for the critic estimators makes the batch's
    ``values`` visible to them for the duration of the call, and inside a session-grouped
    multi-trajectory call runs the plug-in estimator where verl asks for the one it mirrors.
    Everything else is verl's."""

    @functools.wraps(original)
    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        session = _SESSION_ESTIMATOR.get()
        if session is not None and name == SESSION_GROUPED_ESTIMATORS[session]:
            _SESSION_ESTIMATOR.set(None)  # consumed: the wrapper below checks it was
            adv_estimator = name = session
        if name not in CRITIC_ESTIMATORS:
            return original(data, adv_estimator, *args, **kwargs)
        batch = data.batch
        values = batch["values"] if "values" in batch.keys() else None
        token = _CRITIC_VALUES.set(values)
        try:
            return original(data, adv_estimator, *args, **kwargs)
        finally:
            _CRITIC_VALUES.reset(token)

    compute_advantage.__mpo_rs_values_hook__ = True  # type: ignore[attr-defined]
    return compute_advantage


def _wrap_multi_trajectories(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's v1 ``compute_advantage_for_multi_trajectories``, which for a session-grouped
    plug-in estimator runs verl's own session grouping (taken only for the mirrored name) with
    the plug-in estimator computing the sessions' final outputs. Everything else is verl's."""

    @functools.wraps(original)
    def compute_advantage_for_multi_trajectories(
        data: Any, batch_keys: Any, adv_estimator: Any, *args: Any, **kwargs: Any
    ) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        mirrored = SESSION_GROUPED_ESTIMATORS.get(name)
        if mirrored is None:
            return original(data, batch_keys, adv_estimator, *args, **kwargs)
        token = _SESSION_ESTIMATOR.set(name)
        try:
            out = original(data, batch_keys, mirrored, *args, **kwargs)
            if _SESSION_ESTIMATOR.get() is not None:
                # verl's grouping ran its own estimator: refuse its result rather than pass it off.
                raise RuntimeError(
                    f"verl's compute_advantage_for_multi_trajectories did not call the mpo_rs-hooked "
                    f"compute_advantage, so {name!r} could not be grouped by session; call "
                    "mpo_rs.integrations.verl.install_values_hook() before verl.trainer.ppo.v1 is imported"
                )
            return out
        finally:
            _SESSION_ESTIMATOR.reset(token)

    compute_advantage_for_multi_trajectories.__mpo_rs_values_hook__ = True  # type: ignore[attr-defined]
    return compute_advantage_for_multi_trajectories


def _patch(module: ModuleType, attribute: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = getattr(module, attribute)
    if getattr(original, "__mpo_rs_values_hook__", False):
        return
    wrapped = wrap(original)
    setattr(module, attribute, wrapped)
    # Modules that already ran `from ... import <attribute>` hold their own binding
    # (verl.trainer.ppo.v1.utils does for compute_advantage); later imports read the patched one.
    for name, other in list(sys.modules.items()):
        if name.startswith("verl.") and getattr(other, attribute, None) is original:
            setattr(other, attribute, wrapped)


def _patch_compute_advantage(ray_trainer: ModuleType) -> None:
    _patch(ray_trainer, "compute_advantage", _wrap_compute_advantage)


def _patch_multi_trajectories(v1_utils: ModuleType) -> None:
    _patch(v1_utils, "compute_advantage_for_multi_trajectories", _wrap_multi_trajectories)


# Module -> (the function patched in it, the patch), applied right after the module executes.
_PATCHES: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    _RAY_TRAINER: ("compute_advantage", _patch_compute_advantage),
    _V1_UTILS: ("compute_advantage_for_multi_trajectories", _patch_multi_trajectories),
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Patches verl's ``ray_trainer`` and v1 ``utils`` modules right after each executes, so
    that the hook costs nothing (and imports nothing) in processes that never train."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, _PATCHES[fullname][1])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)
        if _all_patched():
            _remove_import_patcher()

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self.loader, name)


def _all_patched() -> bool:
    for name, (attribute, _) in _PATCHES.items():
        fn = getattr(sys.modules.get(name), attribute, None)
        if not getattr(fn, "__mpo_rs_values_hook__", False):
            return False
    return True


def _is_import_patcher(finder: object) -> bool:
    # By name, so that a patcher left by an earlier import of this module counts too.
    kind = type(finder)
    return kind.__name__ == "_PatchAfterImport" and kind.__module__ == __name__


def _remove_import_patcher() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not _is_import_patcher(f)]


def install_values_hook() -> None:
    """Lets ``mpo_gae`` and ``mpo_mae`` read the critic's values inside verl, and makes the
    v1 trainer group multi-output sessions for ``mpo_grpo`` as it does for ``grpo``.

    verl's ``compute_advantage`` (``verl.trainer.ppo.ray_trainer``) passes ``values`` only to
    its built-in ``gae``. This wraps it: for the mpo_rs critic estimators the wrapper exposes
    ``data.batch["values"]`` to the estimator for the duration of the call and otherwise
    calls verl's function unchanged. It also wraps the v1 trainer's
    ``compute_advantage_for_multi_trajectories`` (``verl.trainer.ppo.v1.utils``), which groups
    sessions only for ``grpo``: for the estimators in :data:`SESSION_GROUPED_ESTIMATORS` it
    runs verl's grouping for the mirrored name with the plug-in estimator in its place.
    Idempotent; a module not imported yet is patched when it is (nothing is imported here).
    The plug-in calls this on import unless ``MPO_RS_VERL_VALUES_HOOK=0``. The critic must
    run: ``critic.enable=True``.
    """
    pending = False
    for name, (attribute, patch) in _PATCHES.items():
        module = sys.modules.get(name)
        if module is not None and hasattr(module, attribute):
            patch(module)
        else:
            pending = True
    if pending and not any(_is_import_patcher(f) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


# --------------------------------------------------------------------------- registration

_ESTIMATOR_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "mpo_gae": compute_mpo_gae_advantage,
    "mpo_mae": compute_mpo_mae_advantage,
    "mpo_grpo": compute_mpo_grpo_advantage,
    "mpo_rloo": compute_mpo_rloo_advantage,
    "mpo_mae_grpo": compute_mpo_mae_grpo_advantage,
    "mpo_mae_rloo": compute_mpo_mae_rloo_advantage,
}
_LOSS_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, dict[str, Any]]]] = {
    "mpo": compute_policy_loss_mpo,
    "mpo_geo_mean": compute_policy_loss_mpo_geo_mean,
}


def _is_ours(fn: Any) -> bool:
    # By name, so that a reload of this module replaces its own earlier functions.
    return getattr(fn, "__module__", None) == __name__


def _claim(registry: dict[str, Any], name: str, kind: str) -> None:
    existing = registry.get(name)
    if existing is not None and not _is_ours(existing):
        raise RuntimeError(
            f"verl already has a {kind} named {name!r} "
            f"({getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}); "
            "mpo_rs does not replace it"
        )
    registry.pop(name, None)  # verl's register_adv_est refuses to re-register a name


def register() -> None:
    """Registers the estimators and loss modes in verl's registries (idempotent)."""
    for name, fn in _ESTIMATOR_FUNCTIONS.items():
        _claim(core_algos.ADV_ESTIMATOR_REGISTRY, name, "advantage estimator")
        core_algos.register_adv_est(name)(fn)
    for name, loss in _LOSS_FUNCTIONS.items():
        _claim(core_algos.POLICY_LOSS_REGISTRY, name, "policy loss")
        core_algos.register_policy_loss(name)(loss)


register()
if os.environ.get(VALUES_HOOK_ENV, "1").strip() != "0":
    install_values_hook()
