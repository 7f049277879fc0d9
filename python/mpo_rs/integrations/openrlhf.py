"""MPO in OpenRLHF (the ``openrlhf`` extra; written against openrlhf 0.11.2).

* :class:`MPOExperienceMixin` replaces ``RemoteExperienceMaker.compute_advantages_and_returns``:
  each experience's ``advantages`` and ``returns`` come from MAE over its
  ``action_mask`` (a **turn** is a run of ones in a row: in multi-turn agent rollouts the
  environment's tokens are 0) with the critic's ``values``, or, without a critic, from the
  critic-free MAE with the prompt group's baseline (``mpo_baseline="grpo"`` / ``"rloo"`` /
  ``"drgrpo"``, as verl's ``mpo_mae_grpo``). :func:`mpo_experience_maker` builds the
  subclass of OpenRLHF's ``RemoteExperienceMaker``.
* :class:`MPOPolicyLoss` has ``openrlhf.models.PolicyLoss``'s constructor, call signature
  and return tuple ``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)``, with MPO's
  turn ratio: :func:`mpo_rs.torch.losses.policy_loss` with ``ratio="turn"``.

Nothing here imports OpenRLHF at import time (its ``openrlhf.models`` package imports
flash-attn and DeepSpeed); :func:`mpo_experience_maker` imports ``RemoteExperienceMaker``
when called, and the mixin imports ``apply_length_penalties``. See docs/integrations.md.
"""

from __future__ import annotations

import itertools
from typing import Any

from .._deps import needs

with needs("mpo_rs.integrations.openrlhf", "openrlhf"):
    import torch
    from torch import Tensor, nn

import numpy as np

from ..exceptions import InvalidBatchError, InvalidOptionError
from ..options import Estimator, resolve_family
from ..torch import critic_free, losses, padded

__all__ = ["MPOExperienceMixin", "MPOPolicyLoss", "clipped_scores", "mpo_experience_maker", "token_rewards"]


def _group(baseline: str | Estimator | None) -> Estimator | None:
    return None if baseline is None else resolve_family(baseline, "group", "`mpo_baseline` (None: the critic's values)")


def clipped_scores(score: Tensor, clip_range: Any = None) -> Tensor:
    """``score`` clamped to OpenRLHF's ``reward.clip_range`` (``(low, high)``; falsy: as given).
    The one score a sample has: the critic-free baseline and MAE both read it."""
    if clip_range:
        return score.clamp(min=clip_range[0], max=clip_range[1])
    return score


def token_rewards(
    score: Tensor, action_mask: Tensor, kl: Tensor | None, kl_coef: float, clip_range: Any = None
) -> Tensor:
    """OpenRLHF's ``compute_reward``: the (clipped, :func:`clipped_scores`) score on each
    row's last action token plus ``-kl_coef * kl`` (``kl_coef <= 0`` is 0), ``(B, A)``."""
    score = clipped_scores(score, clip_range)
    mask = action_mask.long()
    out = torch.zeros(mask.shape, dtype=torch.promote_types(score.dtype, torch.float32), device=score.device)
    last = mask.size(1) - 1 - mask.fliplr().argmax(dim=1, keepdim=True)
    out.scatter_(dim=1, index=last, src=score.unsqueeze(1).to(out.dtype))
    if kl is not None and kl_coef > 0.0:
        out = out + (-kl_coef * kl).to(out.dtype)
    return out


