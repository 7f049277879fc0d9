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
Nothing in here reads a device value back to the host: metrics are 0-dim tensors. The
layout of a call's tokens and turns lives in the private ``_layout``, the ratio, its clip
range and the turn-ratio statistics in ``_ratio``; their public names are this module's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..exceptions import InvalidOptionError, InvalidRolloutError
from . import _layout
from ._layout import Layout, as_float, bool_mask, check_choice, compute_dtype, make_layout, turn_index_from_mask
from ._ratio import (
    RATIO_MODES,
    TURN_RATIO_STATISTICS,
    TURN_RATIOS,
    check_clip_range,
    compute_ratio,
    flat_turn_ratio_statistics,
    importance_ratio,
    turn_ratio_statistics,
)

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

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


# --------------------------------------------------------------------------- aggregation


def _masked_mean(x: Tensor, mask_f: Tensor) -> Tensor:
    return (x * mask_f).sum() / mask_f.sum().clamp_min(1.0)


def _masked_extreme(x: Tensor, m: Tensor, has_tokens: Tensor, nan: Tensor, reduce: Any) -> Tensor:
    if x.numel() == 0:  # a static shape check, not a sync
        return nan
    fill = float("inf") if reduce is torch.amin else float("-inf")
    return torch.where(has_tokens, reduce(torch.where(m, x, fill)), nan)


def _aggregate(per_token: Tensor, mask_f: Tensor, agg: str, layout: Layout) -> Tensor:
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
    check_choice(agg, AGGREGATIONS, "agg")
    if per_token.dim() not in (1, 2):
        raise InvalidRolloutError(f"expected (B, L) or flat inputs, got shape {tuple(per_token.shape)}")
    m = bool_mask(mask, per_token)
    layout = make_layout(m, offsets, per_token.dim() == 2)
    dtype = compute_dtype(per_token)
    mask_f = layout.mask.to(dtype)
    x = torch.where(layout.mask, per_token.reshape(-1).to(dtype), 0.0)
    return _aggregate(x, mask_f, agg, layout)


# --------------------------------------------------------------------------- losses


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
    check_choice(agg, AGGREGATIONS, "agg")
    check_clip_range(clip_low, clip_high, dual_clip)
    r = compute_ratio(log_prob, old_log_prob, mask, ratio, turn_ratio, token_turn, offsets, log_ratio_clamp)
    m, mask_f, rho = r.layout.mask, r.mask_f, r.rho
    adv = torch.where(m, as_float(advantages, log_prob, rho.dtype, "advantages").reshape(-1), 0.0)

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
            metrics.update(flat_turn_ratio_statistics(r.log_ratio, mask_f, r.turn_index, clip_low, clip_high))
    return loss, metrics


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
    _layout.check_graded(values, "values")
    check_choice(agg, AGGREGATIONS, "agg")
    if clip is not None and not clip > 0.0:
        raise InvalidOptionError(f"`clip` must be positive (or None), got {clip}")
    dtype = compute_dtype(values)
    layout = make_layout(bool_mask(mask, values), offsets, values.dim() == 2)
    m = layout.mask
    mask_f = m.to(dtype)
    v = values.reshape(-1).to(dtype)
    target = torch.where(m, as_float(returns, values, dtype, "returns").reshape(-1), 0.0)
    v = torch.where(m, v, 0.0)
    error = (v - target).square()
    if clip is None:
        per_token = 0.5 * error
        clipped_wins = torch.zeros_like(m)
    else:
        v_old = torch.where(m, as_float(old_values, values, dtype, "old_values").reshape(-1), 0.0)
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
