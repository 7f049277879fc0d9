"""A PPO-style learner around the Rust estimators and :mod:`mpo_rs.torch.losses` (needs torch).

One :meth:`Learner.step` takes a rollout batch of N trajectories, flat token by token
(:class:`RolloutBatch`), and

1. fills in what the rollout did not record: critic values and old log-probs, from a
   no-grad pass of the current critic and policy;
2. computes advantages and critic targets with the Rust core on the host (any
   estimator of the options table, :mod:`mpo_rs.torch.estimation`), scaled as
   ``advantage_scale`` says (:class:`LearnerConfig`);
3. runs ``ppo_epochs`` passes over shuffled minibatches of trajectories: each minibatch
   is right-padded to ``(B, L)``, copied to the device (pinned memory, non-blocking),
   scored by the policy (and critic), and gives one optimizer step per model, with
   gradient accumulation over micro-batches and gradient-norm clipping;
4. returns float metrics (one host synchronisation, at the end, besides the timing's on
   CUDA): ``actor/*`` (with ``entropy``), ``critic/*``, ``advantages/*``, ``batch/*``,
   ``timing/*``; see docs/torch.md.

Conventions. ``old_log_probs[q]`` is log pi(token q | tokens < q) and ``values[q]`` is
V(tokens < q), so the model output at position q-1 scores token q; the first token of a
trajectory has no context and must not be a policy token. The policy and critic are
called as :mod:`mpo_rs.torch.model_io` says. Modules are used in whatever train/eval
mode the caller left them.

Rooms. This module holds the training loop; the settings are
:mod:`~mpo_rs.torch.learner_config`, the estimator adapter
:mod:`~mpo_rs.torch.estimation`, the model I/O (``token_log_probs``, ``token_values``)
:mod:`~mpo_rs.torch.model_io`, the flat -> padded gather :mod:`~mpo_rs.torch.batching`
and ``explained_variance`` :mod:`~mpo_rs.torch.metrics`; their public names are
importable from here too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .. import estimators
from ..exceptions import InvalidOptionError, InvalidRolloutError
from ..options import Estimator
from .batch import RolloutBatch
from .batching import PaddedRows, chunks, pad_rows
from .estimation import CRITIC_FREE_FAMILIES, as_estimator, estimate
from .learner_config import ADVANTAGE_SCALES, ESTIMATORS, LearnerConfig
from .losses import aggregate, policy_loss, value_loss
from .metrics import explained_variance
from .model_io import token_log_probs, token_log_probs_and_entropy, token_values
from .padded import whiten

__all__ = [
    "ADVANTAGE_SCALES",
    "ESTIMATORS",
    "Learner",
    "LearnerConfig",
    "RolloutBatch",
    "explained_variance",
    "token_log_probs",
    "token_log_probs_and_entropy",
    "token_values",
]

# --------------------------------------------------------------------------- learner


@dataclass
class _Averages:
    """Device-side running metrics, read back once: weighted means, except ``*_min`` /
    ``*_max`` which keep the extreme over the whole step."""

    acc: dict[str, Tensor] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def add(self, prefix: str, metrics: dict[str, Tensor], weight: float) -> None:
        for name, value in metrics.items():
            key = prefix + name
            value = value.detach().float()
            previous = self.acc.get(key)
            if key.endswith("_min"):
                value = value if previous is None else torch.fmin(previous, value)
            elif key.endswith("_max"):
                value = value if previous is None else torch.fmax(previous, value)
            else:
                value = value * weight if previous is None else previous + value * weight
                self.weights[key] = self.weights.get(key, 0.0) + weight
            self.acc[key] = value

    def result(self) -> dict[str, float]:
        if not self.acc:
            return {}
        keys = list(self.acc)
        host = torch.stack([self.acc[k] for k in keys]).cpu().tolist()  # the one sync
        out = {}
        for key, value in zip(keys, host, strict=True):
            weight = self.weights.get(key)
            out[key] = value if weight is None else (value / weight if weight else math.nan)
        return out


class _Clock:
    """Wall time per phase of a step. On CUDA the device is synchronised at both ends of a
    measurement, so kernels are charged to the phase that launched them."""

    PHASES = ("estimation", "forward", "backward", "optimizer")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = dict.fromkeys(self.PHASES, 0.0)

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.seconds[phase] += self.now() - start


class Learner:
    """Updates a policy (and optionally a critic) from rollout batches; see the module doc."""

    def __init__(
        self,
        policy: nn.Module,
        policy_optimizer: torch.optim.Optimizer,
        config: LearnerConfig | None = None,
        *,
        critic: nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.config = config or LearnerConfig()
        if (critic is None) != (critic_optimizer is None):
            raise InvalidOptionError("pass `critic` and `critic_optimizer` together")
        self.config.check_critic(critic is not None)
        self.policy = policy
        self.critic = critic
        self.policy_optimizer = policy_optimizer
        self.critic_optimizer = critic_optimizer
        if self.config.device is not None:
            self.device = torch.device(self.config.device)
            try:
                policy.to(self.device)
                if critic is not None:
                    critic.to(self.device)
            except (RuntimeError, AssertionError) as e:  # torch: a device type it was built without
                first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise InvalidOptionError(
                    f"LearnerConfig.device={self.config.device!r} cannot be used here: {first_line}"
                ) from None
        else:
            first = next(policy.parameters(), None)
            self.device = first.device if first is not None else torch.device("cpu")
        self._rng = np.random.default_rng(self.config.seed)
        # The critic's passes beyond ppo_epochs (LearnerConfig.critic_epochs) shuffle with this.
        self._critic_rng = np.random.default_rng([self.config.seed, 1])

    # -- data movement

    def _to_device(self, padded: PaddedRows) -> dict[str, Tensor]:
        pin = self.device.type == "cuda"
        out = {}
        for name, arr in padded.arrays.items():
            t = torch.from_numpy(arr)
            if pin:  # page-locked source: the copy is async and overlaps with compute
                t = t.pin_memory()
            out[name] = t.to(self.device, non_blocking=True)
        return out

    def _autocast(self) -> Any:
        if not self.config.bf16:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    # -- estimation

    @torch.no_grad()
    def _fill_in(self, batch: RolloutBatch) -> tuple[np.ndarray | None, np.ndarray]:
        """Values (None without a critic) and old log-probs for every token."""
        need_values = batch.values is None and self.critic is not None
        need_log_probs = batch.old_log_probs is None
        values = batch.values
        log_probs = batch.old_log_probs
        if not (need_values or need_log_probs):
            return values, log_probs  # type: ignore[return-value]
        n_tokens = batch.token_ids.shape[0]
        values_out = np.zeros(n_tokens, np.float32) if need_values else None
        log_probs_out = np.zeros(n_tokens, np.float32) if need_log_probs else None
        size = self.config.micro_batch_size or self.config.minibatch_size
        flat = {"token_ids": batch.token_ids, "mask": batch.mask}
        for rows in chunks(np.arange(batch.n_trajectories), size):
            padded = pad_rows(flat, batch.offsets, rows)
            dev = self._to_device(padded)
            valid, positions = padded.valid, padded.positions
            with self._autocast():
                if need_values:
                    assert self.critic is not None and values_out is not None
                    v = token_values(self.critic, dev["token_ids"], dev["attention_mask"])
                    values_out[positions] = v.float().cpu().numpy()[valid]
                if need_log_probs:
                    assert log_probs_out is not None
                    lp = token_log_probs(self.policy, dev["token_ids"], dev["attention_mask"], self.config.temperature)
                    log_probs_out[positions] = lp.float().cpu().numpy()[valid]
        return (values_out if need_values else values), (log_probs_out if need_log_probs else log_probs)  # type: ignore[return-value]

    def compute_advantages(
        self, batch: RolloutBatch, values: np.ndarray | None, estimator: Estimator | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-token advantages (scaled as ``advantage_scale`` says) and critic targets
        from the Rust core (:func:`mpo_rs.torch.estimation.estimate`). Targets are None
        only for a group estimator without values; with values (a critic) it gets the
        Monte-Carlo returns, its advantages stay critic-free. ``estimator``: the config's,
        when the caller has it resolved already (:meth:`step` resolves it once)."""
        cfg = self.config
        advantages, returns = estimate(estimator or as_estimator(cfg.estimator), batch, values)
        if cfg.whitens and batch.mask.any():
            advantages = whiten(torch.from_numpy(advantages), torch.from_numpy(batch.mask)).numpy()
        return advantages, returns

    # -- update

    @staticmethod
    def _micro_weights(minibatch: list[PaddedRows], agg: str) -> list[float]:
        """Share of each micro-batch in the minibatch's loss, so that accumulated gradients
        equal those of the whole minibatch under aggregation ``agg``."""
        per_token = agg == "token-mean"
        counts = [p.n_policy_tokens if per_token else p.n_policy_seqs for p in minibatch]
        total = sum(counts)
        return [c / total if total else 0.0 for c in counts]

    def _clip_and_step(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> Tensor:
        max_norm = self.config.max_grad_norm
        params = [p for p in module.parameters() if p.grad is not None]
        if max_norm is not None and params:
            norm = nn.utils.clip_grad_norm_(params, max_norm)
        elif params:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params if p.grad is not None])
            )
        else:
            norm = torch.zeros((), device=self.device)
        optimizer.step()
        return norm

    def step(self, batch: RolloutBatch) -> dict[str, float]:
        """One update from ``batch``; returns metrics named ``actor/*``, ``critic/*``,
        ``advantages/*``, ``batch/*`` and ``timing/*``."""
        cfg = self.config
        est = as_estimator(cfg.estimator)
        if est.family not in CRITIC_FREE_FAMILIES and self.critic is None and batch.values is None:
            raise InvalidRolloutError(f"estimator={est.name!r} needs a critic or the batch `values`")
        clock = _Clock(self.device)
        step_start = clock.now()
        with clock.measure("forward"):
            values, old_log_probs = self._fill_in(batch)
        with clock.measure("estimation"):
            advantages, returns = self.compute_advantages(batch, values, est)

        flat: dict[str, np.ndarray] = {
            "token_ids": batch.token_ids,
            "mask": batch.mask,
            "old_log_probs": old_log_probs,
            "advantages": advantages,
        }
        train_critic = self.critic is not None and returns is not None
        if train_critic:
            assert values is not None and returns is not None
            flat["old_values"] = values
            flat["returns"] = returns

        averages = _Averages()
        n = batch.n_trajectories
        critic_epochs = cfg.critic_passes if train_critic else 0
        for epoch in range(max(cfg.ppo_epochs, critic_epochs)):
            actor, critic = epoch < cfg.ppo_epochs, epoch < critic_epochs
            # The critic's extra passes shuffle with a generator of their own, so the
            # actor's shuffles, and its updates, are the same whatever critic_epochs is.
            rng = self._rng if actor else self._critic_rng
            order = rng.permutation(n) if cfg.shuffle else np.arange(n)
            for rows in chunks(order, cfg.minibatch_size):
                self._update(flat, batch.offsets, rows, (actor, critic), averages, clock)

        metrics = averages.result()
        if train_critic:
            metrics["critic/epochs"] = float(critic_epochs)
        metrics.update(self._batch_metrics(batch, advantages, returns, values))
        metrics.update({f"timing/{phase}_s": seconds for phase, seconds in clock.seconds.items()})
        metrics["timing/step_s"] = clock.now() - step_start
        return metrics

    def _update(
        self,
        flat: dict[str, np.ndarray],
        offsets: np.ndarray,
        rows: np.ndarray,
        models: tuple[bool, bool],
        averages: _Averages,
        clock: _Clock,
    ) -> None:
        """One optimizer step on the minibatch ``rows`` for the actor and/or the critic
        (``models``), with gradient accumulation over its micro-batches."""
        cfg = self.config
        actor, critic = models
        micro = cfg.micro_batch_size or cfg.minibatch_size
        parts = [pad_rows(flat, offsets, r) for r in chunks(rows, micro)]
        if sum(p.n_policy_tokens for p in parts) == 0:
            return  # nothing to learn from; do not step optimizers on zero grads
        policy_weights = self._micro_weights(parts, cfg.agg)
        critic_weights = self._micro_weights(parts, "token-mean")  # critic: token-mean
        with clock.measure("optimizer"):
            if actor:
                self.policy_optimizer.zero_grad(set_to_none=True)
            if critic:
                assert self.critic_optimizer is not None
                self.critic_optimizer.zero_grad(set_to_none=True)
        for part, policy_weight, critic_weight in zip(parts, policy_weights, critic_weights, strict=True):
            if critic_weight == 0.0:  # no policy token in this micro-batch
                continue
            weights = (policy_weight if actor else None, critic_weight if critic else None)
            self._accumulate(self._to_device(part), weights, averages, clock)
        with clock.measure("optimizer"):
            norms = {}
            if actor:
                norms["actor/grad_norm"] = self._clip_and_step(self.policy, self.policy_optimizer)
            if critic:
                assert self.critic is not None and self.critic_optimizer is not None
                norms["critic/grad_norm"] = self._clip_and_step(self.critic, self.critic_optimizer)
        averages.add("", norms, 1.0)

    def _accumulate(
        self, dev: dict[str, Tensor], weights: tuple[float | None, float | None], averages: _Averages, clock: _Clock
    ) -> None:
        """Forward and backward of one micro-batch, each loss scaled by its share; a model
        whose share is None is not run."""
        weight, critic_weight = weights
        if weight is not None:
            self._accumulate_actor(dev, weight, averages, clock)
        if critic_weight is not None:
            self._accumulate_critic(dev, critic_weight, averages, clock)

    def _accumulate_actor(self, dev: dict[str, Tensor], weight: float, averages: _Averages, clock: _Clock) -> None:
        cfg = self.config
        with clock.measure("forward"):
            with self._autocast():
                log_prob, entropy = token_log_probs_and_entropy(
                    self.policy, dev["token_ids"], dev["attention_mask"], cfg.temperature,
                    entropy_grad=cfg.entropy_coef != 0.0,
                )  # fmt: skip
            pg_loss, metrics = policy_loss(
                log_prob, dev["old_log_probs"], dev["advantages"], dev["mask"],
                ratio=cfg.policy_ratio, turn_ratio=cfg.turn_ratio, clip_low=cfg.clip_low,
                clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, agg=cfg.agg,
                log_ratio_clamp=cfg.log_ratio_clamp,
            )  # fmt: skip
            mean_entropy = aggregate(entropy, dev["mask"], cfg.agg)
            loss = pg_loss - cfg.entropy_coef * mean_entropy if cfg.entropy_coef != 0.0 else pg_loss
        with clock.measure("backward"):
            (loss * weight).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        metrics = {k: v for k, v in metrics.items() if not k.startswith("num_")}
        metrics["loss"] = loss.detach()
        metrics["pg_loss"] = pg_loss.detach()
        metrics["entropy"] = mean_entropy.detach()
        averages.add("actor/", metrics, weight)

    def _accumulate_critic(self, dev: dict[str, Tensor], weight: float, averages: _Averages, clock: _Clock) -> None:
        cfg = self.config
        assert self.critic is not None
        with clock.measure("forward"):
            with self._autocast():
                v = token_values(self.critic, dev["token_ids"], dev["attention_mask"])
            vloss, vmetrics = value_loss(v, dev["old_values"], dev["returns"], dev["mask"], clip=cfg.value_clip)
        with clock.measure("backward"):
            (vloss * weight).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        # The step reports the explained variance of the whole batch (_batch_metrics).
        vmetrics.pop("explained_variance", None)
        vmetrics["loss"] = vloss.detach()
        averages.add("critic/", vmetrics, weight)

    def _batch_metrics(
        self,
        batch: RolloutBatch,
        advantages: np.ndarray,
        returns: np.ndarray | None,
        values: np.ndarray | None,
    ) -> dict[str, float]:
        on_policy = batch.mask
        adv = advantages[on_policy].astype(np.float64)
        nan = math.nan
        adv_mean = float(adv.mean()) if adv.size else nan
        adv_std = float(adv.std()) if adv.size else nan
        out = {
            "batch/score_mean": float(batch.trajectory_scores().mean()) if batch.n_trajectories else nan,
            "batch/num_trajectories": float(batch.n_trajectories),
            "batch/num_policy_tokens": float(on_policy.sum()),
            "batch/num_turns": float(estimators.segment_turns(batch.mask, batch.offsets).n_turns),
            "batch/advantage_mean": adv_mean,
            "batch/advantage_std": adv_std,
            "advantages/mean": adv_mean,
            "advantages/std": adv_std,
            "advantages/abs_max": float(np.abs(adv).max()) if adv.size else nan,
        }
        if returns is not None:
            out["batch/return_mean"] = float(returns[on_policy].mean()) if adv.size else nan
        if values is not None:
            out["batch/value_mean"] = float(values[on_policy].mean()) if adv.size else nan
        if self.critic is not None and returns is not None and values is not None:
            out["critic/explained_variance"] = explained_variance(values[on_policy], returns[on_policy])
        return out