class MPOExperienceMixin:
    """Put before OpenRLHF's ``RemoteExperienceMaker`` in the bases (or use
    :func:`mpo_experience_maker`). Keyword arguments ``mpo_estimator`` (an
    ``mpo_rs.Estimator("mae", ...)`` or ``"mae"``) and ``mpo_baseline`` (None: the critic's
    ``values``; ``"grpo"`` | ``"drgrpo"`` | ``"rloo"`` | an ``Estimator``: critic-free, the
    group of ``args.rollout.n_samples_per_prompt`` samples of a prompt) are taken off the
    constructor's; the rest go to OpenRLHF's."""

    strategy: Any
    kl_ctl: Any

    def __init__(
        self,
        *args: Any,
        mpo_estimator: str | Estimator = "mae",
        mpo_baseline: str | Estimator | None = None,
        **kwargs: Any,
    ) -> None:
        self.mpo_estimator = resolve_family(mpo_estimator, "mae", "`mpo_estimator`")
        self.mpo_baseline = _group(mpo_baseline)
        super().__init__(*args, **kwargs)

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Any]) -> list[Any]:
        """OpenRLHF's step with MPO's estimator: length penalties (OpenRLHF's), the reward on
        each row's last action token minus the KL penalty, then MAE per experience. Returns:
        the critic's targets (``lam_critic``) with a critic, the advantages without one.
        KL rewards on tokens outside ``action_mask`` are dropped, as OpenRLHF's GAE drops them."""
        from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

        args = self.strategy.args
        for experience in experiences:
            experience.rewards = experience.rewards.to(torch.promote_types(experience.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, args)
        kl_coef = float(self.kl_ctl.value)
        # One score per sample, clipped once: the group baseline reads the reward MAE reads.
        scores = [clipped_scores(e.rewards, getattr(args.reward, "clip_range", None)) for e in experiences]
        rewards = [
            token_rewards(s, e.action_mask, e.kl, kl_coef).to(e.action_mask.device)
            for e, s in zip(experiences, scores, strict=True)
        ]
        if self.mpo_baseline is None:
            for experience, reward in zip(experiences, rewards, strict=True):
                if experience.values is None:
                    raise InvalidBatchError(
                        "MPO with a critic needs `experience.values` (OpenRLHF runs the critic when one is "
                        "configured); without a critic pass mpo_baseline='grpo' (or 'rloo', 'drgrpo')"
                    )
                experience.advantages, experience.returns = padded.mae_advantages(
                    experience.values,
                    experience.action_mask,
                    reward,
                    observation_rewards="drop",
                    estimator=self.mpo_estimator,
                )
        else:
            self._critic_free(experiences, scores, rewards, int(args.rollout.n_samples_per_prompt))
        for experience, reward in zip(experiences, rewards, strict=True):
            experience.info["return"] = reward.sum(dim=-1)
            experience.kl = None
        return experiences

    def _critic_free(
        self, experiences: list[Any], scores: list[Tensor], rewards: list[Tensor], group_size: int
    ) -> None:
        assert self.mpo_baseline is not None
        # A sample's group is its prompt: OpenRLHF's `index` is its place in prompt order.
        index = np.fromiter(itertools.chain.from_iterable(e.index for e in experiences), dtype=np.int64)
        flat_scores = torch.cat([s.detach().float().cpu() for s in scores]).numpy()
        baseline, scale = critic_free.row_baselines(flat_scores, index // max(group_size, 1), self.mpo_baseline)
        start = 0
        for experience, reward in zip(experiences, rewards, strict=True):
            rows = slice(start, start + int(experience.action_mask.shape[0]))
            start = rows.stop
            batch = padded.PaddedBatch.of(experience.action_mask, like=reward, like_name="rewards")
            flat = critic_free.mae_over_baselines(
                batch,
                baseline[rows],
                scale[rows],
                self.mpo_estimator,
                rewards=batch.policy_rewards(reward, "drop"),
            )
            experience.advantages = batch.padded(flat)
            experience.returns = experience.advantages.clone()


def mpo_experience_maker(base: type | None = None) -> type:
    """The experience maker class: :class:`MPOExperienceMixin` over ``base`` (default
    OpenRLHF's ``RemoteExperienceMaker``, imported here)."""
    if base is None:
        with needs("mpo_rs.integrations.openrlhf.mpo_experience_maker", "openrlhf"):
            from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        base = RemoteExperienceMaker
    return type(f"MPO{base.__name__}", (MPOExperienceMixin, base), {})


class MPOPolicyLoss(nn.Module):
    """``openrlhf.models.PolicyLoss`` with MPO's turn importance ratio.

    Same constructor (``clip_eps_low``, ``clip_eps_high``, ``dual_clip``, ``token_level_loss``,
    and the importance-correction settings, of which only the defaults are supported:
    ``policy_loss_type="ppo"``, ``is_correction_level="off"``) plus ``turn_ratio``
    (``"product"`` | ``"geo_mean"``). Same call and return tuple; the reduction is
    OpenRLHF's ``aggregate_loss`` (token mean, or mean of sequence means; with
    ``batch_num_tokens`` / ``global_batch_size`` the global totals times ``dp_size``).
    ``vllm_kl`` and ``is_filter_ratio`` are None (no correction).
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float | None = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold: Any = (0.5, 5.0),
        turn_ratio: str = "product",
    ) -> None:
        super().__init__()
        if policy_loss_type != "ppo" or is_correction_level != "off":
            raise InvalidOptionError(
                "MPOPolicyLoss replaces the ratio by the turn ratio: policy_loss_type must be 'ppo' and "
                f"is_correction_level 'off', got {policy_loss_type!r}, {is_correction_level!r}"
            )
        if turn_ratio not in losses.TURN_RATIOS:
            raise InvalidOptionError(
                f"unknown turn_ratio={turn_ratio!r}; expected one of {', '.join(map(repr, losses.TURN_RATIOS))}"
            )
        losses.check_clip_range(
            clip_eps_low, clip_eps_high, dual_clip, names=("clip_eps_low", "clip_eps_high", "dual_clip")
        )
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.dual_clip = dual_clip
        self.token_level_loss = token_level_loss
        self.policy_loss_type = policy_loss_type
        self.turn_ratio = turn_ratio

    def forward(
        self,
        log_probs: Tensor,
        old_log_probs: Tensor,
        advantages: Tensor,
        action_mask: Tensor | None = None,
        rollout_log_probs: Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | None = None,
        global_batch_size: float | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, None, None]:
        mask = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask != 0
        agg = "token-mean" if self.token_level_loss else "seq-mean-token-mean"
        loss, metrics = losses.policy_loss(
            log_probs,
            old_log_probs,
            advantages,
            mask,
            ratio="turn",
            turn_ratio=self.turn_ratio,
            clip_low=self.clip_eps_low,
            clip_high=self.clip_eps_high,
            dual_clip=self.dual_clip,
            agg=agg,
        )
        if self.token_level_loss and batch_num_tokens is not None:
            loss = loss * metrics["num_tokens"] / batch_num_tokens * dp_size
        elif not self.token_level_loss and global_batch_size is not None:
            sequences = (mask.sum(dim=-1) > 0).sum()
            loss = loss * sequences / global_batch_size * dp_size
        with torch.no_grad():
            m = mask.to(metrics["num_tokens"].dtype)
            log_ratio = torch.where(mask, log_probs.detach() - old_log_probs.to(log_probs.device), 0.0)
            ppo_kl = -(log_ratio * m).sum() / m.sum()
        return loss, metrics["clip_frac"], ppo_kl, None, None
