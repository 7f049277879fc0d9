"""Clipped policy-gradient losses with turn-, token- and sequence-level importance ratios,
and the clipped critic loss. Needs the ``torch`` extra.

Every ratio mode is one clipped surrogate; only the ratio differs:

* ``"turn"`` (MPO): log rho_t = sum_i l_{t,i} over the turn (``turn_ratio="product"``) or its
  mean (``"geo_mean"``). Each token uses log rho~_{t,i} = sg[log rho_t] + l_{t,i} - sg[l_{t,i}]:
  its value is the turn's ratio, its gradient is rho_t * grad log pi(a_{t,i}), so the
  centred token credit of MAE survives the update.
* ``"token"``: PPO's per-token ratio exp(l_{t,i}) (and the "MPO w/ token IS" ablation).
* ``"sequence"``: GSPO-token, the same construction with the geometric-mean ratio of the
  whole sequence.

Inputs are padded ``(B, L)`` tensors, one trajectory per row (turns are the 0->1 runs of
each mask row, derived on the device), or flat 1-D tensors with ``token_turn`` from
:func:`mpo_rs.segment_turns` (and ``offsets`` when a per-sequence quantity is needed).
Nothing in here reads a device value back to the host: metrics are 0-dim tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .._deps import missing

try:
    import torch
    from torch import Tensor
except ModuleNotFoundError as _e:
    raise missing("mpo_rs.torch.losses", "torch", _e) from None

from ..exceptions import InvalidOptionError, InvalidRolloutError

__all__ = [
    "AGGREGATIONS",
    "RATIO_MODES",
    "TURN_RATIOS",
    "TURN_RATIO_STATISTICS",
    "Surrogate",
    "aggregate",
    "check_clip_range",
    "clipped_surrogate",
    "importance_ratio",
    "policy_loss",
    "turn_index_from_mask",
    "turn_ratio_statistics",
    "value_loss",
]

RATIO_MODES = ("turn", "token", "sequence")
TURN_RATIOS = ("product", "geo_mean")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class _Layout:
    """Where the tokens of a loss call sit: every per-token tensor is viewed flat, and the
    layout knows how to group flat tokens by sequence."""

    mask: Tensor  # bool[n], True on policy tokens
    padded_shape: tuple[int, int] | None  # (B, L) for padded inputs, None for flat
    offsets: Tensor | None  # int64[N+1] on the device, flat inputs only

    @property
    def n_seqs(self) -> int | None:
        if self.padded_shape is not None:
            return self.padded_shape[0]
        return None if self.offsets is None else int(self.offsets.shape[0]) - 1

    @cached_property
    def seq_index(self) -> Tensor:
        """Sequence id of every flat token (int64[n]); computed once per call."""
        if self.padded_shape is not None:
            cols = self.padded_shape[1]
            return torch.arange(self.mask.shape[0], device=self.mask.device) // cols
        if self.offsets is None:
            raise InvalidRolloutError(
                "flat inputs need `offsets=` (int64[N+1], trajectory j is tokens "
                "offsets[j]:offsets[j+1]) for ratio='sequence' and the seq-mean aggregations"
            )
        positions = torch.arange(self.mask.shape[0], device=self.mask.device)
        return torch.searchsorted(self.offsets[1:], positions, right=True)

    def seq_sum(self, x: Tensor) -> Tensor:
        """Per-sequence sums of a flat tensor that is already zero off-policy."""
        if self.padded_shape is not None:
            return x.reshape(self.padded_shape).sum(dim=1)
        index = self.seq_index  # raises if flat inputs lack `offsets`
        return x.new_zeros(self.n_seqs).index_add_(0, index, x)  # type: ignore[arg-type]

    def seq_broadcast(self, per_seq: Tensor) -> Tensor:
        """A per-sequence value on every flat token of its sequence."""
        if self.padded_shape is not None:
            return per_seq[:, None].expand(self.padded_shape).reshape(-1)
        return per_seq.index_select(0, self.seq_index)


def _to_device(x: Any, device: torch.device, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x.to(device, non_blocking=True)
    try:
        return torch.as_tensor(np.asarray(x), device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidRolloutError(f"`{name}` cannot be read as a tensor: {e}") from None


def _float(x: Any, like: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    t = _to_device(x, like.device, name)
    if not (t.dtype.is_floating_point or t.dtype in (torch.int32, torch.int64)):
        raise InvalidRolloutError(f"`{name}` must be a real-valued tensor, got dtype {t.dtype}")
    if t.shape != like.shape:
        raise InvalidRolloutError(f"`{name}` has shape {tuple(t.shape)}, expected {tuple(like.shape)}")
    return t.to(dtype)


def _bool_mask(mask: Any, like: Tensor) -> Tensor:
    m = _to_device(mask, like.device, "mask")
    if m.shape != like.shape:
        raise InvalidRolloutError(f"`mask` has shape {tuple(m.shape)}, expected {tuple(like.shape)}")
    if m.dtype == torch.bool:
        return m
    if m.dtype.is_complex:
        raise InvalidRolloutError(f"`mask` must be bool or 0/1 numbers, got dtype {m.dtype}")
    return m != 0  # any nonzero entry marks a policy token (no value check: it would sync)


def _compute_dtype(x: Tensor) -> torch.dtype:
    # bf16/fp16 log-probs are upcast: exp() of a sum of many of them must not round.
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_choice(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise InvalidOptionError(f"unknown {name}={value!r}; expected one of {', '.join(map(repr, allowed))}")


def _is_host(x: Any) -> bool:
    return not isinstance(x, Tensor) or x.device.type == "cpu"


def _host_numpy(x: Any) -> np.ndarray:
    return x.detach().numpy() if isinstance(x, Tensor) else np.asarray(x)


def _make_layout(mask: Tensor, offsets: Any, padded: bool) -> _Layout:
    if padded:
        if offsets is not None:
            raise InvalidRolloutError("`offsets` is for flat 1-D inputs; padded rows are the sequences")
        rows, cols = mask.shape
        return _Layout(mask.reshape(-1), (rows, cols), None)
    offs = None
    if offsets is not None:
        if _is_host(offsets):  # validate what is free to validate
            o = _host_numpy(offsets)
            if o.ndim != 1 or o.shape[0] < 1 or o.dtype.kind not in "iu":
                raise InvalidRolloutError(
                    f"`offsets` must be a 1-D integer array of N+1 entries, got {o.dtype} {o.shape}"
                )
            if o[0] != 0 or o[-1] != mask.shape[0] or np.any(np.diff(o) < 0):
                raise InvalidRolloutError(
                    f"`offsets` must start at 0, be non-decreasing and end at the token count "
                    f"{mask.shape[0]}; got offsets[0]={o[0]}, offsets[-1]={o[-1]}"
                )
        offs = _to_device(offsets, mask.device, "offsets").to(torch.int64)
    return _Layout(mask, None, offs)


# --------------------------------------------------------------------------- turns


def turn_index_from_mask(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Turn buckets of a padded ``(B, L)`` mask, computed on its device without a loop.

    A turn starts where a row's mask goes 0 -> 1 (column 0 counts as preceded by 0), so a
    turn never spans rows. Returns ``(index, num_turns)``: ``index`` (int64[B*L]) is the
    running count of turn starts in row-major order, i.e. 1 + the global turn id on policy
    tokens (0 for off-policy tokens before the first turn; other off-policy tokens carry
    the previous turn's bucket and must be zeroed by the caller); ``num_turns`` is a 0-dim
    tensor. Buckets fit in ``B*L + 1`` slots.
    """
    m = mask if mask.dtype == torch.bool else mask != 0
    previous = torch.zeros_like(m)
    previous[:, 1:] = m[:, :-1]
    starts = (m & ~previous).reshape(-1)
    index = torch.cumsum(starts, dim=0)  # int64
    return index, starts.sum()


