"""A PPO-style learner around the Rust estimators and :mod:`mpo_rs.torch.losses` (needs torch).

One :meth:`Learner.step` takes a rollout batch of N trajectories, flat token by token
(:class:`RolloutBatch`), and

1. fills in what the rollout did not record: critic values and old log-probs, from a
   no-grad pass of the current critic and policy;
2. computes advantages and critic targets with the Rust core on the host (``mae``,
   ``gae`` or ``grpo``, see :class:`LearnerConfig`), scaled as ``advantage_scale`` says;
3. runs ``ppo_epochs`` passes over shuffled minibatches of trajectories: each minibatch
   is right-padded to ``(B, L)``, copied to the device (pinned memory, non-blocking),
   scored by the policy (and critic), and gives one optimizer step per model, with
   gradient accumulation over micro-batches and gradient-norm clipping;
4. returns float metrics (one host synchronisation, at the end, besides the timing's on
   CUDA): ``actor/*`` (with ``entropy``), ``critic/*``, ``advantages/*``, ``batch/*``,
   ``timing/*``; see docs/torch.md.

Conventions. ``old_log_probs[q]`` is log pi(token q | tokens < q) and ``values[q]`` is
V(tokens < q), so the model output at position q-1 scores token q; the first token of a
trajectory has no context and must not be a policy token. The policy is any module
called as ``policy(input_ids=..., attention_mask=...)`` returning logits ``(B, L, V)``
or an object with ``.logits`` (a Hugging Face causal LM); the critic returns values
``(B, L)`` or ``(B, L, 1)`` the same way. Modules are used in whatever train/eval mode
the caller left them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._deps import missing

try:
    import torch
    from torch import Tensor, nn
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.torch.learner", "torch", _e) from None

from .. import estimators
from ..exceptions import InvalidOptionError, InvalidRolloutError
from ..options import Estimator, default, family_estimators
from .batch import RolloutBatch
from .losses import AGGREGATIONS, RATIO_MODES, TURN_RATIOS, aggregate, check_clip_range, policy_loss, value_loss
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

# One per family of the options table (mae, gae, grpo); Dr. GRPO and RLOO are grpo with
# grpo_norm_std=False / grpo_leave_one_out=True.
ESTIMATORS = family_estimators()
ADVANTAGE_SCALES = ("none", "whiten")
# Below this variance of the returns the explained variance is reported as NaN.
_EV_MIN_RETURN_VAR = 1e-8
# MPO updates with the turn ratio; PPO and GRPO mean token ratios unless asked.
_NATURAL_RATIO = {"mae": "turn", "gae": "token", "grpo": "token"}


@dataclass
class LearnerConfig:
    # Advantage estimation (Rust core).
    estimator: str = "mae"
    """``"mae"`` (MPO), ``"gae"`` (token GAE, PPO) or ``"grpo"`` (critic-free group baseline)."""
    # The estimator options' defaults are the Rust options table's (mpo_rs.Estimator).
    lam: float | None = None
    """MAE's turn-level lambda or GAE's lambda; None = the chosen estimator's default
    (0.8 for mae, 0.95 for gae)."""
    lam_intra: float = default("mae", "lam_intra")
    beta: float = default("mae", "beta")
    gamma: float = default("mae", "gamma")
    lam_critic: float = default("mae", "lam_critic")
    gae_length_adaptive_alpha: float | None = default("gae", "length_adaptive_alpha")
    grpo_norm_std: bool = default("grpo", "norm_std")
    """GRPO's own scale: divide by the group's std (Dr. GRPO: False)."""
    grpo_leave_one_out: bool = default("grpo", "leave_one_out")
    grpo_eps: float = default("grpo", "eps")
    """GRPO's ``std + eps`` denominator."""
    advantage_scale: str = "none"
    """``"none"`` or ``"whiten"``: whiten the advantages over the batch's policy tokens
    after estimation, as verl does for GAE (:func:`mpo_rs.torch.whiten`: masked mean,
    unbiased variance, ``rsqrt(var + 1e-8)``; needs 2 policy tokens or more). Applies to
    every estimator; GRPO's per-group std is ``grpo_norm_std``, part of the estimator."""
    normalize_advantages: bool = False
    """Older spelling of ``advantage_scale="whiten"`` (kept working; True sets it)."""

    # Policy loss (see mpo_rs.torch.losses.policy_loss).
    ratio: str | None = None
    """``"turn"`` | ``"token"`` | ``"sequence"`` (GSPO); None = the estimator's natural
    ratio (:attr:`policy_ratio`): turn for mae, token for gae and grpo."""
    turn_ratio: str = "product"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    log_ratio_clamp: float = 20.0
    agg: str = "token-mean"
    value_clip: float | None = 0.5
    entropy_coef: float = 0.0
    """Entropy bonus: the loss is ``policy_loss - entropy_coef * entropy``, the entropy of
    the policy (at ``temperature``) per policy token, aggregated with ``agg``."""

    # Optimisation.
    ppo_epochs: int = 1
    minibatch_size: int = 16
    """Trajectories per optimizer step."""
    micro_batch_size: int | None = None
    """Trajectories per forward/backward (gradient accumulation); None = whole minibatch."""
    max_grad_norm: float | None = 1.0
    bf16: bool = False
    """Run the models under bf16 autocast; losses are computed in fp32."""
    temperature: float = 1.0
    """Divides the logits, as the sampler did."""
    shuffle: bool = True
    seed: int = 0
    device: str | None = None
    """Where to train; None = where the policy's parameters are (modules are moved only
    when this is set)."""

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("estimator", self.estimator, ESTIMATORS),
            ("ratio", self.policy_ratio, RATIO_MODES),
            ("turn_ratio", self.turn_ratio, TURN_RATIOS),
            ("agg", self.agg, AGGREGATIONS),
            ("advantage_scale", self.advantage_scale, ADVANTAGE_SCALES),
        ):
            if value not in allowed:
                raise InvalidOptionError(f"unknown {name}={value!r}; expected one of {', '.join(map(repr, allowed))}")
        if self.normalize_advantages:
            self.advantage_scale = "whiten"
        if self.ppo_epochs < 1 or self.minibatch_size < 1:
            raise InvalidOptionError("ppo_epochs and minibatch_size must be at least 1")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise InvalidOptionError("micro_batch_size must be at least 1 (or None)")
        if not self.temperature > 0:
            raise InvalidOptionError(f"temperature must be positive, got {self.temperature}")
        if not math.isfinite(self.entropy_coef):
            raise InvalidOptionError(f"entropy_coef must be finite, got {self.entropy_coef}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise InvalidOptionError(f"value_clip must be positive (or None), got {self.value_clip}")
        if not self.log_ratio_clamp > 0:
            raise InvalidOptionError(f"log_ratio_clamp must be positive, got {self.log_ratio_clamp}")
        check_clip_range(self.clip_low, self.clip_high, self.dual_clip)
        self._check_estimator_options()

    def _check_estimator_options(self) -> None:
        """Runs the chosen estimator once on a one-trajectory batch, so an option out of
        range raises here, with the Rust core's exception and message, not at the first
        step; the ranges are declared once, in the core."""
        values = np.zeros(2, np.float32)
        mask = np.array([False, True])
        offsets = np.array([0, 2], np.int64)
        scores = np.ones(1, np.float32)
        if self.estimator == "mae":
            self._mae(values, mask, offsets, {"scores": scores})
        elif self.estimator == "gae":
            self._gae(values, mask, offsets, {"scores": scores})
        else:
            self._group(scores, np.zeros(1, np.int64))
            self._monte_carlo_returns(values, mask, offsets, {"scores": scores})  # a critic's targets

    # The estimator calls, shared by the check above and the learner.

    def _mae(self, values: np.ndarray, mask: np.ndarray, offsets: np.ndarray, rewards: dict[str, Any]) -> Any:
        return estimators.mae_advantages(
            values, mask, offsets, **rewards,
            lam=self.estimator_lam, lam_intra=self.lam_intra, beta=self.beta,
            gamma=self.gamma, lam_critic=self.lam_critic,
        )  # fmt: skip

    def _gae(self, values: np.ndarray, mask: np.ndarray, offsets: np.ndarray, rewards: dict[str, Any]) -> Any:
        return estimators.gae_advantages(
            values, mask, offsets, **rewards,
            gamma=self.gamma, lam=self.estimator_lam, lam_critic=self.lam_critic,
            length_adaptive_alpha=self.gae_length_adaptive_alpha,
        )  # fmt: skip

    def _group(self, scores: np.ndarray, group_ids: Any) -> np.ndarray:
        # eps only where the formula divides by the std (Rust refuses an eps it would ignore).
        divides = self.grpo_norm_std and not self.grpo_leave_one_out
        return estimators.group_advantages(
            scores, group_ids, norm_std=self.grpo_norm_std, leave_one_out=self.grpo_leave_one_out,
            eps=self.grpo_eps if divides else None,
        )  # fmt: skip

    def _monte_carlo_returns(
        self, values: np.ndarray, mask: np.ndarray, offsets: np.ndarray, rewards: dict[str, Any]
    ) -> Any:
        """Discounted Monte-Carlo returns (lambda_critic = 1) per token, whatever the values."""
        gae = estimators.gae_advantages(values, mask, offsets, **rewards, gamma=self.gamma, lam=1.0, lam_critic=1.0)
        return gae.returns

    @property
    def estimator_lam(self) -> float:
        """``lam``, or the chosen estimator's default from the options table (1.0 for one
        without a lambda: grpo's critic targets are Monte-Carlo returns)."""
        if self.lam is not None:
            return self.lam
        lam: float = Estimator(self.estimator).options.get("lam", 1.0)
        return lam

    @property
    def policy_ratio(self) -> str:
        """The ratio the policy loss uses: ``ratio``, or the estimator's natural one."""
        if self.ratio is not None:
            return self.ratio
        return _NATURAL_RATIO.get(self.estimator, "turn")

    @property
    def whitens(self) -> bool:
        # normalize_advantages may also be set on a config after construction.
        return self.advantage_scale == "whiten" or self.normalize_advantages


# --------------------------------------------------------------------------- model I/O


def _model_output(module: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    out = module(input_ids=input_ids, attention_mask=attention_mask)
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, Tensor):
        raise TypeError(f"the model returned {type(out).__name__}; expected a tensor or an object with .logits")
    return out


def _scaled_logits(policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """The fp32 logits at positions 0..L-2 (each scores the next token), over ``temperature``."""
    logits = _model_output(policy, input_ids, attention_mask)
    if logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
        raise InvalidRolloutError(f"policy logits have shape {tuple(logits.shape)}, expected (B, L, vocab)")
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def _chosen_log_probs(logits: Tensor, input_ids: Tensor, log_norm: Tensor) -> Tensor:
    chosen = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return nn.functional.pad(chosen - log_norm, (1, 0))


def token_log_probs(policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(token q | tokens < q) for every position of ``(B, L)`` rows, 0 at q = 0; fp32."""
    logits = _scaled_logits(policy, input_ids, attention_mask, temperature)
    return _chosen_log_probs(logits, input_ids, torch.logsumexp(logits, dim=-1))


def token_log_probs_and_entropy(
    policy: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperature: float = 1.0,
    *,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor]:
    """``token_log_probs`` and the entropy of the distribution each token was drawn from,
    H_q = -sum_v pi(v | tokens < q) log pi(v | tokens < q) at ``temperature`` (0 at q = 0);
    ``entropy_grad=False`` computes the entropy without a graph (a metric only)."""
    logits = _scaled_logits(policy, input_ids, attention_mask, temperature)
    log_norm = torch.logsumexp(logits, dim=-1)
    log_probs = _chosen_log_probs(logits, input_ids, log_norm)
    with torch.enable_grad() if entropy_grad else torch.no_grad():
        # H = logsumexp(z) - sum_v softmax(z)_v z_v: one (B, L, V) temporary.
        entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return log_probs, nn.functional.pad(entropy, (1, 0))


def token_values(critic: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """V(tokens < q) for every position of ``(B, L)`` rows (0 at q = 0); fp32."""
    out = _model_output(critic, input_ids, attention_mask)
    if out.dim() == 3 and out.shape[-1] == 1:
        out = out.squeeze(-1)
    if out.shape != input_ids.shape:
        raise InvalidRolloutError(f"critic output has shape {tuple(out.shape)}, expected (B, L) or (B, L, 1)")
    return nn.functional.pad(out[:, :-1].float(), (1, 0))


# --------------------------------------------------------------------------- batching


@dataclass
class _Padded:
    """Right-padded ``(B, L)`` host arrays of some trajectories, ready for the device."""

    arrays: dict[str, np.ndarray]
    n_policy_tokens: int
    n_policy_seqs: int


def _pad(flat: dict[str, np.ndarray], offsets: np.ndarray, rows: np.ndarray) -> _Padded:
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    width = max(int(lengths.max(initial=0)), 1)
    columns = np.arange(width)
    valid = columns[None, :] < lengths[:, None]
    index = np.where(valid, starts[:, None] + columns[None, :], 0)
    arrays = {name: np.where(valid, arr[index], 0).astype(arr.dtype, copy=False) for name, arr in flat.items()}
    arrays["attention_mask"] = valid.astype(np.int64)
    mask = arrays["mask"]
    return _Padded(arrays, int(mask.sum()), int(mask.any(axis=1).sum()))


def _chunks(items: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for start in range(0, items.shape[0], size):
        yield items[start : start + size]


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
        self.policy = policy
        self.critic = critic
        self.policy_optimizer = policy_optimizer
        self.critic_optimizer = critic_optimizer
        if self.config.device is not None:
            self.device = torch.device(self.config.device)
            policy.to(self.device)
            if critic is not None:
                critic.to(self.device)
        else:
            first = next(policy.parameters(), None)
            self.device = first.device if first is not None else torch.device("cpu")
        self._rng = np.random.default_rng(self.config.seed)

    # -- data movement

    def _to_device(self, padded: _Padded) -> dict[str, Tensor]:
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
        for rows in _chunks(np.arange(batch.n_trajectories), size):
            padded = _pad(flat, batch.offsets, rows)
            dev = self._to_device(padded)
            valid = padded.arrays["attention_mask"].astype(bool)
            positions = (batch.offsets[rows][:, None] + np.arange(valid.shape[1])[None, :])[valid]
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
        self, batch: RolloutBatch, values: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-token advantages (scaled as ``advantage_scale`` says) and critic targets
        from the Rust core. Targets are None only for grpo without values; grpo with
        values (a critic) gets the Monte-Carlo returns, its advantages stay critic-free."""
        cfg = self.config
        rewards = {"rewards": batch.rewards} if batch.rewards is not None else {"scores": batch.scores}
        returns: np.ndarray | None
        if cfg.estimator == "grpo":
            if batch.group_ids is None:
                raise InvalidRolloutError("estimator='grpo' needs `group_ids` in the batch")
            per_traj = cfg._group(batch.trajectory_scores(), batch.group_ids)
            advantages = estimators.broadcast_to_tokens(per_traj, batch.mask, batch.offsets)
            returns = None if values is None else cfg._monte_carlo_returns(values, batch.mask, batch.offsets, rewards)
        else:
            if values is None:
                raise InvalidRolloutError(
                    f"estimator={cfg.estimator!r} needs values: give the learner a critic or the batch `values`"
                )
            estimate = (cfg._mae if cfg.estimator == "mae" else cfg._gae)(values, batch.mask, batch.offsets, rewards)
            advantages, returns = estimate.advantages, estimate.returns
        if cfg.whitens and batch.mask.any():
            advantages = whiten(torch.from_numpy(advantages), torch.from_numpy(batch.mask)).numpy()
        return advantages, returns

    # -- update

    @staticmethod
    def _micro_weights(minibatch: list[_Padded], agg: str) -> list[float]:
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
        if cfg.estimator != "grpo" and self.critic is None and batch.values is None:
            raise InvalidRolloutError(f"estimator={cfg.estimator!r} needs a critic or the batch `values`")
        clock = _Clock(self.device)
        step_start = clock.now()
        with clock.measure("forward"):
            values, old_log_probs = self._fill_in(batch)
        with clock.measure("estimation"):
            advantages, returns = self.compute_advantages(batch, values)

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
        micro = cfg.micro_batch_size or cfg.minibatch_size
        for _ in range(cfg.ppo_epochs):
            order = self._rng.permutation(batch.n_trajectories) if cfg.shuffle else np.arange(batch.n_trajectories)
            for rows in _chunks(order, cfg.minibatch_size):
                parts = [_pad(flat, batch.offsets, r) for r in _chunks(rows, micro)]
                if sum(p.n_policy_tokens for p in parts) == 0:
                    continue  # nothing to learn from; do not step optimizers on zero grads
                policy_weights = self._micro_weights(parts, cfg.agg)
                critic_weights = self._micro_weights(parts, "token-mean")  # critic: token-mean
                with clock.measure("optimizer"):
                    self.policy_optimizer.zero_grad(set_to_none=True)
                    if train_critic:
                        assert self.critic_optimizer is not None
                        self.critic_optimizer.zero_grad(set_to_none=True)
                for part, policy_weight, critic_weight in zip(parts, policy_weights, critic_weights, strict=True):
                    if critic_weight == 0.0:  # no policy token in this micro-batch
                        continue
                    weights = (policy_weight, critic_weight if train_critic else None)
                    self._accumulate(self._to_device(part), weights, averages, clock)
                with clock.measure("optimizer"):
                    norms = {"actor/grad_norm": self._clip_and_step(self.policy, self.policy_optimizer)}
                    if train_critic:
                        assert self.critic is not None and self.critic_optimizer is not None
                        norms["critic/grad_norm"] = self._clip_and_step(self.critic, self.critic_optimizer)
                averages.add("", norms, 1.0)

        metrics = averages.result()
        metrics.update(self._batch_metrics(batch, advantages, returns, values))
        metrics.update({f"timing/{phase}_s": seconds for phase, seconds in clock.seconds.items()})
        metrics["timing/step_s"] = clock.now() - step_start
        return metrics

    def _accumulate(
        self, dev: dict[str, Tensor], weights: tuple[float, float | None], averages: _Averages, clock: _Clock
    ) -> None:
        """Forward and backward of one micro-batch, each loss scaled by its share."""
        cfg = self.config
        weight, critic_weight = weights
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
        if critic_weight is not None:
            assert self.critic is not None
            with clock.measure("forward"):
                with self._autocast():
                    v = token_values(self.critic, dev["token_ids"], dev["attention_mask"])
                vloss, vmetrics = value_loss(v, dev["old_values"], dev["returns"], dev["mask"], clip=cfg.value_clip)
            with clock.measure("backward"):
                (vloss * critic_weight).backward()  # type: ignore[no-untyped-call]  # as above
            # The step reports the explained variance of the whole batch (_batch_metrics).
            vmetrics.pop("explained_variance", None)
            vmetrics["loss"] = vloss.detach()
            averages.add("critic/", vmetrics, critic_weight)

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


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """1 - Var(G - V) / Var(G) over the given tokens (float64). NaN when the returns have
    (near) zero variance -- e.g. every trajectory of the batch got the same score -- where
    the ratio says nothing about the critic (clamping Var(G) would read about -1e7)."""
    g = returns.astype(np.float64)
    if g.size == 0:
        return math.nan
    return_var = float(g.var())
    if not return_var > _EV_MIN_RETURN_VAR:
        return math.nan
    return 1.0 - float((g - values.astype(np.float64)).var()) / return_var
