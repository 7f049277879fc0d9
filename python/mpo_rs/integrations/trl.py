"""MPO in TRL's ``GRPOTrainer`` (the ``trl`` extra; tested with trl 1.16.0).

:class:`MPOGRPOTrainer` is a ``trl.GRPOTrainer`` that

* replaces GRPO's one advantage per completion by MPO's per token: a **turn** is a run of
  ones in TRL's loss mask (``completion_mask * tool_mask``; the tool mask is 0 on tool
  results, from ``tools`` / ``environment_factory``, or the ``env_mask`` a ``rollout_func``
  returns), and the completion's reward (TRL's weighted sum of the reward functions) sits on
  its last policy token. TRL's GRPO has no critic, so by default the value of every token
  is the completion's group baseline: the critic-free MAE of verl's ``mpo_mae_grpo``
  (``baseline="grpo"``; ``"rloo"`` for the leave-one-out mean, ``"drgrpo"`` for no std
  scaling). With ``lam=1``, ``beta=0`` this is GRPO. ``baseline="gigpo"`` (or an
  ``mpo_rs.Estimator("gigpo", ...)``) computes GiGPO's advantages instead: the episode
  baseline over a prompt's completions plus the step baseline over their turns that start
  from one anchor state, hashed from the completion token ids. A trainer that has a value model
  overrides :meth:`MPOGRPOTrainer.mpo_values` to return its values; MAE then runs with them.
* optimises the clipped surrogate with MPO's **turn ratio** (``turn_ratio="product"`` or
  ``"geo_mean"``; ``None`` keeps TRL's token ratio), through
  :func:`mpo_rs.torch.losses.policy_loss`, reduced as TRL's ``loss_type`` says.

The estimator is an :class:`mpo_rs.Estimator` (or its name): its options are the Rust
table's, checked there. See docs/integrations.md ("TRL").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .._deps import needs

with needs("mpo_rs.integrations.trl", "trl"):
    import torch
    from torch import Tensor

    # Any, for mypy: the subclass reads TRL's attributes, whose types vary between releases.
    _GRPOTrainer: Any = importlib.import_module("trl").GRPOTrainer

import numpy as np

from ..exceptions import InvalidBatchError, InvalidOptionError
from ..options import Estimator, resolve_family
from ..torch import critic_free, losses, padded

__all__ = ["LOSS_AGGREGATIONS", "MPOBatch", "MPOGRPOTrainer"]

LOSS_AGGREGATIONS = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "token-mean"}
"""TRL's ``loss_type`` -> the :func:`mpo_rs.torch.losses.policy_loss` aggregation the turn-ratio
loss reduces with (``dapo`` and ``dr_grpo`` then rescale the token mean to TRL's normaliser)."""

# The multimodal inputs TRL's own loss passes to the forward pass, passed on the same way.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)

# TRL's ``scale_rewards`` -> the table's group estimator of the critic-free baseline.
_BASELINES = {"group": "grpo", "none": "drgrpo"}


@dataclass(frozen=True)
class MPOBatch:
    """What :class:`MPOGRPOTrainer` computed the last advantages from (this process's rows)."""

    loss_mask: Tensor
    """(B, C) int: TRL's ``completion_mask * tool_mask``; turns are its runs of ones."""
    scores: np.ndarray
    """float32 (B,): each completion's reward (TRL's weighted sum of its reward functions)."""
    group_ids: np.ndarray
    """int64 (B,): the completion's group (its prompt) in the gathered batch."""
    advantages: Tensor
    """(B, C) float32: MPO's advantages, 0 off the policy tokens."""
    grpo_advantages: Tensor
    """(B,): the advantages TRL's own GRPO computed for the same batch."""
    values: Tensor | None
    """(B, C): the values from :meth:`MPOGRPOTrainer.mpo_values`, or None (critic-free)."""
    token_ids: Tensor | None = None
    """(B, C): the completion token ids (GiGPO's anchor states), else None."""


class MPOGRPOTrainer(_GRPOTrainer):  # type: ignore[misc]
    """``trl.GRPOTrainer`` with MPO's per-token advantages and turn-ratio loss.

    Args (beyond ``GRPOTrainer``'s, keyword only):
        estimator: an ``mpo_rs.Estimator("mae", lam=..., lam_intra=..., beta=..., gamma=...)``
            or ``"mae"`` (the table's defaults).
        baseline: the critic-free value baseline, a group estimator (``"grpo"``, ``"drgrpo"``,
            ``"rloo"`` or ``mpo_rs.Estimator("grpo", eps=...)``), or ``"gigpo"`` /
            ``mpo_rs.Estimator("gigpo", ...)``: GiGPO's advantages in place of critic-free MAE
            (anchor states hashed from the completion token ids). Default: from TRL's
            ``scale_rewards`` (``"group"`` -> ``grpo``, ``"none"`` -> ``drgrpo``).
            Unused when :meth:`mpo_values` returns values.
        turn_ratio: ``"product"`` | ``"geo_mean"``: the loss's turn ratio; ``None`` keeps
            TRL's own loss (token ratio) with MPO's per-token advantages.
        rollout_log: an object with ``append_padded(input_ids=, loss_mask=, attention_mask=,
            values=, token_rewards=, scores=, group_ids=, step=)`` (``mpo_rs.rollout_log``'s
            writer), called with each batch of completions, with group ids unique over the
            run (a log of many steps groups only each prompt's completions); or None.
    """

    def __init__(
        self,
        *args: Any,
        estimator: str | Estimator = "mae",
        baseline: str | Estimator | None = None,
        turn_ratio: str | None = "product",
        rollout_log: Any = None,
        **kwargs: Any,
    ) -> None:
        self.mpo_estimator = resolve_family(estimator, "mae", "MPOGRPOTrainer's `estimator`")
        if turn_ratio is not None and turn_ratio not in losses.TURN_RATIOS:
            raise InvalidOptionError(
                f"unknown turn_ratio={turn_ratio!r}; expected one of {', '.join(map(repr, losses.TURN_RATIOS))} or None"
            )
        self.mpo_turn_ratio = turn_ratio
        if rollout_log is not None and not callable(getattr(rollout_log, "append_padded", None)):
            raise InvalidOptionError(
                f"`rollout_log` must have an append_padded(...) method (mpo_rs.rollout_log), got {type(rollout_log).__name__}"
            )
        self.mpo_rollout_log = rollout_log
        self.mpo_last: MPOBatch | None = None
        self._mpo_rewards_per_func: Tensor | None = None
        self._mpo_groups_logged = 0  # groups of earlier batches: the log's group ids stay unique
        super().__init__(*args, **kwargs)
        self.mpo_baseline = self._baseline(baseline)
        self._check_settings()

    # ------------------------------------------------------------------ settings

    def _baseline(self, baseline: str | Estimator | None) -> Estimator:
        if baseline is None:
            name = _BASELINES.get(self.scale_rewards)
            if name is None:
                raise InvalidOptionError(
                    f"MPOGRPOTrainer: scale_rewards={self.scale_rewards!r} has no group baseline; "
                    f"use scale_rewards='group' or 'none', or pass baseline='grpo' | 'drgrpo' | 'rloo'"
                )
            baseline = name
        gigpo = baseline == "gigpo" or (isinstance(baseline, Estimator) and baseline.family == "gigpo")
        return resolve_family(baseline, "gigpo" if gigpo else "group", "MPOGRPOTrainer's `baseline`")

    def _check_settings(self) -> None:
        """Refuses the TRL settings this trainer does not carry over, naming them."""
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise InvalidOptionError(
                "MPOGRPOTrainer scores a completion by the weighted sum of its rewards: "
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} is not supported "
                "(use 'sum_then_normalize')"
            )
        if self.mpo_turn_ratio is None:
            return
        args = self.args
        unsupported = {
            "loss_type": (self.loss_type, self.loss_type not in LOSS_AGGREGATIONS),
            "importance_sampling_level": (self.importance_sampling_level, self.importance_sampling_level != "token"),
            "delta": (args.delta, args.delta is not None),
            "top_entropy_quantile": (self.top_entropy_quantile, self.top_entropy_quantile < 1.0),
            "off_policy_mask_threshold": (self.off_policy_mask_threshold, self.off_policy_mask_threshold is not None),
            "entropy_coef": (getattr(args, "entropy_coef", 0.0), self._entropy_bonus_enabled),
            "use_bias_correction_kl": (args.use_bias_correction_kl, self.beta != 0.0 and args.use_bias_correction_kl),
            "vllm_importance_sampling_correction": (
                self.vllm_importance_sampling_correction,
                self.use_vllm and self.vllm_importance_sampling_correction,
            ),
            "use_liger_kernel": (args.use_liger_kernel, args.use_liger_kernel),
            "output_router_logits": (True, self.aux_loss_enabled),
        }
        bad = [f"{k}={v!r}" for k, (v, refused) in unsupported.items() if refused]
        if bad:
            raise InvalidOptionError(
                f"MPOGRPOTrainer's turn-ratio loss does not support {', '.join(bad)}; supported loss_type: "
                f"{', '.join(LOSS_AGGREGATIONS)}. Pass turn_ratio=None to keep TRL's own loss with MPO's advantages"
            )

    # ------------------------------------------------------------------ advantages

    def mpo_values(self, output: dict[str, Any]) -> Tensor | None:
        """The value of each completion token, ``(B, C)`` like ``output["completion_ids"]``,
        or None (the default: no critic; the group baseline is the value). Override to
        bring a value model's values; MAE then uses them and ignores ``baseline``."""
        return None

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Tensor:
        rewards_per_func: Tensor = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mpo_rewards_per_func = rewards_per_func  # gathered over processes: the groups' rows
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        rewards_per_func = self._mpo_rewards_per_func
        self._mpo_rewards_per_func = None
        if rewards_per_func is None:
            raise RuntimeError("MPOGRPOTrainer: TRL computed advantages without calling _calculate_rewards")
        completion_mask = output["completion_mask"]
        tool_mask = output.get("tool_mask")
        loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask
        rows = int(completion_mask.shape[0])

        scores_all, ids_all = self._scores(rewards_per_func)
        local = slice(self.accelerator.process_index * rows, (self.accelerator.process_index + 1) * rows)
        scores, ids = scores_all[local], ids_all[local]
        values = self.mpo_values(output)
        token_ids = None
        if values is None and self.mpo_baseline.family == "gigpo":
            token_ids = output["completion_ids"]
            advantages = self._mpo_gigpo(loss_mask, token_ids, scores_all, ids_all, local)
        elif values is None:
            batch = padded.PaddedBatch.of(loss_mask)
            baseline, scale = critic_free.row_baselines(scores_all, ids_all, self.mpo_baseline)
            flat = critic_free.mae_over_baselines(
                batch, baseline[local], scale[local], self.mpo_estimator, scores=scores
            )
            advantages = batch.padded(flat)
        else:
            advantages, _ = padded.mae_advantages(values, loss_mask, scores=scores, estimator=self.mpo_estimator)
        self.mpo_last = MPOBatch(loss_mask, scores, ids, advantages, output["advantages"], values, token_ids)
        output["advantages"] = advantages.to(device=completion_mask.device, dtype=torch.float32)
        if self.mpo_rollout_log is not None:
            # Unique over the run, so a log of many steps groups each prompt's completions only.
            run_ids = ids + self._mpo_groups_logged
            self._mpo_groups_logged += int(ids_all[-1]) + 1 if ids_all.shape[0] else 0
            self.mpo_rollout_log.append_padded(
                input_ids=output["completion_ids"],
                loss_mask=loss_mask,
                attention_mask=completion_mask,
                values=values,
                token_rewards=None,
                scores=scores,
                group_ids=run_ids,
                step=int(self.state.global_step),
            )
        return output

    def _mpo_gigpo(
        self, loss_mask: Tensor, token_ids: Tensor, scores_all: np.ndarray, ids_all: np.ndarray, local: slice
    ) -> Tensor:
        """GiGPO over the gathered completions (a prompt's completions may sit on other
        processes: masks and token ids are padded to one width and gathered, as the
        rewards are), this process's rows returned."""
        acc = self.accelerator
        mask_all = acc.gather(acc.pad_across_processes(loss_mask, dim=1)).cpu()
        tokens_all = acc.gather(acc.pad_across_processes(token_ids, dim=1)).cpu()
        advantages, _ = padded.advantages(
            mask_all, None, scores=scores_all, group_ids=ids_all, token_ids=tokens_all, estimator=self.mpo_baseline
        )
        out: Tensor = advantages[local, : loss_mask.shape[1]]
        return out

    def _scores(self, rewards_per_func: Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Each completion's score (TRL's weighted sum of its rewards) and group (its prompt:
        TRL's sampler puts a prompt's ``num_generations`` completions next to each other),
        over the gathered batch."""
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        if bool(unscorable.any()):
            row = int(unscorable.nonzero()[0, 0])
            raise InvalidBatchError(
                f"completion {row} of the batch has no reward (every reward function returned None): "
                "MPO needs a score for every completion of a group"
            )
        scores = (rewards_per_func * weights).nansum(dim=1).detach().to(device="cpu", dtype=torch.float32).numpy()
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        ids = np.arange(scores.shape[0], dtype=np.int64) // max(int(group_size), 1)
        return scores, ids

    # ------------------------------------------------------------------ loss

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        if self.mpo_turn_ratio is None:
            loss: Tensor = super()._compute_loss(model, inputs)
            return loss
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1).expand_as(per_token_logps)
        agg = LOSS_AGGREGATIONS[self.loss_type]
        loss, metrics = losses.policy_loss(
            per_token_logps,
            old,
            advantages,
            mask,
            ratio="turn",
            turn_ratio=self.mpo_turn_ratio,
            clip_low=self.epsilon_low,
            clip_high=self.epsilon_high,
            agg=agg,
        )
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
            loss = loss + self.beta * losses.aggregate(per_token_kl, mask, agg)
        loss = self._mpo_scale(loss, metrics["num_tokens"], inputs, per_token_logps.size(0))
        self._mpo_log(metrics, entropies, mask)
        return loss

    def _mpo_scale(self, loss: Tensor, n_tokens: Tensor, inputs: dict[str, Any], rows: int) -> Tensor:
        """TRL's normaliser of ``loss_type`` applied to the aggregated loss."""
        training = self.model.training
        accumulation = self.current_gradient_accumulation_steps if training else 1.0
        if self.loss_type == "dapo":
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if training:
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            scaled: Tensor = loss * n_tokens / normalizer
            return scaled
        if self.loss_type == "dr_grpo":
            scaled = loss * n_tokens / (rows * int(self.max_completion_length)) / accumulation
            return scaled
        return loss / accumulation

    def _mpo_log(self, metrics: dict[str, Tensor], entropies: Tensor, mask: Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        m = mask.to(entropies.dtype)
        gathered = self.accelerator.gather(
            torch.stack(
                [
                    (entropies * m).sum(),
                    m.sum(),
                    metrics["clip_frac_low"].to(m.dtype) * m.sum(),
                    metrics["clip_frac_high"].to(m.dtype) * m.sum(),
                    torch.nan_to_num(metrics["ratio_mean"].to(m.dtype)) * m.sum(),
                ]
            ).detach()
        ).view(-1, 5)
        totals = gathered.sum(dim=0)
        count = totals[1].clamp(min=1.0)
        log = self._metrics[mode]
        log["entropy"].append((totals[0] / count).item())
        log["clip_ratio/low_mean"].append((totals[2] / count).item())
        log["clip_ratio/high_mean"].append((totals[3] / count).item())
        log["clip_ratio/region_mean"].append(((totals[2] + totals[3]) / count).item())
        log["mpo/turn_ratio_mean"].append((totals[4] / count).item())
        log["mpo/turn_ratio_max"].append(float(self.accelerator.gather(metrics["ratio_max"].detach()).max().item()))