def _flat_turn_index(token_turn: Any, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Turn buckets (1 + turn id, 0 off-policy) of flat inputs from ``token_turn``."""
    n = mask.shape[0]
    if _is_host(token_turn):
        tt = _host_numpy(token_turn)
        if tt.dtype.kind not in "iu":
            raise InvalidRolloutError(f"`token_turn` must hold integer turn ids, got dtype {tt.dtype}")
        if tt.shape != (n,):
            raise InvalidRolloutError(f"`token_turn` has shape {tt.shape}, expected ({n},) like the log-probs")
        if n and (tt.min() < -1 or tt.max() >= n):
            bad = int(np.flatnonzero((tt < -1) | (tt >= n))[0])
            raise InvalidRolloutError(
                f"`token_turn` must hold -1 (off-policy) or a turn id below the token count {n}; "
                f"found {tt[bad]} at token {bad}. Use mpo_rs.segment_turns(mask, offsets).token_turn "
                "of exactly these tokens"
            )
        if mask.device.type == "cpu":
            disagree = np.flatnonzero((tt >= 0) != mask.numpy())
            if disagree.size:
                i = int(disagree[0])
                raise InvalidRolloutError(
                    f"`token_turn` and `mask` disagree at token {i}: token_turn={tt[i]}, "
                    f"mask={bool(mask[i])} (turn ids are -1 exactly off-policy)"
                )
    turn = _to_device(token_turn, mask.device, "token_turn")
    if turn.dtype.is_floating_point or turn.dtype == torch.bool or turn.shape != (n,):
        raise InvalidRolloutError(f"`token_turn` must be an integer tensor of shape ({n},)")
    turn = turn.to(torch.int64)
    # A turn starts where the id changes to a non-negative one.
    previous = torch.cat([turn.new_full((1,), -1), turn[:-1]])
    num_turns = ((turn >= 0) & (turn != previous)).sum()
    index = torch.where(mask, turn + 1, 0)
    return index, num_turns


def _grouped_log_ratio(
    log_ratio: Tensor, mask_f: Tensor, index: Tensor, n_buckets: int, mean: bool, bound: float
) -> Tensor:
    """Per token, the (detached) sum or mean of ``log_ratio`` over its bucket, clamped to
    ``[-bound, bound]``."""
    with torch.no_grad():
        sums = log_ratio.new_zeros(n_buckets).index_add_(0, index, log_ratio.detach())
        if mean:
            counts = mask_f.new_zeros(n_buckets).index_add_(0, index, mask_f)
            sums = sums / counts.clamp_min(1.0)
        return sums.clamp_(-bound, bound).index_select(0, index)


class _SharedRatio(torch.autograd.Function):
    """rho~ = exp(sg[g] + l - sg[l]) for a per-token log-ratio ``l`` and a detached group
    log-ratio ``g``: the value is exp(g), the gradient w.r.t. ``l`` is exp(g) per token.

    Same numbers as writing the stop-gradient expression out, but without the add, the
    subtract and their backward passes over every token.
    """

    @staticmethod
    def forward(ctx: Any, log_ratio: Tensor, group_log_ratio: Tensor) -> Tensor:
        rho = torch.exp(group_log_ratio)
        ctx.save_for_backward(rho)
        return rho

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_rho: Tensor) -> tuple[Tensor, None]:
        (rho,) = ctx.saved_tensors
        return grad_rho * rho, None


# --------------------------------------------------------------------------- aggregation


def _masked_mean(x: Tensor, mask_f: Tensor) -> Tensor:
    return (x * mask_f).sum() / mask_f.sum().clamp_min(1.0)


def _masked_extreme(x: Tensor, m: Tensor, has_tokens: Tensor, nan: Tensor, reduce: Any) -> Tensor:
    if x.numel() == 0:  # a static shape check, not a sync
        return nan
    fill = float("inf") if reduce is torch.amin else float("-inf")
    return torch.where(has_tokens, reduce(torch.where(m, x, fill)), nan)


def _aggregate(per_token: Tensor, mask_f: Tensor, agg: str, layout: _Layout) -> Tensor:
    if agg == "token-mean":
        return _masked_mean(per_token, mask_f)
    seq_total = layout.seq_sum(per_token * mask_f)
    seq_tokens = layout.seq_sum(mask_f)
    if agg == "seq-mean-token-mean":
        seq_total = seq_total / seq_tokens.clamp_min(1.0)
    # Sequences without policy tokens contribute nothing and do not count.
    return seq_total.sum() / (seq_tokens > 0).sum().clamp_min(1)


def aggregate(per_token: Tensor, mask: Any, agg: str = "token-mean", *, offsets: Any = None) -> Tensor:
    """Reduces a per-token loss over the policy tokens, as ``policy_loss`` does.

    ``token-mean``: mean over all policy tokens of the batch. ``seq-mean-token-mean``: mean
    over sequences of each sequence's token mean. ``seq-mean-token-sum``: mean over
    sequences of each sequence's token sum. Sequences without policy tokens are left out.
    """
    _check_choice(agg, AGGREGATIONS, "agg")
    if per_token.dim() not in (1, 2):
        raise InvalidRolloutError(f"expected (B, L) or flat inputs, got shape {tuple(per_token.shape)}")
    m = _bool_mask(mask, per_token)
    layout = _make_layout(m, offsets, per_token.dim() == 2)
    dtype = _compute_dtype(per_token)
    mask_f = layout.mask.to(dtype)
    x = torch.where(layout.mask, per_token.reshape(-1).to(dtype), 0.0)
    return _aggregate(x, mask_f, agg, layout)


# --------------------------------------------------------------------------- losses


@dataclass(frozen=True)
class _Ratio:
    """Per-token importance ratios of one call, flat, with what the loss needs next."""

    rho: Tensor  # ratio used by the surrogate (grad flows to log_prob)
    log_ratio: Tensor  # l = log pi_theta - log pi_old, 0 off-policy
    layout: _Layout
    mask_f: Tensor
    num_turns: Tensor | None
    turn_index: Tensor | None  # bucket 1 + turn id per token (see turn_index_from_mask)


def _check_log_prob(log_prob: Any) -> None:
    if not isinstance(log_prob, Tensor):
        raise InvalidRolloutError(
            f"`log_prob` must be a torch.Tensor (it carries the gradient), got {type(log_prob).__name__}"
        )
    if not log_prob.dtype.is_floating_point:
        raise InvalidRolloutError(f"`log_prob` must be floating point, got {log_prob.dtype}")
    if log_prob.dim() not in (1, 2):
        raise InvalidRolloutError(f"`log_prob` must be padded (B, L) or flat (T,), got shape {tuple(log_prob.shape)}")


def _importance_ratio(
    log_prob: Tensor,
    old_log_prob: Any,
    mask: Any,
    ratio: str,
    turn_ratio: str,
    token_turn: Any,
    offsets: Any,
    log_ratio_clamp: float,
) -> _Ratio:
    _check_log_prob(log_prob)
    _check_choice(ratio, RATIO_MODES, "ratio")
    _check_choice(turn_ratio, TURN_RATIOS, "turn_ratio")
    if not log_ratio_clamp > 0.0:
        raise InvalidOptionError(f"`log_ratio_clamp` must be positive, got {log_ratio_clamp}")
    padded = log_prob.dim() == 2
    if padded and token_turn is not None:
        raise InvalidRolloutError(
            "`token_turn` is for flat 1-D inputs; with padded (B, L) inputs the turns are derived from the mask rows"
        )
    if not padded and ratio == "turn" and token_turn is None:
        raise InvalidRolloutError(
            "flat 1-D inputs with ratio='turn' need `token_turn` "
            "(mpo_rs.segment_turns(mask, offsets).token_turn), or pass padded (B, L) tensors"
        )
    dtype = _compute_dtype(log_prob)
    mask_b = _bool_mask(mask, log_prob)
    layout = _make_layout(mask_b, offsets, padded)
    m = layout.mask
    mask_f = m.to(dtype)
    # Zero every off-policy entry first, so padding garbage (even inf/NaN) never reaches
    # a sum, an exp or a gradient.
    new = log_prob.reshape(-1).to(dtype)
    old = _float(old_log_prob, log_prob, dtype, "old_log_prob").reshape(-1)
    log_ratio = torch.where(m, new - old, 0.0)

    turn_index: Tensor | None = None
    num_turns: Tensor | None = None
    if padded:
        turn_index, num_turns = turn_index_from_mask(mask_b)
    elif token_turn is not None:
        turn_index, num_turns = _flat_turn_index(token_turn, m)

    c = float(log_ratio_clamp)
    if ratio == "token":
        rho = torch.exp(log_ratio.clamp(-c, c))
    else:
        if ratio == "turn":
            assert turn_index is not None  # checked above
            group = _grouped_log_ratio(log_ratio, mask_f, turn_index, m.shape[0] + 1, turn_ratio == "geo_mean", c)
        else:  # GSPO-token: geometric mean over the whole sequence
            with torch.no_grad():
                n_tokens = layout.seq_sum(mask_f).clamp_min(1.0)
                seq_log_ratio = (layout.seq_sum(log_ratio.detach()) / n_tokens).clamp_(-c, c)
                group = layout.seq_broadcast(seq_log_ratio)
        # log rho~ = sg[clamp(log rho_t)] + l - sg[l]: forward the group's ratio, backward
        # this token's own grad log pi (scaled by rho_t). The clamp bounds the forward value
        # only; a one-token group gives exactly the token ratio.
        rho = _SharedRatio.apply(log_ratio, group)
    return _Ratio(rho, log_ratio, layout, mask_f, num_turns, turn_index)


def importance_ratio(
    log_prob: Tensor,
    old_log_prob: Any,
    mask: Any,
    *,
    ratio: str = "turn",
    turn_ratio: str = "product",
    token_turn: Any = None,
    offsets: Any = None,
    log_ratio_clamp: float = 20.0,
) -> Tensor:
    """The per-token ratio that :func:`policy_loss` clips, shaped like ``log_prob``, 1.0 on
    off-policy tokens. In turn mode every token of a turn holds rho_t, and its gradient
    w.r.t. its own log-prob is rho_t. Arguments as in :func:`policy_loss`."""
    r = _importance_ratio(log_prob, old_log_prob, mask, ratio, turn_ratio, token_turn, offsets, log_ratio_clamp)
    return torch.where(r.layout.mask, r.rho, 1.0).reshape(log_prob.shape)


def check_clip_range(
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    names: tuple[str, str, str] = ("clip_low", "clip_high", "dual_clip"),
) -> None:
    """Raises InvalidOptionError unless ``0 <= clip_low < 1``, ``clip_high >= 0`` and ``dual_clip``
    is None or greater than 1; ``names`` are the caller's names of the three settings."""
    low_name, high_name, dual_name = names
    if not 0.0 <= clip_low < 1.0 or not clip_high >= 0.0:
        raise InvalidOptionError(f"need 0 <= {low_name} < 1 and {high_name} >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise InvalidOptionError(f"`{dual_name}` must be greater than 1 (or None), got {dual_clip}")


@dataclass(frozen=True)
class Surrogate:
    """The clipped surrogate of one call, per token (see :func:`clipped_surrogate`)."""

    per_token: Tensor
    """The loss of each token: ``max(unclipped, clipped)``, capped by the dual clip."""
    unclipped: Tensor
    """``-A * r``."""
    clipped: Tensor
    """``-A * clip(r, 1 - clip_low, 1 + clip_high)``."""
    dual_active: Tensor | None
    """Where the dual clip caps the loss (None without ``dual_clip``)."""


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None
) -> Surrogate:
    """PPO's clipped surrogate per token, ``max(-A*r, -A*clip(r, 1-clip_low, 1+clip_high))``;
    with ``dual_clip=c`` the loss of a token with A < 0 is also capped at ``-c*A`` (verl's
    ``compute_policy_loss_vanilla``). ``ratio`` and ``advantages`` are any matching shape;
    nothing is masked or reduced here, and the settings are not checked
    (:func:`check_clip_range`)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_active: Tensor | None = None
    if dual_clip is not None:
        # For A < 0 a huge ratio would give an unbounded loss; cap it at -c*A.
        cap = -advantages * dual_clip
        dual_active = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual_active, cap, per_token)
    return Surrogate(per_token, unclipped, clipped, dual_active)


def policy_loss(
    log_prob: Tensor,
    old_log_prob: Any,
    advantages: Any,
    mask: Any,
    *,
    ratio: str = "turn",
    turn_ratio: str = "product",
    token_turn: Any = None,
    offsets: Any = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate loss with a turn, token or sequence importance ratio.

    Per policy token, ``L = -min(r*A, clip(r, 1-clip_low, 1+clip_high)*A)``; with
    ``dual_clip=c`` (c > 1) the loss of a token with A < 0 is also capped at ``-c*A``.
    ``r`` is exp of the ratio chosen by ``ratio`` (see the module doc), whose forward log
    is clamped to ``[-log_ratio_clamp, log_ratio_clamp]`` before exp. Turn and sequence
    ratios keep each token's own gradient through the clamp (stop-gradient construction);
    the token ratio is clamped like verl's PPO. Losses are reduced with ``agg``.

    Args:
        log_prob: log pi_theta of each sampled token (carries the gradient); ``(B, L)``
            padded, one trajectory per row, or flat ``(T,)``. bf16/fp16 are computed in fp32.
        old_log_prob, advantages, mask: same shape; ``mask`` marks policy tokens (nonzero).
            Off-policy entries are never read (they may hold padding garbage, even inf).
        ratio: ``"turn"`` | ``"token"`` | ``"sequence"``.
        turn_ratio: ``"product"`` | ``"geo_mean"`` (turn mode only).
        token_turn: flat inputs in turn mode: global turn id per token, -1 off-policy, as
            ``mpo_rs.segment_turns(mask, offsets).token_turn`` (numpy or tensor). Host
            arrays are validated; device tensors are trusted (checking would sync).
        offsets: flat inputs only: int64[N+1] trajectory boundaries, needed by
            ``ratio="sequence"`` and the ``seq-mean-*`` aggregations.
        clip_low, clip_high: clip range ``[1-clip_low, 1+clip_high]`` (clip-higher: raise
            ``clip_high``).
        dual_clip: the dual-clip constant c > 1 for negative advantages, or None.
        agg: ``"token-mean"`` | ``"seq-mean-token-mean"`` | ``"seq-mean-token-sum"``.
        log_ratio_clamp: bound on the forward log-ratio before exp.

    Returns:
        ``(loss, metrics)``: a 0-dim loss and detached 0-dim tensors ``clip_frac``
        (``= clip_frac_low + clip_frac_high``, fractions of policy tokens whose clip is
        active), ``dual_clip_frac`` (with ``dual_clip``), ``approx_kl`` (k3 estimator of
        KL(pi_old || pi_theta) per token), ``ratio_mean``/``ratio_min``/``ratio_max`` (of the
        ratio used by the surrogate, over policy tokens; NaN without any), ``num_tokens``
        and, when turns are known (padded inputs, or flat with ``token_turn``), ``num_turns``
        and the turn-ratio statistics :data:`TURN_RATIO_STATISTICS`: for each turn-ratio
        form (``product``: exp of the turn's summed log-ratio; ``geo``: exp of its mean),
        whatever ``ratio`` is, the mean, min and max over the turns (each turn once) of the
        ratio before the clamp and the clip, and ``..._outside_clip``, the share of turns
        whose ratio lies outside ``[1-clip_low, 1+clip_high]``; NaN without turns.
    """
    _check_choice(agg, AGGREGATIONS, "agg")
    check_clip_range(clip_low, clip_high, dual_clip)
    r = _importance_ratio(log_prob, old_log_prob, mask, ratio, turn_ratio, token_turn, offsets, log_ratio_clamp)
    m, mask_f, rho = r.layout.mask, r.mask_f, r.rho
    adv = torch.where(m, _float(advantages, log_prob, rho.dtype, "advantages").reshape(-1), 0.0)

    surrogate = clipped_surrogate(rho, adv, clip_low, clip_high, dual_clip)
    per_token, dual_active = surrogate.per_token, surrogate.dual_active
    loss = _aggregate(per_token, mask_f, agg, r.layout)

    with torch.no_grad():
        dtype = rho.dtype
        rd = rho.detach()
        n_tokens = mask_f.sum()
        has_tokens = n_tokens > 0
        nan = torch.full((), float("nan"), dtype=dtype, device=m.device)
        token_lr = r.log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
        metrics: dict[str, Tensor] = {
            "clip_frac_low": _masked_mean((m & (adv < 0) & (rd < 1.0 - clip_low)).to(dtype), mask_f),
            "clip_frac_high": _masked_mean((m & (adv > 0) & (rd > 1.0 + clip_high)).to(dtype), mask_f),
            # k3 = (p/q - 1) - log(p/q) with p/q = pi_theta/pi_old: unbiased, >= 0.
            "approx_kl": _masked_mean(torch.expm1(token_lr) - token_lr, mask_f),
            "ratio_mean": torch.where(has_tokens, _masked_mean(rd, mask_f), nan),
            "ratio_min": _masked_extreme(rd, m, has_tokens, nan, torch.amin),
            "ratio_max": _masked_extreme(rd, m, has_tokens, nan, torch.amax),
            "num_tokens": n_tokens,
        }
        metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
        if dual_active is not None:
            metrics["dual_clip_frac"] = _masked_mean((dual_active & m).to(dtype), mask_f)
        if r.num_turns is not None:
            metrics["num_turns"] = r.num_turns
        if r.turn_index is not None:
            metrics.update(_turn_ratio_statistics(r.log_ratio, mask_f, r.turn_index, clip_low, clip_high))
    return loss, metrics


TURN_RATIO_STATISTICS = tuple(
    f"turn_ratio_{form}_{stat}" for form in ("product", "geo") for stat in ("mean", "min", "max", "outside_clip")
)
"""The metric names of :func:`policy_loss`'s turn-ratio statistics (when the turns are known)."""


def turn_ratio_statistics(
    log_prob: Tensor,
    old_log_prob: Any,
    mask: Any,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    token_turn: Any = None,
) -> dict[str, Tensor]:
    """The turn-ratio statistics :func:`policy_loss` reports (:data:`TURN_RATIO_STATISTICS`),
    alone, for a loss of your own (verl's ``mpo`` loss mode uses it): per turn, the product
    and geometric-mean ratios before any clamp or clip; their mean, min, max over the turns
    and the share outside ``[1 - clip_low, 1 + clip_high]``. Detached 0-dim tensors, no host
    synchronisation. Padded ``(B, L)`` inputs, or flat ones with ``token_turn``, as in
    :func:`policy_loss`."""
    _check_log_prob(log_prob)
    check_clip_range(clip_low, clip_high, None)
    padded = log_prob.dim() == 2
    if padded and token_turn is not None:
        raise InvalidRolloutError("`token_turn` is for flat 1-D inputs; padded (B, L) rows give the turns")
    if not padded and token_turn is None:
        raise InvalidRolloutError(
            "flat 1-D inputs need `token_turn` (mpo_rs.segment_turns(mask, offsets).token_turn) for the turn ratios"
        )
    dtype = _compute_dtype(log_prob)
    mask_b = _bool_mask(mask, log_prob)
    m = mask_b.reshape(-1)
    with torch.no_grad():
        new = log_prob.detach().reshape(-1).to(dtype)
        old = _float(old_log_prob, log_prob, dtype, "old_log_prob").reshape(-1)
        log_ratio = torch.where(m, new - old, 0.0)
        index, _ = turn_index_from_mask(mask_b) if padded else _flat_turn_index(token_turn, m)
        return _turn_ratio_statistics(log_ratio, m.to(dtype), index, clip_low, clip_high)


def _turn_ratio_statistics(
    log_ratio: Tensor,
    mask_f: Tensor,
    turn_index: Tensor,
    clip_low: float,
    clip_high: float,
    compact: bool | None = None,
) -> dict[str, Tensor]:
    """One ratio per turn, in both forms, before any clamp or clip: the product
    rho_t = exp(sum_i l_{t,i}) and the geometric mean exp(mean_i l_{t,i}). Their mean, min
    and max over the batch's turns (each turn counts once) and the share of turns outside
    ``[1 - clip_low, 1 + clip_high]``; NaN without turns. No host synchronisation: on CPU
    (``compact``, the default there) the turns' buckets are selected first, elsewhere every
    bucket is reduced with a mask."""
    n_buckets = mask_f.shape[0] + 1
    lr = log_ratio.detach()
    sums = lr.new_zeros(n_buckets).index_add_(0, turn_index, lr)
    counts = mask_f.new_zeros(n_buckets).index_add_(0, turn_index, mask_f)
    # Every turn holds a policy token; empty buckets (bucket 0, unused ids) are not turns.
    is_turn = counts > 0
    nan = torch.full((), float("nan"), dtype=lr.dtype, device=lr.device)
    if compact is None:
        compact = lr.device.type == "cpu"
    if compact:
        # No device to synchronise with: keep only the turns' buckets (far fewer than B*L+1).
        sums, counts = sums[is_turn], counts[is_turn]
        weight = None
        n_turns = torch.tensor(float(sums.shape[0]), dtype=lr.dtype)
    else:
        weight = is_turn.to(lr.dtype)
        n_turns = weight.sum()
    has_turns = n_turns > 0
    denominator = n_turns.clamp_min(1.0)
    out: dict[str, Tensor] = {}
    for form, log_rho in (("product", sums), ("geo", sums / counts.clamp_min(1.0))):
        rho = torch.exp(log_rho)
        if weight is None:
            total = rho.sum()
            low = torch.exp(log_rho.amin()) if log_rho.numel() else nan
            high = torch.exp(log_rho.amax()) if log_rho.numel() else nan
        else:
            # Non-turn buckets hold log-ratio 0: out of the sum by the weight, out of the
            # extremes by +-inf.
            total = torch.dot(rho, weight)
            low = torch.exp(torch.where(is_turn, log_rho, float("inf")).amin())
            high = torch.exp(torch.where(is_turn, log_rho, float("-inf")).amax())
        # A non-turn bucket's ratio is exactly 1, inside every clip range: no mask needed.
        outside = ((rho < 1.0 - clip_low) | (rho > 1.0 + clip_high)).sum().to(lr.dtype)
        out[f"turn_ratio_{form}_mean"] = torch.where(has_turns, total / denominator, nan)
        out[f"turn_ratio_{form}_min"] = torch.where(has_turns, low, nan)
        out[f"turn_ratio_{form}_max"] = torch.where(has_turns, high, nan)
        out[f"turn_ratio_{form}_outside_clip"] = torch.where(has_turns, outside / denominator, nan)
    return out


def value_loss(
    values: Tensor,
    old_values: Any,
    returns: Any,
    mask: Any,
    *,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    offsets: Any = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped critic loss ``0.5 * max((V - G)^2, (clip(V, V_old - clip, V_old + clip) - G)^2)``
    over policy tokens, reduced with ``agg`` (``clip=None``: plain ``0.5 * (V - G)^2``).

    Shapes and ``offsets`` as in :func:`policy_loss`. Metrics (detached 0-dim tensors):
    ``clip_frac`` (tokens where the clipped branch is the larger), ``value_mean``,
    ``return_mean``, ``explained_variance`` (1 - Var(G - V) / Var(G), token-weighted; NaN when
    Var(G) <= 1e-8).
    """
    if not isinstance(values, Tensor):
        raise InvalidRolloutError(
            f"`values` must be a torch.Tensor (it carries the gradient), got {type(values).__name__}"
        )
    if not values.dtype.is_floating_point:
        raise InvalidRolloutError(f"`values` must be floating point, got {values.dtype}")
    if values.dim() not in (1, 2):
        raise InvalidRolloutError(f"`values` must be padded (B, L) or flat (T,), got shape {tuple(values.shape)}")
    _check_choice(agg, AGGREGATIONS, "agg")
    if clip is not None and not clip > 0.0:
        raise InvalidOptionError(f"`clip` must be positive (or None), got {clip}")
    dtype = _compute_dtype(values)
    layout = _make_layout(_bool_mask(mask, values), offsets, values.dim() == 2)
    m = layout.mask
    mask_f = m.to(dtype)
    v = values.reshape(-1).to(dtype)
    target = torch.where(m, _float(returns, values, dtype, "returns").reshape(-1), 0.0)
    v = torch.where(m, v, 0.0)
    error = (v - target).square()
    if clip is None:
        per_token = 0.5 * error
        clipped_wins = torch.zeros_like(m)
    else:
        v_old = torch.where(m, _float(old_values, values, dtype, "old_values").reshape(-1), 0.0)
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        clipped_error = (v_clipped - target).square()
        per_token = 0.5 * torch.maximum(error, clipped_error)
        clipped_wins = clipped_error > error
    loss = _aggregate(per_token, mask_f, agg, layout)

    with torch.no_grad():
        vd = v.detach()
        return_mean = _masked_mean(target, mask_f)
        residual = target - vd
        residual_var = _masked_mean((residual - _masked_mean(residual, mask_f)).square(), mask_f)
        return_var = _masked_mean((target - return_mean).square(), mask_f)
        metrics = {
            "clip_frac": _masked_mean((clipped_wins & m).to(dtype), mask_f),
            "value_mean": _masked_mean(vd, mask_f),
            "return_mean": return_mean,
            # Undefined when the returns do not vary: NaN, never 1 - r / 1e-8 (about -1e7).
            "explained_variance": torch.where(
                return_var > 1e-8, 1.0 - residual_var / return_var.clamp_min(1e-8), torch.nan
            ),
        }
    return loss, metrics
